"""Screenshot one graph of a published asv site with headless Chromium (docs/asv.png).

    python asv_bench/screenshot.py SITE OUT.png [BENCHMARK]

SITE is a published asv site that needs no CDN (``offline_html.py``'s
output); it is served on a free local port for the time of the shot. The
graph shown is BENCHMARK (default: ``bench_gae.TrackCopyFloor.track_x_copy_floor``,
gae() as a multiple of the copy floor), with the CPU targets and both cases
selected, on a log scale. Needs ``chromium`` (Debian: ``apt-get install chromium``).
"""

from __future__ import annotations

import functools
import http.server
import shutil
import subprocess
import sys
import threading
import urllib.parse

CPU_TARGETS = ("numpy/xp", "numpy/numba", "torch:cpu/xp", "torch:cpu/numba", "jax:cpu/xp", "jax:cpu/jax")
DEFAULT = "bench_gae.TrackCopyFloor.track_x_copy_floor"


def graph_url(port: int, benchmark: str) -> str:
    """The address of asv's graph page for ``benchmark``: the CPU targets and both cases, on a log scale."""
    selection = [("p-target", f"'{target}'") for target in CPU_TARGETS]
    selection += [("p-case", "'constant'"), ("p-case", "'dones+mask'"), ("y-axis-scale", "log")]
    return f"http://127.0.0.1:{port}/index.html#{benchmark}?{urllib.parse.urlencode(selection)}"


def main(site: str, out: str, benchmark: str = DEFAULT) -> int:
    browser = shutil.which("chromium") or shutil.which("chromium-browser")
    if browser is None:
        print("no chromium on PATH (Debian: apt-get install chromium)", file=sys.stderr)
        return 1
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=site)
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        done = subprocess.run([browser, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
                               "--window-size=1400,900", "--virtual-time-budget=15000", f"--screenshot={out}",
                               graph_url(server.server_address[1], benchmark)],
                              capture_output=True, text=True, timeout=180)
    finally:
        server.shutdown()
    if done.returncode != 0:
        print(done.stderr, file=sys.stderr)
        return done.returncode
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:]))
