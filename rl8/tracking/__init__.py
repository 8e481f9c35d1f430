"""MLflow tracking (:mod:`~rl8.tracking.tracker`): the run, its background queue of metrics,
params flattening, listing and cleaning runs, the SQLite store. It knows nothing of PPO."""
