"""``rl8 sweep``: search a config's hyper-parameters with Optuna, each trial a nested MLflow run
(``docs/sweeps.md``)."""

from __future__ import annotations

import argparse

__all__ = ["run"]


def run(args: argparse.Namespace) -> int:
    """``rl8 sweep``: run the trials and print the best; the exit status.

    Args:
        args: The parsed command line (see :func:`rl8.cli.main.build_parser`).
    """
    try:
        import optuna  # noqa: F401 - the sweep extra
    except ImportError:
        raise ImportError("rl8 sweep needs Optuna: pip install 'rl8[sweep]'") from None
    from rl8.sweeps.study import sweep
    study = sweep(args.config, args.space, trials=args.trials, jobs=args.jobs, study=args.study,
                  storage=args.storage, objective=args.objective, direction=args.direction, pruner=args.pruner,
                  startup_trials=args.startup_trials, max_env_steps=args.max_env_steps,
                  max_seconds=args.max_seconds, seed=args.seed)
    states = ", ".join(f"{sum(t.state.name == s for t in study.trials)} {s.lower()}" for s in ("COMPLETE", "PRUNED", "FAIL"))
    print(f"rl8: study {study.study_name}: {len(study.trials)} trials ({states})")
    if any(t.state.name == "COMPLETE" for t in study.trials):
        best = study.best_trial
        print(f"rl8: best: trial {best.number}: {args.objective} = {best.value:.6g} with {best.params}")
    print(f"rl8: the study's MLflow run: {study.user_attrs['mlflow_run_id']} (its trials are nested under it)")
    return 0
