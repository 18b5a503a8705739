"""The numba CPU kernels' plan: what a repeated ``gae()`` call of one layout needs from the checks, worked out once.

A ``NumbaPlan`` is made (``make``, named by ``backends.PLAN_MODULES``) from a call that went
through every check of ``gae_xp._prepare`` and was solved by these kernels;
``gae_xp._plans`` serves later calls of the same key with it (see there for
what the key holds). It keeps the call's layout (time axis, rows, the output
shape), the kernel driver chosen (constant or general), the whole-row offsets
and the single span, the zero bootstrap value when none is given, and the
dtype: a call then lays out its arrays (a moved axis, the rows: views), makes
its two outputs and runs the kernel, exactly as ``NumbaCPUBackend.gae`` would
on the prepared problem. What reads the data stays: an array coefficient goes
through ``_prepare.coefficient`` (its range check), a bootstrap value through
``_prepare.boundary``, and the kernels' own checks run as on every call.

Made only for the plain case: no packed sequences, no carry, no estimator's
extra arrays, and float arrays already in the compute dtype (which is the
output dtype); other calls keep the full path (``gae_xp._plans.ChosenBackendPlan``).
"""

from __future__ import annotations

import math

import numpy as np

from gae_xp import _prepare
from gae_xp._compat import is_torch_array, torch_cpu_view

from . import numba_cpu
from ._sharing import share

#: The arguments of ``gae()`` that are per-step float arrays: the plan needs them in the compute dtype already.
_FLOATS = ("rewards", "values", "next_values")


def make(call, arguments: dict):
    """The plan of a checked call solved by the numba backend (``arguments``: ``gae()``'s own), or None when the
    call is not the plain case."""
    p = call.problem
    if p.offsets is not None or p.carry is not None or p.extra or p.values is None:
        return None
    dtype = p.rewards.dtype
    if call.out_dtype != dtype or any(arguments[name] is not None and arguments[name].dtype != dtype
                                      for name in _FLOATS):
        return None
    if is_torch_array(p.rewards) and any(arguments[name] is not None and arguments[name].is_neg() for name in _FLOATS):
        return None  # kept negated lazily: no NumPy view (the key then has none for it to serve a call with)
    return NumbaPlan(call, numba_cpu._driver(p))


