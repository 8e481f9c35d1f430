"""The policy layer: models (:mod:`~rl8.policies.models`, :mod:`~rl8.policies.encoders`,
:mod:`~rl8.policies.recurrent`), action distributions, observation normalisation, the
:class:`~rl8.policies.policy.Policy` that holds them, and :mod:`~rl8.policies.runner` (a policy
acting in an env). It knows the env layer (:mod:`rl8.envs`), nothing of PPO or training."""
