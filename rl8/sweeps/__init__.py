"""Hyper-parameter sweeps (``rl8 sweep``, :func:`rl8.sweep`): Optuna studies of a config's
hyper-parameters, each trial a nested MLflow run (``docs/sweeps.md``). It knows the layers below
(presets, training and under); Optuna is the ``sweep`` extra, imported where a sweep runs."""
