r"""The public estimators: GAE, the scan itself, and the returns and corrections built on it.

Every function checks its arguments in ``gae_xp._prepare``, hands the laid-out
problem to a backend (``gae_xp.backends``) or to the recurrences of
``gae_xp._recurrences`` on that backend's scan, and gives back arrays of the
caller's library, on the caller's device, with the caller's time axis. Time
is ``axis``; a masked step is skipped (coefficient 1, input 0) and gets
output 0; ``done_t = terminated_t or truncated_t`` cuts the trace exactly.
"""

from __future__ import annotations

import itertools
from typing import Any, NamedTuple, Sequence, Union

import numpy as np

from . import _plans, backends
from . import _prepare as prepare_
from ._compat import device_of, divide, ieee_overflow_allowed
from ._recurrences import (
    Picker,
    Segments,
    done_flags,
    last_real_step,
    next_real_values,
    owned_rewards,
    step_coefficients,
)
from ._scan import neighbour

#: An array of any array-API library (NumPy, PyTorch, CuPy, JAX, Dask, ...).
Array = Any
#: A coefficient: a Python or NumPy number, or an array broadcastable to the inputs.
Coefficient = Union[float, Array]

__all__ = ["gae", "warm_up", "discounted_cumsum", "discounted_returns", "lambda_returns", "vtrace", "whiten"]


