"""Actors and learners against data-parallel training, on 3 processes, with an env whose steps
take a variable time.

Workload: :class:`SleepyCartPole` (the built-in CartPole whose batched ``step`` sleeps a
uniformly drawn 0-4 ms, as a slow simulator or a remote env would), 16 envs per collecting
process, horizon 32, 4 SGD passes over minibatches of 256 transitions, 64x64 MLPs. CPU, gloo,
one torch thread per process. Each job trains :data:`UPDATES` updates with ``Trainer.run``;
the figure is the env transitions the update(s) used per second of ``run`` (start-up
excluded), i.e. ``env/steps`` over the run's wall time:

* data-parallel: ``torchrun --nproc_per_node=3``, every rank collects 16 envs and updates in
  lock step (each update waits for the slowest rank's rollout);
* actors/learners: ``--actors 2``: 2 actors of 16 envs each feed 1 learner (``max_staleness=1``),
  which updates while they collect the next rollouts.

``extra_info`` holds both throughputs and their ratio (actors/learners over data-parallel),
measured in the same run. Run::

    pytest benchmarks/test_actors.py --benchmark-columns=median,rounds -s

Figures from one run on the development machine (2 cores, quiet), from
``PYTHONPATH=$PWD python -m pytest benchmarks -q -p no:cacheprovider -s`` (all benchmark files, 9.5 minutes in all): data-parallel 6420 env steps/s, actors/learners 7502: ratio 1.17. Under a load
average of 15 (other jobs on the same 2 cores) an earlier run gave 2345 and 2327: ratio 0.99,
the three processes then wait for cores rather than for the slowest env.
"""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
import time
from pathlib import Path

import pytest
from launch import free_port

THIS_FILE = str(Path(__file__).resolve())
ENVS_PER_COLLECTOR = 16
HORIZON = 32
UPDATES = 30
MAX_STEP_SLEEP_S = 0.004


def _job(mode: str, out: Path) -> dict[str, float]:
    """Run one 3-process job (``mode``: ``"dp"`` or ``"actors"``) and return its figures."""
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nnodes=1",
        "--nproc_per_node=3",
        "--master_addr=127.0.0.1",
        f"--master_port={free_port()}",
        THIS_FILE,
        mode,
        str(out),
    ]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(Path(THIS_FILE).parents[1])}
    job = subprocess.run(cmd, capture_output=True, text=True, timeout=170, env=env)
    assert job.returncode == 0, job.stdout[-3000:] + job.stderr[-3000:]
    return json.loads(out.read_text())


@pytest.mark.timeout(400)
def test_actor_learner_vs_data_parallel_throughput(benchmark, tmp_path):
    data_parallel = _job("dp", tmp_path / "dp.json")
    actors = benchmark.pedantic(_job, args=("actors", tmp_path / "actors.json"), rounds=1, iterations=1)
    ratio = actors["env_steps_per_s"] / data_parallel["env_steps_per_s"]
    benchmark.extra_info.update(
        {
            "data_parallel_env_steps_per_s": data_parallel["env_steps_per_s"],
            "actors_env_steps_per_s": actors["env_steps_per_s"],
            "ratio_actors_over_data_parallel": ratio,
            "actors_policy_lag": actors["policy_lag"],
        }
    )
    print(
        f"\ndata-parallel: {data_parallel['env_steps_per_s']:.0f} env steps/s; actors/learners: "
        f"{actors['env_steps_per_s']:.0f} env steps/s; ratio {ratio:.2f}"
    )
    assert actors["policy_lag"] <= 1


def _worker(mode: str, out: Path) -> None:
    import torch

    from rl8 import PPO, Trainer
    from rl8.envs import CartPole
    from rl8.ppo.distributed import init_distributed
    from rl8.training.conditions import HitsUpperBound

    torch.set_num_threads(1)

    class SleepyCartPole(CartPole):
        """CartPole whose batched step sleeps 0-4 ms, drawn per step."""

        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            self.rng = random.Random(int(os.environ.get("RANK", "0")))

        def step(self, action):
            time.sleep(self.rng.uniform(0, MAX_STEP_SLEEP_S))
            return super().step(action)

    actors = 2 if mode == "actors" else None
    init_distributed(actors=actors)
    # with actors, num_envs is the learner's batch: 2 actors x 16 envs
    num_envs = 2 * ENVS_PER_COLLECTOR if actors else ENVS_PER_COLLECTOR
    algo = PPO(
        SleepyCartPole,
        num_envs=num_envs,
        horizon=HORIZON,
        num_sgd_iters=4,
        sgd_minibatch_size=256,
        model_config={"hiddens": (64, 64)},
        device="cpu",
        seed=0,
    )
    trainer = Trainer(
        algo, tracking=False, progress=False, actors=actors, checkpoint_dir=str(out.parent / mode)
    )
    t0 = time.perf_counter()
    stats = trainer.run(stop_conditions=HitsUpperBound("algorithm/steps", UPDATES))
    seconds = time.perf_counter() - t0
    if int(os.environ["RANK"]) == 0:
        out.write_text(
            json.dumps(
                {
                    "env_steps_per_s": stats["env/steps"] / seconds,
                    "policy_lag": stats.get("monitors/policy_lag", 0.0),
                }
            )
        )


if __name__ == "__main__":
    _worker(sys.argv[1], Path(sys.argv[2]))
