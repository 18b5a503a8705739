"""When a comparison of two timings can be trusted: the spread of their samples and the machine's load.

Two medians within the spread of both (the sum of their half interquartile
ranges) are a tie. A tie is "no measurable difference" only when both spreads
are narrow (at most ``NOISY_SPREAD`` of their medians) and the machine was not
busy: otherwise the measurement was too noisy to tell, and the words say so,
with the spreads, the load average and what to do (``--repeat``, a quieter
moment). A difference beyond the spread is still reported, marked rough when
a spread is wide; a busy machine is said once, at the top of the verdict.

The machine is *busy* when the 1-minute load average (``os.getloadavg``, the
highest seen around the timed runs) exceeds the cores the bench may use: more
threads wanted to run than there were cores, so some samples waited for one.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

#: A spread above this share of its median is too wide to call two times alike.
NOISY_SPREAD = 0.2
#: The fewest samples a rerun of a noisy measurement should take (``--repeat``).
MIN_REPEAT_ADVICE = 15


def load_average() -> float | None:
    """The 1-minute load average, or None where the platform does not tell (Windows)."""
    try:
        return os.getloadavg()[0]
    except (AttributeError, OSError):
        return None


def usable_cores() -> int | None:
    """The cores this process may run on (its affinity where the platform tells, else every core)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:
        return os.cpu_count()


@dataclass(frozen=True)
class Conditions:
    """The machine while the samples were taken (unknown by default: then only the spreads count)."""

    #: the highest 1-minute load average seen around the timed runs
    load_average: float | None = None
    #: the cores the bench may use (its affinity)
    cores: int | None = None
    #: busy processes the bench itself started (``--load``)
    neighbours: int = 0

    @property
    def busy(self) -> bool:
        return self.load_average is not None and bool(self.cores) and self.load_average > self.cores

    def words(self) -> str:
        """``load average 5.2 on 2 usable cores`` (with ``--load``'s own processes named)."""
        if self.load_average is None:
            return "load average unknown"
        started = f", {self.neighbours} of them started by --load" if self.neighbours else ""
        return f"load average {self.load_average:.2g} on {self.cores} usable cores{started}"


def share(m) -> float:
    """A measurement's spread as a share of its median."""
    return m.spread_s / m.median_s if m.median_s > 0 else 0.0


def wide_spreads(a, b) -> str | None:
    """``spreads ±69% and ±7%`` where either spread is past ``NOISY_SPREAD``, else None."""
    if max(share(a), share(b)) <= NOISY_SPREAD:
        return None
    return f"spreads ±{100 * share(a):.0f}% and ±{100 * share(b):.0f}%"


def noise(a, b, conditions: Conditions | None = None) -> str | None:
    """Why comparing ``a`` with ``b`` is unreliable, in words (wide spreads, a busy machine), or None."""
    reasons = [] if wide_spreads(a, b) is None else [wide_spreads(a, b)]
    if conditions is not None and conditions.busy:
        reasons.append(f"busy machine, {conditions.words()}")
    return "; ".join(reasons) or None


def rerun_advice(*measured) -> str:
    """``rerun with --repeat 15 or at a quieter moment``: more samples than were taken, at least 15."""
    taken = max((m.runs for m in measured), default=1)
    return f"rerun with --repeat {max(MIN_REPEAT_ADVICE, 3 * taken)} or at a quieter moment"


def tie(a, b, conditions: Conditions | None = None) -> tuple[str, str]:
    """Two medians within the spread of both, in words: (the verdict, why and what to do, or "").

    ``("no measurable difference", "")`` on narrow spreads and a machine that
    was not busy, else ``("too noisy to tell", "spreads ±69% and ±52%; rerun
    with --repeat 15 or at a quieter moment")``.
    """
    why = noise(a, b, conditions)
    if why is None:
        return "no measurable difference", ""
    return "too noisy to tell", f"{why}; {rerun_advice(a, b)}"


def rough(a, b) -> str:
    """``, rough: spreads ±69% and ±7%`` after a difference beyond the spread of wide samples, else nothing.

    A busy machine is said once, at the top of the verdict (:func:`summary`).
    """
    spreads = wide_spreads(a, b)
    return f", rough: {spreads}" if spreads else ""


def summary(measured, conditions: Conditions | None = None) -> str | None:
    """One line for the top of a verdict when the run was noisy (a busy machine, or a spread past the limit)."""
    measured = list(measured)
    wide = [m for m in measured if share(m) > NOISY_SPREAD]
    busy = conditions is not None and conditions.busy
    if not wide and not busy:
        return None
    parts = []
    if busy:
        parts.append(f"the machine was busy: {conditions.words()} (the highest 1-minute figure seen during the run)")
    if wide:
        worst = max(wide, key=share)
        parts.append(f"{len(wide)} of {len(measured)} rows have a spread above ±{100 * NOISY_SPREAD:.0f}% (widest "
                     f"±{100 * share(worst):.0f}%: {worst.library} {worst.path} T={worst.T})")
    return ("noisy measurements: " + "; ".join(parts) + ". Times within the spread of both are reported as too noisy "
            f"to tell, ratios beyond it as rough; {rerun_advice(*measured)}")
