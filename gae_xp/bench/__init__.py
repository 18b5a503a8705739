"""``python -m gae_xp bench``: is GAE my bottleneck, and what chunk size should I use?

Times gae_xp's paths against the serial loop and the other baselines on every
installed array library, side by side in one process, and prints a table, a
verdict per library, and optionally a JSON file and a plot. The same pieces
(``libraries``, ``paths``) serve the asv benchmarks in ``asv_bench/``.
"""