def gae(rewards: Array, values: Array, *, gamma: Coefficient = 0.99, lam: Coefficient = 0.95,
        bootstrap_value: Coefficient | None = None, next_values: Array | None = None, terminated: Array | None = None,
        truncated: Array | None = None, mask: Array | None = None, axis: int = -1, chunk_size: int | None = None,
        backend: str = "auto", fill_masked: bool = False, cu_seqlens: Array | Sequence[int] | None = None,
        critic_lam: Coefficient | None = None, truncated_bootstrap: str = "next_values") -> tuple[Array, Array]:
    r"""Generalized Advantage Estimation: ``(advantages, returns)``.

    Time is ``axis``; every other axis is batch. With ``done_t = terminated_t or truncated_t``::

        Vnext_t = next_values[t]            if next_values is given,
                  V at the next real step   else (skipping masked steps),
                  bootstrap_value           after the last real step (default 0)
        delta_t = r_t + gamma_t (1 - terminated_t) Vnext_t - V_t
        A_t     = delta_t + gamma_t lam_t (1 - done_t) A_{t+1},     A_T = 0
        returns = A + V         (with critic_lam: A' + V, A' the same recurrence with critic_lam)

    A done step, or a step whose gamma_t lam_t is 0, cuts the trace exactly:
    nothing behind it, NaN and inf included, reaches the steps before it.
    Without terminated, truncated, mask and next_values, and with scalar
    gamma and lam, this is the serial loop that slime, verl and CleanRL write.

    Parameters
    ----------
    rewards, values : array
        Arrays of one shape, of any array-API library (NumPy, PyTorch, CuPy,
        JAX, Dask), on one device.
    gamma, lam : float or array, default 0.99 and 0.95
        Numbers in [0, 1], or arrays broadcastable to ``rewards`` (per-step or
        per-row discounts), checked wherever their values can be read (traced
        values under ``jax.jit``/``torch.compile`` are not checked).
    bootstrap_value : float or array, optional
        The value after the last step, a number or an array of the batch shape
        (``rewards.shape`` without ``axis``); default 0. With ``cu_seqlens``,
        one value per sequence (the batch shape plus a trailing axis of n).
    next_values : array, optional
        V(s_{t+1}) per step, e.g. the value of the final observation at a
        truncation; replaces the shifted ``values`` and ``bootstrap_value``
        (pass one of the two).
    terminated : bool array, optional
        The episode ended at t: no bootstrap from Vnext_t, and the trace is cut.
    truncated : bool array, optional
        The episode was cut at t: the trace is cut but Vnext_t is still
        bootstrapped, from ``next_values``, which must then be given (at a
        truncated step, the value of the episode's final observation): the
        value at the next step is the next episode's first. Without
        ``next_values`` this is a ValueError unless ``truncated_bootstrap``
        says ``"next_step"``.
    mask : bool array, optional
        True for a real step. Masked steps are absent: their rewards, values
        and flags are ignored (NaN, inf or any finite value there is
        harmless), no discount is applied across them, and their outputs are 0.
    axis : int, default -1
        The time axis.
    chunk_size : int, optional
        Chunk length C of the generic scan; None picks it by the rule in
        ``gae_xp._scan.choose_chunk_size``. A constant discount's kernel is at
        most 32 wide (a larger C is reduced to 32: a wider one rounds more
        than the serial loop does), so every C keeps float32 results within
        the serial loop's own error. The kernels (numba, numba-cuda,
        lax.scan) ignore it.
    backend : str, default "auto"
        "auto" (the fastest installed path for these arrays) or a name from
        ``gae_xp.backends.names()``: "xp" (the generic scan), "numba",
        "triton" (torch CUDA tensors, CuPy arrays), "numba-cuda", "jax", "dask". A forced
        backend that cannot serve the arrays raises ValueError.
    fill_masked : bool, default False
        What a masked step gets: 0 in both outputs, or (True, verl's
        convention) the advantage of the next real step (0 after the last
        one), and returns = that + its own value.
    cu_seqlens : array or sequence of int, optional
        Packed sequences (the "THD" layout): offsets ``0 = o_0 <= o_1 <= ...
        <= o_n = T`` shared by every row; sequence i is ``[o_i, o_{i+1})`` of
        the time axis and is solved as a row of its own (its end cuts the
        trace; after its last real step comes ``bootstrap_value[..., i]``). An
        integer array of the inputs' library, or host offsets (a list, a tuple
        or a NumPy array, as flash-attention's ``cu_seqlens_cpu``), which are
        never read from a device. Device offsets are read once for the checks
        (one small device-to-host copy). A repeated offset is an empty
        sequence: no output, its bootstrap value unread. ``[0]`` is no
        sequence at all (T = 0; ``bootstrap_value[..., :0]``).
    critic_lam : float or array, optional
        Decoupled GAE (VAPO): the returns (value targets) use ``critic_lam``
        while the advantages use ``lam``, from the same deltas and cuts; e.g.
        ``lam=0.95, critic_lam=1.0``. None: the returns use ``lam``.
    truncated_bootstrap : {"next_values", "next_step"}, default "next_values"
        Where a truncated step's V(s_{t+1}) comes from. "next_values": from
        ``next_values``, required with ``truncated``. "next_step": an explicit
        opt-in to the value at the next real step, or ``bootstrap_value``
        after the last one (right only where no further episode follows a
        truncation in the row, e.g. truncations at the row's or sequence's
        end); ``next_values`` is then not allowed.

    Returns
    -------
    advantages, returns : array
        In the inputs' namespace, on their device, with their floating dtype
        (float16/bfloat16, NumPy's from ml_dtypes too, are computed in
        float32, wider floats in float64; NumPy's non-native byte order,
        ``'>f8'``, in and as native float64, as NumPy's arithmetic;
        integer rewards give the namespace's default float), time on ``axis``.
        Inputs are never modified and no output shares memory with an input.

    Raises
    ------
    TypeError
        An argument of the wrong kind (not an array, a non-bool flag, arrays
        of two libraries), naming it.
    ValueError
        Shapes that do not match, gamma or lam outside [0, 1], a bad axis,
        chunk size, backend or ``cu_seqlens``, naming the argument.

    Notes
    -----
    The first call in a process of each kind (dtype, options) compiles or
    loads its kernel: numba's compiled code is cached on disk, so later
    processes load it (tenths of a second) instead of compiling it (seconds).

    Gradients (PyTorch): tensors that require grad get them through the
    custom operator ``torch.ops.gae_xp.gae``: on the CPU the numba kernels,
    on CUDA the Triton kernels (numba-CUDA's where triton does not import).
    The backward is
    the adjoint scan, the same coefficients run forward in time and cut at
    the same places, with gradients to ``rewards``, ``values``,
    ``next_values`` and ``bootstrap_value`` (second derivatives exact). A call
    whose per-step ``gamma``, ``lam`` or ``critic_lam`` requires grad takes
    the generic path (``backend="xp"``), whose autograd differentiates them
    too; so do ``torch.func`` transforms. Under ``torch.compile`` (fullgraph,
    static or dynamic shapes) the call is one graph node, the operator, and
    its backward another. JAX differentiates the lax.scan and generic routes
    itself (``jax.grad``).

    Examples
    --------
    >>> import numpy as np
    >>> import gae_xp
    >>> rewards = np.array([[0.0, 0.0, 1.0]])
    >>> values = np.array([[0.5, 0.5, 0.5]])
    >>> advantages, returns = gae_xp.gae(rewards, values, gamma=1.0, lam=1.0)
    >>> advantages
    array([[0.5, 0.5, 0.5]])
    >>> returns
    array([[1., 1., 1.]])

    A done step cuts the trace (nothing after step 1 reaches it), and a
    masked step is skipped:

    >>> terminated = np.array([[False, True, False]])
    >>> gae_xp.gae(rewards, values, gamma=1.0, lam=1.0, terminated=terminated)[0]
    array([[-0.5, -0.5,  0.5]])
    >>> mask = np.array([[True, False, True]])
    >>> gae_xp.gae(rewards, values, gamma=1.0, lam=1.0, mask=mask)[0]
    array([[0.5, 0. , 0.5]])

    Decoupled lambda: advantages at lam, value targets at critic_lam:

    >>> advantages, returns = gae_xp.gae(rewards, values, gamma=1.0, lam=0.0, critic_lam=1.0)
    >>> advantages, returns
    (array([[0. , 0. , 0.5]]), array([[1., 1., 1.]]))
    """
    key, views = _plans.gae_key(rewards, values, gamma, lam, bootstrap_value, next_values, terminated, truncated,
                                mask, axis, chunk_size, backend, fill_masked, cu_seqlens, critic_lam,
                                truncated_bootstrap)
    if key is not None:
        plan = _plans.PLANS.get(key)
        if plan is not None:  # a call of this layout passed every check before: only the data's checks run
            try:
                return plan(rewards, values, gamma, lam, bootstrap_value, next_values, terminated, truncated, mask,
                            critic_lam, views)
            except Exception as error:
                if not backends.is_compiler_failure(error):
                    raise
                _plans.PLANS.discard(key)  # a kernel of a new specialisation failed: the full path falls back
    call = prepare_.prepare(rewards, values, gamma=gamma, lam=lam, bootstrap_value=bootstrap_value,
                            next_values=next_values, terminated=terminated, truncated=truncated, mask=mask,
                            axis=axis, chunk_size=chunk_size, backend=backend, fill_masked=fill_masked,
                            cu_seqlens=cu_seqlens, critic_lam=critic_lam, truncated_bootstrap=truncated_bootstrap)
    (advantages, returns), solver = backends.run(
        call, lambda backend: backends.solve_gae(call.problem, backend, call.chunk_size))
    if key is not None:
        _plans.PLANS.put(key, _plans.make_plan(call, solver, {
            "rewards": rewards, "values": values, "next_values": next_values, "terminated": terminated,
            "truncated": truncated, "mask": mask, "gamma": gamma, "lam": lam, "critic_lam": critic_lam,
            "bootstrap_value": bootstrap_value, "truncated_bootstrap": truncated_bootstrap},
            own_plan=backends.plan_maker(solver)))
    return call.restore(advantages), call.restore(returns)


