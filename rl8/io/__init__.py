"""Files: checkpoint files (:mod:`~rl8.io.checkpoint`: safe loading, atomic writes, folders of
checkpoints) and policy files (:mod:`~rl8.io.export`: ``save_policy``/``load_policy``). The
names a file holds are looked up in :mod:`rl8.registry` through :mod:`rl8.ppo.resolve`. It knows
PPO and the layers below, nothing of training."""
