"""Drop-in replacements for the GAE functions of RL frameworks: same signature, same outputs, any array type.

* ``gae_xp.adapters.verl.compute_gae_advantage_return``
* ``gae_xp.adapters.slime.vanilla_gae`` and ``chunked_gae``
* ``gae_xp.adapters.openrlhf.get_advantages_and_returns``
* ``gae_xp.adapters.torchrl.generalized_advantage_estimate`` and ``vtrace_advantage_estimate``

Each module restates its framework's semantics in its docstring and imports
nothing from the framework itself.
"""