def warm_up(dtypes: str | Sequence[str] = ("float32",), cases: str | Sequence[str] = ("constant", "dones+mask"),
            layouts: str | Sequence[str] = ("time-last", "time-first", "bootstrap column"), *,
            device: Any = None) -> None:
    """Compile, or load from numba's disk cache, the numba CPU kernels for these dtypes and cases; with
    ``device``, the kernels that ``gae()`` takes on torch tensors of that CUDA device.

    Each combination of options (whether ``mask`` and ``next_values`` are
    given, any per-step array at all, float or array coefficients) and dtype
    runs a kernel of its own (``terminated`` and ``truncated``, given or not,
    share one), and rows shorter than the kernels' window (1,024 steps) one
    of their own that only walks, compiled on its first call in a process
    when numba's cache does not hold it yet (seconds per kernel on a cold
    cache, tenths of a second to load a cached one). A trainer that calls
    ``warm_up`` at start-up, before its first rollout, pays that there
    instead of in its first step. NumPy arrays and torch CPU tensors share
    the kernels. Without numba installed it does nothing; with a numba that
    cannot import or compile it warns once (``RouteUnavailableWarning``)
    and returns, and ``gae()`` takes the generic path.

    On a CUDA device (``device="cuda"``, ``"cuda:1"``, a ``torch.device``)
    the Triton route compiles a kernel per class of row length (its launch
    heuristic's block, warps and stages), per alignment of the rows (T a
    multiple of 16 bytes of the floats, or not), per structure (one program a
    row, or few long rows cut into chunks) and per combination of options and
    dtype: a first call at a new T that falls in a class not met yet in the
    process compiles (a quarter to half a second each on an H100). With
    ``device``, ``warm_up`` calls ``gae()`` (``backend="auto"``) on zeros of
    that device at a T of each class and alignment, with one program a row
    and cut into chunks, for each dtype, case and layout: afterwards a call of
    those at any B and T compiles nothing (for B-by-T batches; other batch
    ranks, array coefficients and other layouts compile on their first
    call). Triton keeps the compiled kernels on disk (``~/.triton/cache``),
    so that a later process loads them instead of compiling. Where ``auto``
    takes the numba-CUDA route, its kernels compile (or load from numba's
    cache) instead.

    Parameters
    ----------
    dtypes : str or sequence of str, default ("float32",)
        The dtypes of ``rewards`` and ``values``: "float32", "float64"; with
        ``device`` also "float16", "bfloat16".
    cases : str or sequence of str, default ("constant", "dones+mask")
        "constant" (``gae(rewards, values)``), "dones+mask" (``terminated``
        and ``mask``), "truncated" (``terminated``, ``truncated`` with
        ``next_values``, and ``mask``), "dones" (``terminated`` only), "mask"
        (``mask`` only). A call whose options are a case's, or the same
        without ``truncated``, finds its kernel ready.
    layouts : str or sequence of str, default all three
        How the calls lay their arrays out (numba compiles a kernel per
        layout of the arrays it is given): "time-last" (each array C-contiguous
        with time last, ``gae(rewards, values)``), "time-first" (C-contiguous
        (T, B) arrays with ``axis=0``, CleanRL's layout, and their leading
        slices such as ``values[:-1]``), "bootstrap column" (``gae(rewards,
        values[..., :-1], bootstrap_value=values[..., -1])``, the README's
        call, or ``next_values=values[..., 1:]``). NumPy arrays and torch CPU
        tensors alike. Other layouts (strided time, other slices of the
        per-step arrays) compile a kernel on their first call.
    device : str or torch.device, optional
        A CUDA device whose kernels to compile (torch tensors on it); None,
        the default: the numba CPU kernels.

    Returns
    -------
    None
        The kernels are compiled into this process and written to gae_xp's
        cache directory (``$NUMBA_CACHE_DIR/gae_xp``, ``$GAE_XP_CACHE_DIR``
        or the user's cache directory, ``~/.cache/gae_xp`` on Linux), or
        loaded from it; nothing is returned.

    Raises
    ------
    TypeError, ValueError
        ``dtypes``, ``cases`` or ``layouts`` neither a name nor a sequence of names, or a name not listed above;
        ``device`` not a CUDA device that torch sees.

    Examples
    --------
    >>> import gae_xp
    >>> gae_xp.warm_up()  # at start-up: the first rollout's gae() calls then compile nothing
    >>> gae_xp.warm_up(dtypes=("float32", "float64"), cases=("constant", "mask"))
    >>> gae_xp.warm_up(dtypes=("float32", "bfloat16"), layouts="time-last", device="cuda")  # doctest: +SKIP
    """
    from .backends import _fallback

    floats = ("float32", "float64") if device is None else ("float32", "float64", "float16", "bfloat16")
    dtypes = _names("dtypes", dtypes, floats)
    cases = _names("cases", cases, tuple(WARM_CASES))
    layouts = _names("layouts", layouts, tuple(WARM_LAYOUTS))
    if device is not None:
        _warm_up_device(_cuda_device(device), dtypes, cases, layouts, "auto")
        return
    if backends.load("numba").unavailable_reason(None, []) is not None:
        return
    # Rows shorter than the kernels' window have a driver of their own: one call of each length readies both.
    try:
        for dtype, length, case, layout in itertools.product(dtypes, (8, 2048), cases, layouts):
            _warm_call(WARM_LAYOUTS[layout](np.zeros, np.dtype(dtype), 2, length), case, "numba")
    except _fallback.RouteUnavailableError:  # numba cannot import or compile: "auto" takes the generic path
        _fallback.warn_once("numba", _fallback.broken("numba"), "xp")


