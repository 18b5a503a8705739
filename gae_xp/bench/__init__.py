"""``gae-xp bench``: is GAE my bottleneck, and what should I set?

Times gae_xp's paths against the serial loop and the other baselines on every
installed array library, side by side in one process, next to a copy of the
same bytes (the memory roofline), and prints what is measured, a table with
its legend, a verdict per library, the first call of a fresh process, and
optionally a JSON file and a plot. The pieces: ``cli`` (the options, checked
before anything runs), ``paths`` (the calls timed and the copy floor, also
asv's), ``runner`` (the one timing harness, also ``gae-xp adapters``' and the
GPU benchmark's; busy neighbours, first calls, profiles), ``report`` (the
header, the table, the verdict rules), ``noise`` (when a comparison can be
trusted: the spreads and the machine's load average), ``adapters`` (``gae-xp
adapters``, one row per framework function). The registry of array libraries and
the case builder are ``gae_xp.testing``'s, shared with the tests and asv.
"""
