"""gae_xp: fast, exact Generalized Advantage Estimation on any array library.

One chunked prefix scan, written against the Python array API standard, runs
on NumPy, PyTorch, CuPy, JAX and Dask arrays and returns the caller's kind of
array on the caller's device. ``import gae_xp`` imports numpy and array-api-compat
only; a framework or a kernel compiler is imported when its arrays arrive.
"""

import os as _os

# The backends live in the clone's top-level backends/ folder; the wheel installs them as gae_xp.backends, and
# the source tree reaches them through the symlink gae_xp/backends -> ../backends. A checkout made without
# symlinks (git's core.symlinks=false, as on Windows by default) holds a small text file there instead: the
# package then also looks in the clone's root for its subpackage "backends".
if not _os.path.isdir(_os.path.join(_os.path.dirname(__file__), "backends")):
    __path__.append(_os.path.dirname(_os.path.dirname(_os.path.abspath(__file__))))

from ._config import show_config
from ._version import __version__
from .backends._fallback import RouteUnavailableError, RouteUnavailableWarning
from .estimators import discounted_cumsum, discounted_returns, gae, lambda_returns, vtrace, warm_up, whiten
from .groups import group_advantages, to_tokens, zero_variance_groups
from .lambdas import length_adaptive_lambda, relative_position_lambda
from .reinforce import reinforce_plus_plus, reinforce_plus_plus_baseline
from .turns import turn_counts, turn_gae

__all__ = ["gae", "discounted_cumsum", "discounted_returns", "lambda_returns", "vtrace", "whiten", "turn_gae",
           "turn_counts", "length_adaptive_lambda", "relative_position_lambda", "group_advantages",
           "zero_variance_groups", "to_tokens", "reinforce_plus_plus", "reinforce_plus_plus_baseline", "warm_up",
           "show_config", "RouteUnavailableError", "RouteUnavailableWarning", "__version__"]
