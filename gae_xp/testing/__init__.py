"""Testing utilities for code built on gae_xp: the array libraries, random cases, and one comparison.

The same registry, case builder and comparison serve gae_xp's own tests,
``gae-xp bench`` and asv, so a library or a target added here is tested and
benchmarked alike. ``import gae_xp`` does not import this module, and it
imports no array library until one is asked for.

* ``libraries``: the registry of array libraries (``numpy``,
  ``array_api_strict``, ``torch:cpu``, ``torch:cuda``, ``cupy``, ``jax:cpu``,
  ``jax:cuda``) and of ``library/backend`` targets (``numpy/numba``,
  ``torch:cuda/numba-cuda``, ...): ``load``, ``unavailable``,
  ``target_unavailable``, ``to_numpy``;
* ``make_case``: random ``gae()`` arguments as NumPy float64 arrays (dones,
  holes, padding, per-step gamma, per-row lam, bootstrap, next values);
  ``option_grid``: every option alone and together, as ``make_case`` options;
* ``xp_assert_close``: a result against a float64 oracle (namespace, dtype,
  shape, device, non-finite pattern, tolerance by dtype).

Examples
--------
>>> import numpy as np
>>> import gae_xp
>>> from gae_xp import reference, testing
>>> case = testing.make_case(np.random.default_rng(0), (4, 100), dones=0.05, holes=0.2)
>>> numpy = testing.libraries.load("numpy")
>>> advantages, _ = gae_xp.gae(**case)
>>> testing.xp_assert_close(advantages, reference.gae_loop(**case)[0], like=numpy.asarray(case["rewards"]))
"""

from . import libraries
from .assertions import tolerance, xp_assert_close
from .cases import make_case, option_grid
from .libraries import TARGETS, Library, load, target_unavailable, to_numpy, unavailable

__all__ = ["libraries", "Library", "TARGETS", "load", "unavailable", "target_unavailable", "to_numpy", "make_case",
           "option_grid", "xp_assert_close", "tolerance"]
