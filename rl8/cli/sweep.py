"""``rl8 sweep``: search a config's hyper-parameters with Optuna, each trial a nested MLflow run
(``docs/sweeps.md``)."""

from __future__ import annotations

import argparse
import sys

__all__ = ["run"]


def run(args: argparse.Namespace) -> int:
    """``rl8 sweep``: run the trials that ``args`` (the parsed command line) ask for and print the
    trials of the study by state and the best; the exit status (130 when Ctrl-C stopped it)."""
    try:
        import optuna  # noqa: F401 - the sweep extra
    except ImportError:
        raise ImportError(
            "rl8 sweep needs Optuna, the sweep extra: pip install -e '.[sweep]' in the checkout of rl8"
        ) from None
    from rl8.sweeps.study import FINISHED_STATES, SweepInterrupted, state_counts, sweep

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
        "no_stop_conditions",
    )
    try:
        study = sweep(
            args.config, args.space, trials=args.trials, **{key: getattr(args, key) for key in options}
        )
    except SweepInterrupted as stop:  # Ctrl-C: the trials and runs are ended, one line says how
        print(f"rl8: {stop}", file=sys.stderr)
        return 130
    counts = state_counts(study)
    shown = ", ".join(
        f"{count} {state.lower()}"
        for state, count in counts.items()
        if count or state in FINISHED_STATES  # running or waiting ones only when there are some
    )
    print(f"rl8: study {study.study_name}: {sum(counts.values())} trials ({shown})")
    if counts["COMPLETE"]:
        print(
            f"rl8: best: trial {study.best_trial.number}: {args.objective} = {study.best_value:.6g} with {study.best_params}"
        )
    print(
        f"rl8: the study's MLflow run: {study.user_attrs['mlflow_run_id']} (its trials are nested under it)"
    )
    return 0