def _cuda_device(device):
    """``device`` as a ``torch.device`` of a CUDA device that torch sees, else a ValueError naming ``device``."""
    try:
        import torch
    except ImportError:
        raise ValueError(f"device={device!r} needs torch (the kernels take torch CUDA tensors)") from None
    try:
        device = torch.device(device)
    except (RuntimeError, TypeError) as error:
        raise ValueError(f"device must name a CUDA device, got {device!r} ({error})") from None
    if device.type != "cuda" or not torch.cuda.is_available() or (device.index or 0) >= torch.cuda.device_count():
        raise ValueError(f"device must be a CUDA device that torch sees, got {str(device)!r} "
                         f"({torch.cuda.device_count()} visible)")
    return device


def _warm_up_device(device, dtypes, cases, layouts, backend: str) -> None:
    """``gae()`` on zeros of ``device`` (a ``torch.device``) at the shapes of ``_triton_config.warm_shapes`` for
    each dtype, case and layout, through ``backend`` ("auto"; "triton" where tests force the interpreter)."""
    import torch

    from .backends import _triton_config

    def zeros(shape, dtype):
        return torch.zeros(shape, dtype=torch.bool if dtype is bool else getattr(torch, dtype), device=device)

    for dtype, (rows, length), case, layout in itertools.product(
            dtypes, _triton_config.warm_shapes(_triton_config.multiprocessors(device)), cases, layouts):
        _warm_call(WARM_LAYOUTS[layout](zeros, dtype, rows, length), case, backend)


def _warm_call(a: "_Layout", case: str, backend: str) -> None:
    """One ``gae()`` call of ``case`` on the arrays of a layout."""
    given = {name: (~a.flags if kind == "real" else a.next_values if kind == "next" else a.flags)
             for name, kind in WARM_CASES[case].items()}
    bootstrap = None if "next_values" in given else a.bootstrap  # next_values replaces it
    gae(a.rewards, a.values, bootstrap_value=bootstrap, axis=a.axis, backend=backend, **given)


#: The options of each ``warm_up`` case: the flags (``flags``: all False), the mask (``real``: all True) and
#: ``next_values`` (``next``).
WARM_CASES = {"constant": {}, "dones": {"terminated": "flags"}, "mask": {"mask": "real"},
              "dones+mask": {"terminated": "flags", "mask": "real"},
              "truncated": {"terminated": "flags", "truncated": "flags", "mask": "real", "next_values": "next"}}


class _Layout(NamedTuple):
    """The arrays of a ``warm_up`` call laid out as a layout's calls lay them out (flags: a bool array of the
    rewards' layout)."""

    rewards: Any
    values: Any
    flags: Any
    next_values: Any
    bootstrap: Any = None
    axis: int = -1


