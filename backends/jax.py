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

    def unavailable_reason(self, xp, arrays, *, forced=False):
        if not all(is_jax_array(a) for a in arrays):
            return "the lax.scan route takes JAX arrays"
        if not all(_platform(a) == "cpu" for a in arrays):
            return "on accelerators the chunk scan ('xp') serves JAX arrays: a loop over time leaves them idle"
        return None

    def gae(self, problem, *, chunk_size):
        p = problem
        steps = {"r": p.rewards, "v": p.values, "gamma": p.gamma, "lam": p.lam}
        for name in ("next_values", "terminated", "truncated", "mask"):
            if getattr(p, name) is not None:
                steps[name] = getattr(p, name)
        if p.offsets is not None or p.carry is not None:
            # Segments (packed sequences, pieces): at each one's last step the loop restarts from its own values.
            segments = Segments(p)
            steps["end"] = segments.ends()
            steps["after_value"] = segments.at_ends(p.bootstrap)
            if p.carry is not None:
                steps["after_advantage"] = segments.at_ends(p.carry)
        scalars = tuple((name, steps.pop(name)) for name in ("gamma", "lam") if isinstance(steps[name], float))
        return _compiled().gae(steps, p.bootstrap[..., -1], scalars=scalars, fill_masked=p.fill_masked)

    def scan(self, xp, x, a, *, reverse, chunk_size):
        return _compiled().scan(x, a, reverse=reverse)


@functools.cache
def _compiled():
    """The two loops, jitted once per process (jax is imported here): jit caches them per shape and option set."""
    from types import SimpleNamespace

    import jax
    from jax import numpy as jnp

    def gae_step(fill_masked, scalars, carry, at):
        at = {**at, **dict(scalars)}  # a coefficient that is one number is a constant of the compiled loop
        following, next_value = carry
        if "end" in at:  # what comes after a segment's last step: its own bootstrap value and incoming advantage
            following = jnp.where(at["end"], at.get("after_advantage", 0.0), following)
            next_value = jnp.where(at["end"], at["after_value"], next_value)
        v_next = at.get("next_values", next_value)
        bootstrapped = at["gamma"] * v_next
        if "terminated" in at:
            bootstrapped = jnp.where(at["terminated"], 0.0, bootstrapped)
        coefficient = at["gamma"] * at["lam"]
        cuts = [at[flag] for flag in ("terminated", "truncated") if flag in at]
        if not isinstance(coefficient, float):
            cuts.append(coefficient == 0)
        if isinstance(coefficient, float) and coefficient == 0.0:
            carried = 0.0
        elif cuts:
            carried = coefficient * jnp.where(functools.reduce(jnp.logical_or, cuts), 0.0, following)
        else:
            carried = coefficient * following
        advantage = at["r"] + bootstrapped - at["v"] + carried
        if "mask" not in at:
            return (advantage, at["v"]), advantage
        real = at["mask"]
        following = jnp.where(real, advantage, following)
        next_value = jnp.where(real, at["v"], next_value)
        return (following, next_value), following if fill_masked else jnp.where(real, following, 0.0)

    @functools.partial(jax.jit, static_argnames=("scalars", "fill_masked"))
    def gae(steps, bootstrap, scalars, fill_masked):
        like = steps["r"]
        start = (jnp.zeros(like.shape[:-1], dtype=like.dtype), jnp.broadcast_to(bootstrap, like.shape[:-1]))
        step = functools.partial(gae_step, fill_masked, scalars)
        _, advantages = jax.lax.scan(step, start, _time_major(steps), reverse=True)
        advantages = jnp.moveaxis(advantages, 0, -1)
        returns = advantages + steps["v"]  # outside the loop, where XLA fuses it with the transpose
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
        _, y = jax.lax.scan(scan_step, start, _time_major((x, _per_step(a, x))), reverse=reverse)
        return jnp.moveaxis(y, 0, -1)

    return SimpleNamespace(gae=gae, scan=scan)


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
