"""The training layer: the :class:`~rl8.training.trainer.Trainer` (its options in
:mod:`~rl8.training.config`), the run loop, stop conditions, callbacks, progress lines,
evaluation envs, the run's checkpoints (:mod:`~rl8.training.resume`), signals, videos and
actors/learners. It knows the layers below (io, tracking, PPO, policies, envs)."""