def _time_last(zeros, dtype, rows: int, length: int) -> _Layout:
    """(B, T) arrays, each its own: ``gae(rewards, values)``. ``zeros(shape, dtype)`` makes the arrays (NumPy's,
    or torch's on a device)."""
    return _Layout(zeros((rows, length), dtype), zeros((rows, length), dtype), zeros((rows, length), bool),
                   zeros((rows, length), dtype))


def _time_first(zeros, dtype, rows: int, length: int) -> _Layout:
    """(T, B) arrays with ``axis=0`` (CleanRL's layout): time-last views that are not C-contiguous."""
    return _Layout(zeros((length, rows), dtype), zeros((length, rows), dtype), zeros((length, rows), bool),
                   zeros((length, rows), dtype), axis=0)


def _bootstrap_column(zeros, dtype, rows: int, length: int) -> _Layout:
    """``values`` holding one more step, the bootstrap: ``gae(r, values[..., :-1], bootstrap_value=values[..., -1])``
    (and ``next_values=values[..., 1:]``)."""
    values = zeros((rows, length + 1), dtype)
    return _Layout(zeros((rows, length), dtype), values[..., :-1], zeros((rows, length), bool), values[..., 1:],
                   bootstrap=values[..., -1])


#: The array layouts ``warm_up`` readies, by name: numba compiles a kernel per layout of its arrays (a C-contiguous
#: row, a transposed view and a slice are three types to it), so each is called once as its calls lay it out.
WARM_LAYOUTS = {"time-last": _time_last, "time-first": _time_first, "bootstrap column": _bootstrap_column}


def _names(argument: str, given, known: tuple[str, ...]) -> tuple[str, ...]:
    """``given`` (one name or a sequence of names, each one of ``known``) as a tuple, else an error naming
    ``argument``."""
    if isinstance(given, str):
        given = (given,)
    elif not isinstance(given, (tuple, list)):
        raise TypeError(f"{argument} must be a name or a sequence of names ({', '.join(map(repr, known))}), got "
                        f"{given!r}")
    for name in given:
        if name not in known:
            raise ValueError(f"{argument} must name some of {', '.join(map(repr, known))}, got {name!r}")
    return tuple(given)


def discounted_cumsum(x: Array, discount: Coefficient, *, axis: int = -1, reverse: bool = True,
                      initial: Coefficient | None = None, chunk_size: int | None = None,
                      backend: str = "auto") -> Array:
    r"""The scan primitive: a discounted cumulative sum along ``axis``.

    ::

        reverse=True:   y_t = x_t + discount_t * y_{t+1},   y_T  = initial (default 0)
        reverse=False:  y_t = x_t + discount_t * y_{t-1},   y_-1 = initial (default 0)

    A zero discount cuts the trace exactly (``y_t = x_t``, even next to NaN
    or inf). ``gae()`` is built on this scan.

    Parameters
    ----------
    x : array
        Any array-API library's array; time is ``axis``.
    discount : float or array
        A number in [-1, 1] or an array of such values broadcastable to x. A
        larger ``|discount|`` is rejected: its products overflow in any parallel
        form long before the loop's values do.
    axis : int, default -1
        The time axis.
    reverse : bool, default True
        Accumulate from the last step back (returns-to-go) or from the first on.
    initial : float or array, optional
        The value entering at the edge (``y_T`` or ``y_-1``): a number or an
        array of the batch shape; default 0.
    chunk_size, backend
        As in ``gae()``.

    Returns
    -------
    array
        ``y``, in x's namespace, on its device, with its floating dtype
        (integer or bool x gives the namespace's default float); it never
        shares memory with x.

    Raises
    ------
    TypeError, ValueError
        Naming the argument: x not an array, a discount outside [-1, 1] or NaN,
        shapes that do not broadcast, a bad axis.

    Examples
    --------
    >>> import numpy as np
    >>> import gae_xp
    >>> gae_xp.discounted_cumsum(np.array([1.0, 1.0, 1.0]), 0.5)
    array([1.75, 1.5 , 1.  ])
    >>> gae_xp.discounted_cumsum(np.array([1.0, 1.0, 1.0]), 0.5, reverse=False, initial=4.0)
    array([3.  , 2.5 , 2.25])
    """
    return linear_scan(x, discount, axis=axis, reverse=reverse, initial=initial, chunk_size=chunk_size,
                       backend=backend)


def linear_scan(x, coefficient, *, axis=-1, reverse=True, initial=None, chunk_size=None, backend="auto",
                name="discount", bounds=(-1.0, 1.0)):
    """``discounted_cumsum`` with the coefficient's name and bounds given: the adapters' importance-weighted
    traces (torchrl's ``c_thresh`` above 1, rlax's lambda above 1) take any real coefficient."""
    call = prepare_.prepare_scan(x, coefficient, axis=axis, reverse=reverse, initial=initial, chunk_size=chunk_size,
                                 backend=backend, name=name, bounds=bounds)
    y, _ = backends.run(call, lambda backend: backend.scan(call.xp, call.x, call.discount, reverse=call.reverse,
                                                           chunk_size=call.chunk_size))
    return call.restore(y)


