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
    exit status (``args``: the parsed command line)."""
    from rl8.tracking.runs import clean_runs, running_runs

    for flag, given in (("--older-than", args.older_than is not None), ("--dry-run", args.dry_run)):
        if given and not args.clean:
            raise ConfigError(f"{flag} only applies with --clean")
    uri = args.tracking_uri
    if args.clean:
        runs = clean_runs(
            uri, experiment=args.experiment, older_than_s=args.older_than, dry_run=args.dry_run
        )
        verb = "would mark" if args.dry_run else "marked"
        print(f"rl8: {verb} {len(runs)} RUNNING run(s) FAILED (their process is gone)", file=sys.stderr)
    else:
        runs = running_runs(uri, experiment=args.experiment)
        print(f"rl8: {len(runs)} RUNNING run(s)", file=sys.stderr)
    for run in runs:
        owner = f"{run.host}:{run.pid}" if run.host else "-"
        started = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(run.start_time_s))
        print(
            f"{run.run_id}  {run.experiment}  {run.run_name or '-'}  {owner}  "
            f"process {run.process}  started {started}"
        )
    return 0
