"""The training layer: the :class:`~rl8.training.trainer.Trainer` and the modules it is made of.
It knows the layers below (io, tracking, PPO, policies, envs)."""