def discounted_returns(rewards: Array, *, gamma: Coefficient = 0.99, terminated: Array | None = None,
                       truncated: Array | None = None, mask: Array | None = None,
                       bootstrap_value: Coefficient | None = None, axis: int = -1, chunk_size: int | None = None,
                       backend: str = "auto", cu_seqlens: Array | Sequence[int] | None = None) -> Array:
    r"""Reward-to-go (REINFORCE, REINFORCE++, GRPO-style returns).

    ::

        G_t = r_t + gamma_t (1 - done_t) G_{t+1},     G_T = bootstrap_value (default 0)

    Parameters
    ----------
    rewards : array
        Any array-API library's array; time is ``axis``.
    gamma, terminated, truncated, mask, bootstrap_value, axis, chunk_size, backend, cu_seqlens
        As in ``gae()``: a done step cuts the trace (``G_t = r_t`` there), a
        masked step is skipped and gets 0, and with ``cu_seqlens`` every
        packed sequence has its own ``bootstrap_value``.

    Returns
    -------
    array
        G, shaped like ``rewards``, in its namespace, device and floating dtype.

    Raises
    ------
    TypeError, ValueError
        As ``gae()``, naming the argument.

    Examples
    --------
    >>> import numpy as np
    >>> import gae_xp
    >>> gae_xp.discounted_returns(np.array([1.0, 0.0, 2.0]), gamma=0.5)
    array([1.5, 1. , 2. ])
    >>> gae_xp.discounted_returns(np.array([1.0, 0.0, 2.0]), gamma=0.5, terminated=np.array([False, True, False]))
    array([1., 0., 2.])
    """
    call = prepare_.prepare(rewards, gamma=gamma, terminated=terminated, truncated=truncated, mask=mask,
                            bootstrap_value=bootstrap_value, axis=axis, chunk_size=chunk_size, backend=backend,
                            lam=1.0, needs_values=False, cu_seqlens=cu_seqlens)
    return call.restore(backends.run(call, lambda solver: _discounted_returns(call, solver))[0])


def _discounted_returns(call, solver):
    """``discounted_returns`` of a checked call on a backend, time last, compute dtype."""
    p = call.problem
    if hasattr(solver, "solve_discounted_returns"):  # a fused kernel: no coefficient arrays materialised
        return solver.solve_discounted_returns(p)
    if p.rewards.shape[-1] == 0:
        return p.xp.zeros_like(p.rewards)
    pick = Picker(p, p.rewards, p.bootstrap)
    segments = Segments(p)
    coefficient = p.gamma if p.is_constant else step_coefficients(p, p.gamma, pick)
    x = segments.fold(owned_rewards(p, pick), coefficient, p.bootstrap)
    return pick.only(p.mask, _solve(call, solver, x, segments.cut(coefficient)))


def lambda_returns(rewards: Array, next_values: Array, *, gamma: Coefficient = 0.99, lam: Coefficient = 0.95,
                   terminated: Array | None = None, truncated: Array | None = None, mask: Array | None = None,
                   axis: int = -1, chunk_size: int | None = None, backend: str = "auto",
                   cu_seqlens: Array | Sequence[int] | None = None) -> Array:
    r"""TD(lambda) value targets (rlax ``lambda_returns``, torchrl ``td_lambda_return_estimate``)::

        G_t = r_t + gamma_t (1 - terminated_t) [(1 - lam_t) V'_t + lam_t G_{t+1}]

    with ``V'_t = next_values[t]`` = V(s_{t+1}), and ``G_{t+1} := V'_t`` where
    the trace is cut: at a done step and at the last real step of a row (of
    each sequence, with ``cu_seqlens``). So the last step is bootstrapped by
    its own V', as in rlax and torchrl.

    Parameters
    ----------
    rewards, next_values : array
        Arrays of one shape; ``next_values[t]`` is V(s_{t+1}).
    gamma, lam, terminated, truncated, mask, axis, chunk_size, backend, cu_seqlens
        As in ``gae()``.

    Returns
    -------
    array
        G, shaped like ``rewards``, in its namespace, device and floating
        dtype; 0 at masked steps.

    Raises
    ------
    TypeError, ValueError
        As ``gae()``, naming the argument.

    Examples
    --------
    >>> import numpy as np
    >>> import gae_xp
    >>> rewards, next_values = np.array([1.0, 1.0]), np.array([2.0, 4.0])
    >>> gae_xp.lambda_returns(rewards, next_values, gamma=0.5, lam=0.5)
    array([2.25, 3.  ])
    """
    call = prepare_.prepare(rewards, gamma=gamma, lam=lam, terminated=terminated, truncated=truncated, mask=mask,
                            axis=axis, chunk_size=chunk_size, backend=backend, extra={"next_values": next_values},
                            needs_values=False, cu_seqlens=cu_seqlens)
    return call.restore(backends.run(call, lambda solver: _lambda_returns(call, solver))[0])


