"""``rl8 sweep``: search a config's hyper-parameters with Optuna, each trial a nested MLflow run
(``docs/sweeps.md``)."""

from __future__ import annotations

import argparse

__all__ = ["run"]


def run(args: argparse.Namespace) -> int:
    """``rl8 sweep``: run the trials that ``args`` (the parsed command line) ask for and print the
    best; the exit status."""
    try:
        import optuna  # noqa: F401 - the sweep extra
    except ImportError:
        raise ImportError(
            "rl8 sweep needs Optuna, the sweep extra: pip install -e '.[sweep]' in the checkout of rl8"
        ) from None
    from rl8.sweeps.study import sweep

    options = (
        "jobs",
        "study",
        "storage",
        "objective",
        "direction",
        "pruner",
        "startup_trials",
        "max_env_steps",
        "max_seconds",
        "seed",
    )
    study = sweep(
        args.config, args.space, trials=args.trials, **{key: getattr(args, key) for key in options}
    )
    states = [t.state.name for t in study.trials]
    counts = ", ".join(f"{states.count(s)} {s.lower()}" for s in ("COMPLETE", "PRUNED", "FAIL"))
    print(f"rl8: study {study.study_name}: {len(states)} trials ({counts})")
    if "COMPLETE" in states:
        print(
            f"rl8: best: trial {study.best_trial.number}: {args.objective} = {study.best_value:.6g} with {study.best_params}"
        )
    print(
        f"rl8: the study's MLflow run: {study.user_attrs['mlflow_run_id']} (its trials are nested under it)"
    )
    return 0