class NumbaPlan:
    """One layout's call on the numba kernels; ``plan(**arguments)`` is ``gae()`` on arguments of that key."""

    def __init__(self, call, kernel):
        p = call.problem
        self.kernel = kernel
        self.xp = p.xp
        self.torch = is_torch_array(p.rewards)
        self.axis = call.axis
        self.shape = tuple(p.rewards.shape)  # time last
        self.caller_shape = self.shape[:self.axis] + self.shape[-1:] + self.shape[self.axis:-1]
        self.moved = self.axis != len(self.shape) - 1
        self.rows_shape = (math.prod(self.shape[:-1]), self.shape[-1])
        self.flat = len(self.shape) != 2
        self.step_dtype = p.rewards.dtype
        self.dtype = numba_cpu._host(p.rewards).dtype
        self.fill_masked = p.fill_masked
        self.offsets = numba_cpu._whole_row(self.shape[-1])
        self.whole_rows = np.array([0, 1], dtype=np.int64)
        self.zero_bootstrap = numba_cpu.frozen(np.zeros((self.rows_shape[0], 1), dtype=np.float64))
        #: an absent ``terminated`` or ``truncated``, as ``numba_cpu._steps`` lays it out for the kernel
        self.no_flags = numba_cpu.absent_flag(kernel, self.shape[-1])
        self.size = math.prod(self.shape)
        #: a call too small to share between threads, whatever the thread count (``numba_cpu._threads_for``)
        self.small = self.size < numba_cpu.PARALLEL_FROM or self.rows_shape[0] < 2
        #: NumPy arrays of two dimensions, time last: the caller's arrays are the kernels', and so are the results
        self.direct = not (self.torch or self.moved or self.flat)
        #: torch tensors of two dimensions, time last: the kernels' results are the caller's through ``from_numpy``
        self.on_host = self.torch and not (self.moved or self.flat)
        if self.torch:
            import torch

            self.from_numpy = torch.from_numpy

    def __call__(self, rewards, values, gamma, lam, bootstrap_value, next_values, terminated, truncated, mask,
                 critic_lam, views=None):
        """``gae()``'s results for arguments of this plan's key (the layout-only ones are the key's); ``views``:
        the key's NumPy views of torch's per-step tensors (``gae_xp._plans.gae_key``)."""
        like = rewards
        if views is not None:
            rewards, values, next_values, terminated, truncated, mask = views
        if self.direct or (self.on_host and views is not None):
            rows = _same
        else:
            rows = self._rows
            rewards, values = rows(rewards), rows(values)
        steps = (None if next_values is None else rows(next_values),
                 self.no_flags if terminated is None else rows(terminated),
                 self.no_flags if truncated is None else rows(truncated), None if mask is None else rows(mask),
                 gamma if type(gamma) is float else self._coefficient("gamma", gamma),
                 lam if type(lam) is float else self._coefficient("lam", lam),
                 critic_lam if critic_lam is None or type(critic_lam) is float
                 else self._coefficient("critic_lam", critic_lam))
        bounds = (self.zero_bootstrap if bootstrap_value is None else self._bootstrap(bootstrap_value, like), None,
                  self.offsets)
        advantages = np.empty(self.rows_shape, dtype=self.dtype)
        returns = np.empty(self.rows_shape, dtype=self.dtype)
        n_rows = self.rows_shape[0]
        threads = 1 if self.small else numba_cpu._threads_for(self.size, n_rows)
        if threads == 1:
            self.kernel(rewards, values, steps, bounds, self.fill_masked, advantages, returns, self.whole_rows, 0,
                        n_rows)
        else:
            spans = numba_cpu._spans(n_rows, self.offsets, threads)
            share(self.kernel, (rewards, values, steps, bounds, self.fill_masked, advantages, returns, spans),
                  n_rows * (spans.shape[0] - 1), threads)
        if self.direct:
            return advantages, returns
        if self.on_host:
            return self.from_numpy(advantages), self.from_numpy(returns)
        return self._result(advantages), self._result(returns)

    def _rows(self, a):
        """The caller's per-step array as the kernels' (rows, T) host array (a view where it can be one)."""
        host = a if type(a) is np.ndarray else torch_cpu_view(a)  # a torch tensor's view, or the tensor
        if self.moved:
            host = np.moveaxis(host, self.axis, -1)
        return host.reshape(self.rows_shape) if self.flat else host

    def _coefficient(self, name, value):
        """A coefficient as the kernels take it: a float (its range was checked with the key), or an array checked
        and laid out by ``_prepare.coefficient`` on every call (its values are data)."""
        if type(value) is int:
            return float(value)
        laid_out = numba_cpu._host(_prepare.coefficient(self.xp, name, value, self.caller_shape, self.step_dtype,
                                                        self.axis, bounds=(0.0, 1.0)))
        if laid_out.shape != self.shape:
            laid_out = np.broadcast_to(laid_out, self.shape)
        return numba_cpu.frozen(laid_out.reshape(self.rows_shape) if self.flat else laid_out)

    def _bootstrap(self, value, rewards):
        """The bootstrap value as the kernels' (rows, 1) float64, made by ``_prepare.boundary`` as in the full path."""
        made = _prepare.boundary(self.xp, "bootstrap_value", value, self.shape[:-1], self.step_dtype, rewards)
        return numba_cpu.frozen(np.ascontiguousarray(numba_cpu._rows(numba_cpu._host(made)), dtype=np.float64))

    def _result(self, rows):
        """A (rows, T) result in the caller's shape, time on the caller's axis, as the caller's kind of array."""
        result = rows.reshape(self.shape) if self.flat else rows
        if self.moved:
            result = np.moveaxis(result, -1, self.axis)
        return self.from_numpy(result) if self.torch else result


def _same(a):
    return a