def _lambda_returns(call, solver):
    """``lambda_returns`` of a checked call on a backend, time last, compute dtype."""
    p = call.problem
    if hasattr(solver, "solve_lambda_returns"):
        return solver.solve_lambda_returns(p)
    xp = p.xp
    if p.rewards.shape[-1] == 0:
        return xp.zeros_like(p.rewards)
    following = p.extra["next_values"]
    pick = Picker(p, p.rewards, following)
    segments = Segments(p)
    cut = last_real_step(p, pick, solve=solver.scan, chunk_size=call.chunk_size, segments=segments)
    done = done_flags(p)
    if done is not None:
        cut = cut | done
    kept = pick.as_float(cut, negated=True)
    # At a cut the step is bootstrapped by its own V' alone: G_t = r_t + gamma_t V'_t (0 if terminated).
    x = pick.real(p.mask, p.rewards) + pick.unless(p.terminated, p.gamma * (1 - p.lam * kept)
                                                   * pick.real(p.mask, following))
    coefficient = segments.cut(step_coefficients(p, p.gamma * p.lam * kept, pick))
    return pick.only(p.mask, _solve(call, solver, pick.only(p.mask, x), coefficient))


def vtrace(log_rhos: Array, rewards: Array, values: Array, *, gamma: Coefficient = 0.99, lam: Coefficient = 1.0,
           clip_rho_threshold: float = 1.0, clip_c_threshold: float = 1.0, clip_pg_rho_threshold: float = 1.0,
           bootstrap_value: Coefficient | None = None, next_values: Array | None = None,
           terminated: Array | None = None, truncated: Array | None = None, mask: Array | None = None,
           axis: int = -1, chunk_size: int | None = None, backend: str = "auto",
           truncated_bootstrap: str = "next_values") -> tuple[Array, Array]:
    r"""V-trace (IMPALA, Espeholt et al. 2018): ``(vs, pg_advantages)``.

    With ``rho_t = exp(log_rhos_t)`` (target over behaviour probability),
    ``rho_bar = min(rho, clip_rho_threshold)``, ``c_t = lam min(rho, clip_c_threshold)``
    and Vnext as in ``gae()``::

        delta_t = rho_bar_t (r_t + gamma_t (1 - terminated_t) Vnext_t - V_t)
        vs_t - V_t = delta_t + gamma_t (1 - done_t) c_t (vs_{t+1} - V_{t+1})
        pg_t = min(rho_t, clip_pg_rho_threshold) (r_t + gamma_t (1 - terminated_t) vs_next_t - V_t)

    where ``vs_next_t = Vnext_t + (vs - V)`` at the next real step, or Vnext_t
    where the trace is cut (a done step, the last step). The frameworks'
    conventions (rlax mixes lam into the policy-gradient target and takes
    rho, torchrl has no lam and cuts at done only) are reproduced by
    ``gae_xp.adapters.rlax`` and ``gae_xp.adapters.torchrl``.

    Parameters
    ----------
    log_rhos, rewards, values : array
        Arrays of one shape: the log importance ratios, rewards and V(s_t).
    gamma, lam : float or array
        As in ``gae()``; lam enters the trace coefficient c only.
    clip_rho_threshold, clip_c_threshold, clip_pg_rho_threshold : float, default 1.0
        Positive clipping thresholds of rho in the deltas, the trace and the
        policy-gradient target.
    bootstrap_value, next_values, terminated, truncated, mask, axis, chunk_size, backend, truncated_bootstrap
        As in ``gae()``: ``truncated`` needs ``next_values`` unless
        ``truncated_bootstrap="next_step"``.

    Returns
    -------
    vs, pg_advantages : array
        The V-trace value targets and the policy-gradient advantages, shaped
        like ``rewards``; 0 at masked steps.

    Raises
    ------
    TypeError, ValueError
        As ``gae()``, and a threshold that is not a positive number, naming it.

    Examples
    --------
    >>> import numpy as np
    >>> import gae_xp
    >>> rewards, values = np.array([0.0, 1.0]), np.array([0.5, 0.5])
    >>> vs, pg = gae_xp.vtrace(np.zeros(2), rewards, values, gamma=1.0)
    >>> vs, pg
    (array([1., 1.]), array([0.5, 0.5]))
    """
    thresholds = {name: prepare_.check_number(name, value, low=0.0, strict=True) for name, value in
                  (("clip_rho_threshold", clip_rho_threshold), ("clip_c_threshold", clip_c_threshold),
                   ("clip_pg_rho_threshold", clip_pg_rho_threshold))}
    call = prepare_.prepare(rewards, values, gamma=gamma, lam=lam, bootstrap_value=bootstrap_value,
                            next_values=next_values, terminated=terminated, truncated=truncated, mask=mask,
                            axis=axis, chunk_size=chunk_size, backend=backend, extra={"log_rhos": log_rhos},
                            truncated_bootstrap=truncated_bootstrap)
    (vs, pg), _ = backends.run(call, lambda solver: _vtrace(call, solver, thresholds))
    return call.restore(vs), call.restore(pg)


