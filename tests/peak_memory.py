"""A pytest plugin (loaded by conftest.py): each process's peak resident memory, one line at the end of the run.

Every process of a run reports ``resource.getrusage``'s high-water mark (``ru_maxrss``, which never goes down):
the controller, each pytest-xdist worker, and the largest subprocess each worker waited for (``RUSAGE_CHILDREN``:
the examples, the CUDA simulator's runs). For each worker it also names the test during which its mark last rose,
the test that set its peak. The line reports, it asserts nothing (memory depends on the machine and the versions
installed): the quick run aims at 2 GB per process (README.md, Development)::

    peak RSS (MB): controller 61; gw0 1702 (set by tests/test_x.py::test_y[...]), its subprocesses 412; gw1 ...
"""

from __future__ import annotations

import resource
import sys

import pytest

#: ``ru_maxrss`` is in KiB on Linux, in bytes on macOS.
_UNIT = 1 if sys.platform == "darwin" else 1024


def _peak(who: int) -> int:
    """The high-water mark of resident memory, in bytes (``who``: RUSAGE_SELF or RUSAGE_CHILDREN)."""
    return resource.getrusage(who).ru_maxrss * _UNIT


class _Peaks:
    def __init__(self):
        self.mark = _peak(resource.RUSAGE_SELF)
        self.set_by = "(before the first test)"
        self.workers: dict[str, dict] = {}

    def rose(self, nodeid: str):
        mark = _peak(resource.RUSAGE_SELF)
        if mark > self.mark:
            self.mark, self.set_by = mark, nodeid

    def mine(self) -> dict:
        return {"self": _peak(resource.RUSAGE_SELF), "set_by": self.set_by,
                "children": _peak(resource.RUSAGE_CHILDREN)}


_PEAKS = _Peaks()


@pytest.hookimpl(trylast=True)
def pytest_runtest_logfinish(nodeid, location):
    _PEAKS.rose(nodeid)


def pytest_sessionfinish(session):
    output = getattr(session.config, "workeroutput", None)  # on a pytest-xdist worker: sent to the controller
    if output is not None:
        output["gae_xp_peak_rss"] = _PEAKS.mine()


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node, error):
    report = getattr(node, "workeroutput", {}).get("gae_xp_peak_rss")
    if report is not None:
        _PEAKS.workers[node.gateway.id] = report


def _mb(size: int) -> str:
    return f"{size / 1e6:.0f}"


def format_peaks(controller: dict, workers: dict[str, dict]) -> str:
    """The report line: the controller's peak (and the test that set it when no worker ran the tests), each
    worker's with the test that set it, and each process's largest waited-for subprocess."""
    def one(name, report, named=True):
        text = f"{name} {_mb(report['self'])}" + (f" (set by {report['set_by']})" if named else "")
        return text + (f", its subprocesses {_mb(report['children'])}" if report["children"] else "")
    parts = [one("controller", controller, named=not workers)] + [one(name, workers[name]) for name in sorted(workers)]
    return "peak RSS (MB): " + "; ".join(parts)


def pytest_terminal_summary(terminalreporter):
    if getattr(terminalreporter.config, "workeroutput", None) is None:
        terminalreporter.write_line(format_peaks(_PEAKS.mine(), _PEAKS.workers))
