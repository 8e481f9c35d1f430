"""Per-update cost of data-parallel training: 2 ranks x N/2 envs against 1 rank x N envs.

Workload: DiscreteDummyEnv, N = 1024 envs in all, horizon 32, 64x64 MLPs (tanh), 4 SGD
passes over minibatches of 4096 transitions in all (2048 per rank with 2 ranks), i.e. the
same algorithm and the same number of optimizer steps (32 per update) either way. CPU, gloo,
**one torch thread per rank** (``torch.set_num_threads(1)`` in each process), so 2 ranks use
2 cores and 1 rank uses 1.

* ``test_update[1 rank]``: ``PPO.update()`` on 1024 envs in this process.
* ``test_update[2 ranks]``: ``PPO.update()`` on 512 envs in this process (rank 0) while a helper
  process (rank 1, same workload) runs the same rounds in lockstep; the time is rank 0's.
* ``test_gradient_all_reduce``: ONE ``DistContext.average_gradients`` (the one all-reduce of
  the flattened gradients per optimizer step) between the same 2 processes.

``extra_info`` holds the figures: parameters all-reduced, bytes, all-reduces per update, and
for 2 ranks the estimated share of the update spent in gradient all-reduces. Run::

    pytest benchmarks/test_distributed.py --benchmark-columns=median,min,rounds -s

The ranks' collectives go over localhost TCP (gloo); across machines add the network's
latency to every all-reduce.

Figures of one run on the CI machine (2 shared AMD EPYC cores, other jobs running, load
average 1.5-3; one torch thread per rank):

* one ``average_gradients`` (2 ranks, 35 KB): median 0.39-0.56 ms (min 0.15-0.24 ms); 32 per
  update: 12-18 ms, 5-7% of a 1-rank update;
* ``PPO.update()``: 1 rank x 1024 envs 252-280 ms; 1 rank x 512 envs (one rank's compute,
  in one process) 133 ms; 2 ranks x 512 envs 221-250 ms (rank 0's time), of which 79-95 ms
  inside the gradient all-reduces (mostly waiting for rank 1) and 9-10 ms inside the other
  all-reduces (stats, advantage moments). 2 ranks were 1.0-1.3x faster than 1: on 2 shared
  cores the ranks rarely run at the same time.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest
import torch
from launch import free_port

N_ENVS = 1024
HORIZON = 32
NUM_SGD_ITERS = 4
GLOBAL_MINIBATCH = 4096
ROUNDS = 10
WARMUP = 1
ALL_REDUCE_ROUNDS = 200

pytestmark = pytest.mark.torch_threads(1)


def make_algo(num_envs: int, minibatch: int):
    from rl8 import PPO
    from rl8.envs import DiscreteDummyEnv

    return PPO(
        DiscreteDummyEnv,
        num_envs=num_envs,
        horizon=HORIZON,
        sgd_minibatch_size=minibatch,
        num_sgd_iters=NUM_SGD_ITERS,
        model_config={"hiddens": (64, 64)},
        device="cpu",
        seed=0,
    )


@pytest.fixture
def two_ranks(monkeypatch):
    """This process as rank 0 of a gloo group of 2; ``start(task)`` launches rank 1."""
    from rl8.ppo.distributed import init_distributed, shutdown_distributed

    port = free_port()
    env = {
        "WORLD_SIZE": "2",
        "LOCAL_WORLD_SIZE": "2",
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(port),
    }
    for key, value in {**env, "RANK": "0", "LOCAL_RANK": "0"}.items():
        monkeypatch.setenv(key, value)
    helpers: list[subprocess.Popen] = []

    def start(task: str) -> None:
        helper_env = {**os.environ, **env, "RANK": "1", "LOCAL_RANK": "1", "OMP_NUM_THREADS": "1"}
        helpers.append(subprocess.Popen([sys.executable, __file__, task], env=helper_env))
        assert init_distributed(timeout_s=60)

    yield start
    try:
        for helper in helpers:
            assert helper.wait(timeout=120) == 0
    finally:
        for helper in helpers:
            if helper.poll() is None:
                helper.kill()
        shutdown_distributed()


def _update_info(algo, world_size: int) -> dict:
    params = [p for p in algo.policy.parameters() if p.requires_grad]
    numel = sum(p.numel() for p in params)
    per_update = NUM_SGD_ITERS * (algo.hparams.batch_size // algo.hparams.minibatch_size)
    return {
        "ranks": world_size,
        "envs_per_rank": algo.hparams.num_envs,
        "envs_total": N_ENVS,
        "horizon": HORIZON,
        "threads_per_rank": torch.get_num_threads(),
        "params": numel,
        "all_reduce_bytes": 4 * numel,
        "gradient_all_reduces_per_update": per_update,
    }


@pytest.mark.parametrize("ranks", [1, 2], ids=["1 rank", "2 ranks"])
def test_update(benchmark, request, ranks):
    if ranks == 1:
        algo = make_algo(N_ENVS, GLOBAL_MINIBATCH)
    else:
        request.getfixturevalue("two_ranks")("update")
        algo = make_algo(N_ENVS // 2, GLOBAL_MINIBATCH // 2)
    algo.collect()
    benchmark.extra_info.update(_update_info(algo, ranks))
    spent = _time_collectives(algo)
    benchmark.pedantic(algo.update, rounds=ROUNDS, warmup_rounds=WARMUP, iterations=1)
    benchmark.extra_info["update_ms_median"] = 1000 * benchmark.stats.stats.median
    if ranks > 1:  # time inside the collectives on rank 0, waiting for rank 1 included
        for name, seconds in spent.items():
            benchmark.extra_info[f"{name}_ms_per_update"] = 1000 * seconds / (ROUNDS + WARMUP)


def _time_collectives(algo) -> dict[str, float]:
    """Wrap the algorithm's gradient all-reduce and its other all-reduces with timers."""
    spent = {"gradient_all_reduce": 0.0, "other_all_reduce": 0.0}
    ctx = algo.dist

    def timed(name, fn):
        def wrapper(*args, **kwargs):
            t0 = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                spent[name] += time.perf_counter() - t0

        return wrapper

    ctx.average_gradients = timed("gradient_all_reduce", ctx.average_gradients)
    ctx.all_reduce_ = timed("other_all_reduce", ctx.all_reduce_)
    return spent