def _vtrace(call, solver, thresholds):
    """``vtrace``'s (vs, pg) of a checked call on a backend, time last, compute dtype."""
    p = call.problem
    if hasattr(solver, "solve_vtrace"):
        return solver.solve_vtrace(p, **thresholds)
    xp, v = p.xp, p.values
    if p.rewards.shape[-1] == 0:
        return xp.zeros_like(v), xp.zeros_like(v)
    pick = Picker(p, p.rewards, v, p.next_values, p.bootstrap, p.extra["log_rhos"])
    # A masked log ratio never enters exp (3e38 there would overflow); a real one that overflows gives rho = inf,
    # which every threshold clips next: IEEE's answer, computed without NumPy's warning.
    log_rhos = pick.only(p.mask, p.extra["log_rhos"])
    with ieee_overflow_allowed(log_rhos):
        rho = xp.exp(log_rhos)
    v_next = next_real_values(p, pick, solve=solver.scan, chunk_size=call.chunk_size)
    clipped = {name: xp.minimum(rho, xp.asarray(value, dtype=rho.dtype, device=device_of(rho)))
               for name, value in thresholds.items()}
    # A masked step is absent: its inputs are zeroed before any arithmetic (r - V there may overflow).
    r, real_v = pick.real(p.mask, p.rewards), pick.real(p.mask, v)
    delta = pick.only(p.mask, clipped["clip_rho_threshold"] * (r + pick.unless(p.terminated, p.gamma * v_next)
                                                                - real_v))
    coefficient = step_coefficients(p, p.gamma * p.lam * clipped["clip_c_threshold"], pick)
    corrections = _solve(call, solver, delta, coefficient)  # vs - V; at a masked step, that of the next real step
    following = neighbour(xp, corrections, reverse=True)
    vs_next = v_next + pick.unless(done_flags(p), following)
    pg = clipped["clip_pg_rho_threshold"] * (r + pick.unless(p.terminated, p.gamma * vs_next) - real_v)
    return pick.only(p.mask, corrections + real_v), pick.only(p.mask, pg)


def whiten(x: Array, mask: Array | None = None, *, unbiased: bool = True, eps: float = 1e-8,
           shift_mean: bool = True, masked_fill: float | None = 0.0) -> Array:
    r"""Normalise x with the mean and variance of its real entries.

    ::

        out = (x - mean) / sqrt(var + eps)      (+ mean again if not shift_mean)

    Parameters
    ----------
    x : array
        Any array-API library's array; the statistics run over all its axes.
    mask : array, optional
        Bool (True = a real entry), or numeric weights as verl's
        ``masked_mean`` takes them (a 0/1 float mask, or fractional weights:
        ``mean = sum(w x) / sum(w)``, ``var = sum(w (x - mean)^2) / sum(w)``).
        Entries with mask False or weight 0 are left out with ``where``, so
        NaN or inf there cannot leak.
    unbiased : bool, default True
        Divide the variance by n - 1 (n = the count, or sum(w)) instead of n.
    eps : float, default 1e-8
        Added to the variance before the square root.
    shift_mean : bool, default True
        False adds the mean back (scale only).
    masked_fill : float or None, default 0.0
        What masked entries get; None whitens them like the rest (verl's
        convention).

    Returns
    -------
    array
        Shaped like x, in its namespace, device and floating dtype.

    Raises
    ------
    TypeError, ValueError
        A mask of another shape or dtype, a negative eps, naming the argument.

    Examples
    --------
    >>> import numpy as np
    >>> import gae_xp
    >>> gae_xp.whiten(np.array([1.0, 2.0, 3.0]), eps=0.0)
    array([-1.,  0.,  1.])
    >>> gae_xp.whiten(np.array([1.0, 2.0, 3.0, 100.0]), np.array([True, True, True, False]), eps=0.0)
    array([-1.,  0.,  1.,  0.])
    """
    call = prepare_.prepare_whiten(x, mask, unbiased=unbiased, eps=eps, shift_mean=shift_mean,
                                   masked_fill=masked_fill)
    xp, values = call.xp, call.values
    zero = xp.full((), 0.0, dtype=values.dtype, device=device_of(values))  # made on the device: no host copy
    weights, real = call.weights(values.dtype)
    if weights is None:
        weights, real = xp.ones_like(values), xp.ones(values.shape, dtype=xp.bool, device=device_of(values))
    count = xp.sum(weights)
    mean = divide(xp, xp.sum(xp.where(real, weights * values, zero)), count)
    centred = values - mean
    var = divide(xp, xp.sum(xp.where(real, weights * (centred * centred), zero)), count - 1 if call.unbiased else count)
    out = centred / xp.sqrt(var + call.eps)
    if not call.shift_mean:
        out = out + mean
    if call.mask is not None and call.masked_fill is not None:
        out = xp.where(real, out, zero + call.masked_fill)
    return xp.astype(out, call.out_dtype, copy=False)


def _solve(call, solver, x, coefficient):
    return solver.scan(call.problem.xp, x, coefficient, reverse=True, chunk_size=call.chunk_size)
