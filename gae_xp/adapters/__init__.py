"""Drop-in replacements for the GAE functions of RL frameworks: same signature, same outputs, any array type.

* ``gae_xp.adapters.verl.compute_gae_advantage_return``
* ``gae_xp.adapters.slime.vanilla_gae``, ``chunked_gae`` and ``chunked_discounted_returns``
* ``gae_xp.adapters.openrlhf.get_advantages_and_returns``
* ``gae_xp.adapters.torchrl.generalized_advantage_estimate`` and ``vtrace_advantage_estimate``
* ``gae_xp.adapters.rlax.lambda_returns``, ``discounted_returns``,
  ``truncated_generalized_advantage_estimation``, ``importance_corrected_td_errors``,
  ``vtrace``, ``leaky_vtrace``, ``vtrace_td_error_and_advantage`` and
  ``leaky_vtrace_td_error_and_advantage``

Each module restates its framework's semantics in its docstring, lists every
deliberate difference from it and imports nothing from the framework itself.
They compute with gae_xp's estimators (``gae``, ``whiten``, and
``estimators.linear_scan`` for the recurrences the public functions do not
name) and ask ``gae_xp._compat`` about arrays. ``tests/conformance`` runs
each framework's own tests of these functions against them.
"""
