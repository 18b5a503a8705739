"""JAX on the CPU: the recurrence as one ``jax.lax.scan`` over time, compiled by XLA into a single loop.

On a CPU the fastest exact form of a serial recurrence is one pass per row,
and under ``jax.jit`` XLA compiles ``lax.scan`` into exactly that: a loop
over T steps that carries, per row, the running advantage and "V at the next
real step", and reads every input once. The chunk scan's extra passes over
memory cost more there (rlax writes GAE this way for the same reason). On
accelerators the chunk scan (the "xp" backend) stays: a loop of T dependent
steps leaves a GPU idle. Every step does what ``gae_xp.reference.gae_loop``
does, with ``where`` at the cuts, so NaN and inf never cross a done step;
``jax.grad``, ``jax.vmap`` and ``jax.jit`` work through it.

A gamma or lam given as a Python number is a constant of the compiled loop
(a static argument: XLA folds it in), so each new value compiles the loop
once more, as a new shape does; a value that changes every call (a schedule)
is better passed as a JAX array, which is traced and compiles once.
"""

from __future__ import annotations

import functools

from gae_xp._compat import is_jax_array
from gae_xp._recurrences import Segments

NAME = "jax"


class JaxCPUBackend:
    name = NAME
    segments = True
    uses_chunk_size = False
    critic_lam = True
    summarize = None

    def unavailable_reason(self, xp, arrays, *, forced=False):
        if not all(is_jax_array(a) for a in arrays):
            return "the lax.scan route takes JAX arrays"
        if not all(_platform(a) == "cpu" for a in arrays):
            return "on accelerators the chunk scan ('xp') serves JAX arrays: a loop over time leaves them idle"
        return None

    def gae(self, problem, *, chunk_size):
        p = problem
        steps = p.steps()
        if p.offsets is not None or p.carry is not None:
            # Segments (packed sequences, pieces): at each one's last step the loop restarts from its own values.
            segments = Segments(p)
            steps["end"] = segments.ends()
            steps["after_value"] = segments.at_ends(p.bootstrap)
            if p.carry is not None:
                steps["after_advantage"] = segments.at_ends(p.carry)
        coefficients = (("gamma", p.gamma), ("lam", p.lam), ("critic_lam", p.critic_lam))
        scalars = tuple((name, value) for name, value in coefficients if isinstance(value, float))
        # the last segment's bootstrap starts the loop; zero segments (cu_seqlens=[0]) have no step to start
        last = p.bootstrap[..., -1] if p.bootstrap.shape[-1] else p.xp.zeros(p.bootstrap.shape[:-1],
                                                                             dtype=p.bootstrap.dtype)
        return _compiled().gae(steps, last, scalars=scalars, fill_masked=p.fill_masked,
                               decoupled=p.critic_lam is not None)

    def scan(self, xp, x, a, *, reverse, chunk_size):
        return _compiled().scan(x, a, reverse=reverse)


