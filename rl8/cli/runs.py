"""``rl8 runs``: list the RUNNING MLflow runs and their process; ``--clean`` marks those of dead
processes FAILED."""

from __future__ import annotations

import argparse
import sys
import time

from rl8.training.config_file import ConfigError

__all__ = ["run"]


def run(args: argparse.Namespace) -> int:
    """``rl8 runs``: list the RUNNING runs (``--clean``: mark those of dead processes FAILED); the
    exit status.

    Args:
        args: The parsed command line (see :func:`rl8.cli.main.build_parser`).
    """
    from rl8.tracking.runs import clean_runs, running_runs
    if args.older_than is not None and not args.clean:
        raise ConfigError("--older-than only applies with --clean")
    if args.dry_run and not args.clean:
        raise ConfigError("--dry-run only applies with --clean")
    uri = args.tracking_uri
    if args.clean:
        runs = clean_runs(uri, experiment=args.experiment, older_than_s=args.older_than, dry_run=args.dry_run)
        verb = "would mark" if args.dry_run else "marked"
        print(f"rl8: {verb} {len(runs)} RUNNING run(s) FAILED (their process is gone)", file=sys.stderr)
    else:
        runs = running_runs(uri, experiment=args.experiment)
        print(f"rl8: {len(runs)} RUNNING run(s)", file=sys.stderr)
    for run in runs:
        owner = f"{run.host}:{run.pid}" if run.host else "-"
        started = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(run.start_time_s))
        print(f"{run.run_id}  {run.experiment}  {run.run_name or '-'}  {owner}  "
              f"process {run.process}  started {started}")
    return 0
