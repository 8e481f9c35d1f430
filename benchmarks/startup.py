"""Start-up time of a Trainer: how long until the first collect begins.

Each measurement is a fresh Python process (imports are only slow once per process) that runs::

    import torch; torch.set_num_threads(THREADS)
    from rl8 import PPO, Trainer; from rl8.envs import CartPole      # "import"
    algo = PPO(CartPole, num_envs=16, horizon=8)                      # "ppo"
    trainer = Trainer(algo, progress=False)       # "to first collect": from here until
    for _ in range(STEPS):                        # the first collect() starts; "train": the
        trainer.step()                            # steps from there
    trainer.close()                               # "close" (ends the run)

with ``MLFLOW_TRACKING_URI=sqlite:///<tmp>/mlflow.db``, either a ``fresh`` store (no file: MLflow
creates and migrates it) or an ``existing`` one (a copy of a store in which one Trainer already
ran). It prints, per case, the median and range of:

* ``import``: ``import torch`` and rl8's public names;
* ``to first collect``: from the call ``Trainer(...)`` to the moment ``algo.collect()`` is first
  entered (the figure the start-up goal is about);
* ``train``: the ``STEPS`` training steps (``--steps``, default 1);
* ``close``: ``trainer.close()`` after them (it waits for a run start still in progress);
* ``process``: the whole process, from launch to exit, as the parent sees it.

Several source trees can be compared (``--src DIR``, e.g. a checkout of an older commit); the
runs alternate between them, so that load from other processes hits all alike::

    python benchmarks/startup.py --reps 5 --threads 1
    python benchmarks/startup.py --reps 5 --steps 200     # the start overlapping training
    python benchmarks/startup.py --src /tmp/rl8-old --src . --reps 5
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

CHILD = r"""
import json, sys, time
t0 = time.perf_counter()
import torch
torch.set_num_threads({threads})
from rl8 import PPO, Trainer
from rl8.envs import CartPole
t_import = time.perf_counter()
algo = PPO(CartPole, num_envs=16, horizon=8)
t_ppo = time.perf_counter()
first_collect = []
collect = algo.collect

def timed_collect(*args, **kwargs):
    first_collect.append(time.perf_counter())
    algo.collect = collect
    return collect(*args, **kwargs)

algo.collect = timed_collect
t_trainer = time.perf_counter()
trainer = Trainer(algo, experiment="startup", progress=False)
for _ in range({steps}):
    trainer.step()
t_close = time.perf_counter()
trainer.close()
t_end = time.perf_counter()
assert trainer.tracker.final_status == "FINISHED", trainer.tracker.final_status
print(json.dumps({{
    "import": t_import - t0,
    "ppo": t_ppo - t_import,
    "to first collect": first_collect[0] - t_trainer,
    "train": t_close - first_collect[0],
    "close": t_end - t_close,
}}))
"""

FIGURES = ("import", "ppo", "to first collect", "train", "close", "process")


def measure(
    src: Path, store: str, threads: int, steps: int, workdir: Path, template: Path | None
) -> dict[str, float]:
    """One fresh process with rl8 from ``src``; ``store``: ``"fresh"`` or ``"existing"``."""
    shutil.rmtree(workdir, ignore_errors=True)
    workdir.mkdir(parents=True)
    db = workdir / "mlflow.db"
    if store == "existing":
        shutil.copy(template, db)
    env = {**os.environ, "PYTHONPATH": str(src), "MLFLOW_TRACKING_URI": f"sqlite:///{db}"}
    start = time.perf_counter()
    done = subprocess.run(
        [sys.executable, "-c", CHILD.format(threads=threads, steps=steps)],
        cwd=workdir,
        env=env,
        capture_output=True,
        text=True,
    )
    elapsed = time.perf_counter() - start
    if done.returncode != 0:
        raise RuntimeError(f"the benchmark process failed:\n{done.stderr}")
    figures = json.loads(done.stdout.strip().splitlines()[-1])
    figures["process"] = elapsed
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--src",
        action="append",
        type=Path,
        help="source tree holding the rl8 package to time (repeatable); default: this repo",
    )
    parser.add_argument("--reps", type=int, default=5, help="processes per source tree and store")
    parser.add_argument("--threads", type=int, default=1, help="torch.set_num_threads in each process")
    parser.add_argument("--steps", type=int, default=1, help="training steps before close()")
    args = parser.parse_args()
    sources = [p.resolve() for p in (args.src or [Path(__file__).resolve().parents[1]])]
    results: dict[tuple[Path, str], list[dict[str, float]]] = {}
    with tempfile.TemporaryDirectory(prefix="rl8-startup-") as tmp:
        template = Path(tmp) / "template"
        measure(sources[0], "fresh", args.threads, 1, template, None)  # an existing store to copy
        for _ in range(args.reps):
            for src in sources:
                for store in ("fresh", "existing"):
                    figures = measure(
                        src, store, args.threads, args.steps, Path(tmp) / "run", template / "mlflow.db"
                    )
                    results.setdefault((src, store), []).append(figures)
    print(
        f"{args.reps} processes each, torch threads {args.threads}, {args.steps} steps; "
        "seconds: median [min-max]"
    )
    for (src, store), runs in results.items():
        cells = []
        for name in FIGURES:
            values = [run[name] for run in runs]
            cells.append(f"{name} {statistics.median(values):.2f} [{min(values):.2f}-{max(values):.2f}]")
        print(f"{src} {store:8s}  " + " | ".join(cells))


if __name__ == "__main__":
    main()