def test_gradient_all_reduce(benchmark, two_ranks):
    two_ranks("all_reduce")
    algo, params = _grads_ready()
    info = _update_info(algo, 2)
    benchmark.extra_info.update(info)
    benchmark.pedantic(
        algo.dist.average_gradients,
        args=(params,),
        rounds=ALL_REDUCE_ROUNDS,
        warmup_rounds=10,
        iterations=1,
    )
    median = benchmark.stats.stats.median
    benchmark.extra_info["all_reduce_us_median"] = 1e6 * median
    benchmark.extra_info["all_reduce_ms_per_update"] = (
        1000 * median * info["gradient_all_reduces_per_update"]
    )


def _grads_ready():
    """A 2-rank PPO (512 envs) with gradients to average."""
    algo = make_algo(N_ENVS // 2, GLOBAL_MINIBATCH // 2)
    params = [p for p in algo.policy.parameters() if p.requires_grad]
    for p in params:
        p.grad = torch.randn_like(p)
    return algo, params


# --------------------------------------------------------------------------------------------
# rank 1 (run by the fixture: python benchmarks/test_distributed.py TASK)


def _helper(task: str) -> None:
    torch.set_num_threads(1)
    from rl8.ppo.distributed import init_distributed

    assert init_distributed(timeout_s=60)
    if task == "update":
        algo = make_algo(N_ENVS // 2, GLOBAL_MINIBATCH // 2)
        algo.collect()
        for _ in range(WARMUP + ROUNDS):
            algo.update()
    else:
        algo, params = _grads_ready()
        for _ in range(10 + ALL_REDUCE_ROUNDS):
            algo.dist.average_gradients(params)


if __name__ == "__main__":
    _helper(sys.argv[1])
