"""Files: checkpoint files and folders (safe loading, atomic writes) and policy files. It knows
PPO and the layers below, nothing of training."""