@functools.cache
def _compiled():
    """The two loops, jitted once per process (jax is imported here): jit caches them per shape and option set."""
    from types import SimpleNamespace

    import jax
    from jax import numpy as jnp

    def advance(at, coefficient, following):
        """delta's share aside, the advantage carried into this step: ``coefficient * following``, cut exactly."""
        cuts = [at[flag] for flag in ("terminated", "truncated") if flag in at]
        if not isinstance(coefficient, float):
            cuts.append(coefficient == 0)
        if isinstance(coefficient, float) and coefficient == 0.0:
            return 0.0
        if cuts:
            return coefficient * jnp.where(functools.reduce(jnp.logical_or, cuts), 0.0, following)
        return coefficient * following

    def gae_step(fill_masked, decoupled, scalars, carry, at):
        at = {**at, **dict(scalars)}  # a coefficient that is one number is a constant of the compiled loop
        followings, next_value = carry[:-1], carry[-1]  # the running advantage (and the critic's), V after t
        if "end" in at:  # what comes after a segment's last step: its own bootstrap value and incoming advantage
            followings = tuple(jnp.where(at["end"], at.get("after_advantage", 0.0), f) for f in followings)
            next_value = jnp.where(at["end"], at["after_value"], next_value)
        v_next = at.get("next_values", next_value)
        bootstrapped = at["gamma"] * v_next
        if "terminated" in at:
            bootstrapped = jnp.where(at["terminated"], 0.0, bootstrapped)
        delta = at["rewards"] + bootstrapped - at["values"]
        lams = (at["lam"], at["critic_lam"]) if decoupled else (at["lam"],)
        advantages = tuple(delta + advance(at, at["gamma"] * lam, f) for lam, f in zip(lams, followings))
        if "mask" not in at:
            return (*advantages, at["values"]), advantages
        real = at["mask"]
        followings = tuple(jnp.where(real, a, f) for a, f in zip(advantages, followings))
        next_value = jnp.where(real, at["values"], next_value)
        out = followings if fill_masked else tuple(jnp.where(real, f, 0.0) for f in followings)
        return (*followings, next_value), out

    @functools.partial(jax.jit, static_argnames=("scalars", "fill_masked", "decoupled"))
    def gae(steps, bootstrap, scalars, fill_masked, decoupled):
        like = steps["rewards"]
        zero = jnp.zeros(like.shape[:-1], dtype=like.dtype)
        start = ((zero, zero) if decoupled else (zero,)) + (jnp.broadcast_to(bootstrap, like.shape[:-1]),)
        step = functools.partial(gae_step, fill_masked, decoupled, scalars)
        _, outputs = jax.lax.scan(step, _varying_like(start, (steps, bootstrap)), _time_major(steps), reverse=True)
        outputs = [jnp.moveaxis(out, 0, -1) for out in outputs]
        advantages = outputs[0]
        returns = outputs[-1] + steps["values"]  # outside the loop, where XLA fuses it with the transpose
        if "mask" in steps and not fill_masked:
            returns = jnp.where(steps["mask"], returns, 0.0)
        return advantages, returns

    def scan_step(state, at):
        value, coefficient = at
        state = value + coefficient * jnp.where(coefficient == 0, 0.0, state)
        return state, state

    @functools.partial(jax.jit, static_argnames=("reverse",))
    def scan(x, a, reverse):
        start = jnp.zeros(x.shape[:-1], dtype=x.dtype)
        steps = (x, _per_step(a, x))
        _, y = jax.lax.scan(scan_step, _varying_like(start, steps), _time_major(steps), reverse=reverse)
        return jnp.moveaxis(y, 0, -1)

    return SimpleNamespace(gae=gae, scan=scan)


def _varying_like(start, inputs):
    """The loop's initial carry, varying over every manual axis its inputs vary over.

    Inside ``jax.shard_map`` (context parallelism: ``gae_xp.distributed``) a
    value that varies across the devices of an axis has another type than
    one that does not, and ``lax.scan`` wants its carry's type unchanged by
    a step; a carry started from constants would become varying.
    """
    import jax

    if not hasattr(jax, "typeof") or not hasattr(jax.lax, "pcast"):
        return start  # a JAX without these types

    def axes(x):  # the axes x varies over: ``manual_axis_type.varying`` (JAX 0.10), ``vma`` before
        kind = jax.typeof(x)
        manual = getattr(kind, "manual_axis_type", None)
        return frozenset(manual.varying if manual is not None else getattr(kind, "vma", ()))

    varying = frozenset().union(*map(axes, jax.tree_util.tree_leaves(inputs)))
    if not varying:
        return start
    return jax.tree_util.tree_map(
        lambda s: s if not varying - axes(s) else jax.lax.pcast(s, tuple(sorted(varying - axes(s), key=str)),
                                                               to="varying"), start)


def _platform(array) -> str:
    """The platform an array lives on; for a traced value, where this trace will run (the default backend)."""
    import jax

    if isinstance(array, jax.core.Tracer):
        return jax.default_backend()
    return next(iter(array.devices())).platform


def _per_step(value, like):
    """A coefficient (a Python float or an array shaped like ``like``) as an array shaped like ``like``."""
    from jax import numpy as jnp

    return jnp.broadcast_to(jnp.asarray(value, dtype=like.dtype), like.shape)


def _time_major(tree):
    """Every array of the tree with time moved first, as lax.scan walks the leading axis."""
    import jax
    from jax import numpy as jnp

    return jax.tree_util.tree_map(lambda a: jnp.moveaxis(a, -1, 0), tree)


BACKEND = JaxCPUBackend()
