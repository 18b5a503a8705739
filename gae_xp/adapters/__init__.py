"""Drop-in replacements for the GAE functions of RL frameworks: same signature, same outputs, any array type.

* ``gae_xp.adapters.verl.compute_gae_advantage_return``, and the outcome-reward estimators
  ``compute_grpo_outcome_advantage`` (GRPO, Dr.GRPO), ``compute_rloo_outcome_advantage``,
  ``compute_reinforce_plus_plus_baseline_outcome_advantage`` and ``compute_reinforce_plus_plus_outcome_advantage``
* ``gae_xp.adapters.trl.grpo_advantages`` and ``gae_xp.adapters.openrlhf.group_advantages`` (GRPOTrainer's and
  OpenRLHF's group-relative rewards)
* ``gae_xp.adapters.slime.vanilla_gae``, ``chunked_gae`` and ``chunked_discounted_returns``
* ``gae_xp.adapters.openrlhf.get_advantages_and_returns`` and ``normalize_advantages`` (``no_std_norm``)
* ``gae_xp.adapters.areal.pygae1d_nolp_misalign`` / ``cugae1d_nolp_misalign_func`` (packed, one extra
  value slot per sequence, empty sequences included) and ``compute_token_level_gae`` (the padded block)
* ``gae_xp.adapters.cleanrl.compute_gae`` (time-major, ``next_done``, ``next_value``) and ``normalize_advantages``
* ``gae_xp.adapters.trl.compute_advantages_and_returns`` (PPOTrainer's block), ``masked_mean``,
  ``masked_var`` and ``masked_whiten``
* ``gae_xp.adapters.torchrl.generalized_advantage_estimate`` and ``vtrace_advantage_estimate``
* ``gae_xp.adapters.rlax.lambda_returns``, ``discounted_returns``,
  ``truncated_generalized_advantage_estimation``, ``importance_corrected_td_errors``,
  ``vtrace``, ``leaky_vtrace``, ``vtrace_td_error_and_advantage`` and
  ``leaky_vtrace_td_error_and_advantage``

Each module restates its framework's semantics in its docstring, lists every
deliberate difference from it and imports nothing from the framework itself.
They compute with gae_xp's estimators (``gae``, ``whiten``, ``group_advantages``, and
``estimators.linear_scan`` for the recurrences the public functions do not
name) and ask ``gae_xp._compat`` about arrays. ``tests/conformance`` runs
each framework's own tests of these functions against them.
"""
