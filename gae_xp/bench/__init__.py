"""``gae-xp bench``: is GAE my bottleneck, and what should I set?

Times gae_xp's paths against the serial loop and the other baselines on every
installed array library, side by side in one process, and prints what is
measured, a table with its legend, a verdict per library, and optionally a
JSON file and a plot. The pieces are shared: ``libraries`` (the registry of
array libraries and targets, also the tests' and asv's), ``cases`` (random
problems), ``paths`` (the calls timed, also asv's), ``runner`` (the one
timing harness, also ``gae-xp adapters``' and the GPU benchmark's),
``report`` (the header, the table, the verdict rules).
"""
