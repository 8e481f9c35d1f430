"""Throughput of collect_mode="overlap" over "sync" (collect + update per training step).

Overlap pays when a collect and an update take about the same time and the envs step without
holding Python's GIL. Two envs whose every step also sleeps (a simulator that waits on
something: a physics engine, a game server, a robot), each sized so that on the development
machine a sync collect takes about as long as a sync update, where overlap can gain most (at
most 2x):

* ``torch``: rl8's built-in CartPole, 64 envs, sleeping ``TORCH_SLEEP_S`` = 2 ms per step in
  the calling thread; PPO ``horizon=64``, ``num_sgd_iters=16`` over 4 minibatches of 1024
  transitions (64 optimizer steps of the default MLP).
* ``gymnasium-async``: issue 26's workload: 32 ``Sleepy`` envs (gymnasium's CartPole-v1
  sleeping 0-4 ms at random per step, ``rates.Sleepy``) in worker processes through the
  async adapter (``vectorization_mode="async"``; the main process waits on pipes),
  ``horizon=64``; a 256x256 MLP (``model_config={"hiddens": (256, 256)}``),
  ``num_sgd_iters=10`` over minibatches of 256 (80 optimizer steps). On a quiet machine its
  update takes about half its collect (about 220 and 440 ms), so overlap can gain at most
  about 1.5x.

torch runs with ONE intra-op thread (``torch.set_num_threads(1)``): the 2-core machine is
shared, the update takes one core and the background rollout the other.

One run per env: ``ROUNDS`` = 6 rounds, each ``STEPS`` = 3 training steps (``collect();
update()``) of a sync PPO and of an overlap PPO (alternating which goes first), after a warm-up
step of each. An overlap round ends by waiting for the rollout its last collect started
(timed), so that a round collects as many rollouts in either mode and no background rollout
runs during the other PPO's round. ``benchmark`` times one more overlap round; the ratio is
the median over the rounds of sync seconds / overlap seconds, printed with the sync collect
and update times and stored in ``benchmark.extra_info["ratio"]``. The machine is noisy, so
only with ``RL8_BENCH_ASSERT=1`` does the test assert ratio >= ``MIN_RATIO`` (1.4 for
``torch``, 1.3 for ``gymnasium-async``: issue 26's target).

Measured on 2 cores (torch 2.13 CPU), shared (load average 5.1 from other jobs), from
``PYTHONPATH=$PWD OMP_NUM_THREADS=1 python -m pytest benchmarks/test_overlap.py -q -p no:cacheprovider -s``,
two runs (per training step):

* ``torch``: 1.70x (sync 403 ms = collect 181 + update 222; overlap 242 ms) and 1.52x (sync
  452 = 187 + 265; overlap 287 ms, of which the update beside the background rollout 284).
* ``gymnasium-async``: 1.05x (sync 896 ms = collect 471 + update 424; overlap 860 ms),
  1.14x (sync 1112 = 635 + 478; overlap 962 ms, of which the update beside the background
  rollout 956: twice the update alone) and, in a third run of this setup alone, 1.05x (sync
  1107 = 658 + 450; overlap 1040, the update beside the rollout 1036). Issue 26 measured 1.18-1.35x on a quieter machine,
  the update slowing from about 220 to 540 ms.

On a quiet machine (nothing else running; 2026-11-26, rl8 ``e002525``), one run: ``torch``
1.76x (sync 476 ms = collect 189 + update 286; overlap 292 ms) and ``gymnasium-async`` 1.39x
(sync 1039 ms = collect 534 + update 505; overlap 763 ms, the update beside the background
rollout 758): issue 26's 1.3x met when the machine has its cores to itself.

Why the update slows beside the rollout (profile of the ``gymnasium-async`` setup, same
machine): the update is CPU-bound (wall 543 ms, CPU 506 ms), and the async collect is not
free of CPU: per collect the learner thread uses 120-165 ms of CPU (forward passes and
gymnasium's pipe traffic) and the 32 env workers 370-580 ms (about 200 us per env step,
nearly all of it process wake-ups: a worker is woken by its command and by the end of its
sleep; see ``test_pool.py``). So a training step needs about 1.2 core-seconds; on 2 cores
shared with other jobs the update gets a share of a core, not a core. The GIL is not what
costs: the update beside a thread that only releases and takes the GIL 5,000 times a second
(``time.sleep(0.0002)`` in a loop, with or without some Python between) took 455 ms, alone
377 ms, beside the real background rollout 824 ms (medians of 3, one run). Shortening
Python's switch interval (``sys.setswitchinterval(0.0005)``) left the overlapped step at
901 ms against 919 ms. The rollout thread's own torch threads are not it either (one
intra-op thread here); and ``torch.set_num_threads`` cannot give the background thread fewer
threads than the learner reliably: called in the rollout thread its effect on the learner
depends on the threading backend and on what ran before (a bare check left the main
thread's count at 2; with two PPOs running, the main thread read 1 afterwards), so no such
change was made. Overlap
reaches its ideal when the machine has a core for the update beside the cores the rollout's
envs and forward passes use.
"""

from __future__ import annotations

import os
import statistics
import time

import pytest
from rates import Sleepy

from rl8 import PPO
from rl8.envs import CartPole

TORCH_SLEEP_S = 0.002
STEPS = 3
ROUNDS = 6
MIN_RATIO = {"torch": 1.4, "gymnasium-async": 1.3}
SETUPS = {
    "torch": dict(num_envs=64, horizon=64, sgd_minibatch_size=1024, num_sgd_iters=16),
    # the workload: 32 async envs sleeping 0-4 ms; a 256x256 MLP, 10 epochs of minibatches of 256
    "gymnasium-async": dict(
        num_envs=32,
        horizon=64,
        sgd_minibatch_size=256,
        num_sgd_iters=10,
        model_config={"hiddens": (256, 256)},
        env_kwargs={"vectorization_mode": "async"},
    ),
}


class SleepyCartPole(CartPole):
    """rl8's CartPole; every step also sleeps ``TORCH_SLEEP_S`` (releasing the GIL)."""

    def step(self, action):
        time.sleep(TORCH_SLEEP_S)
        return super().step(action)


pytestmark = pytest.mark.torch_threads(1)


def train(algo: PPO, steps: int, parts: list[float] | None = None) -> float:
    """Seconds of ``steps`` training steps (``parts``: adds the collects' and the updates'
    seconds). An overlap PPO then waits for the rollout its last collect started (``close``),
    timed: a round collects ``steps`` rollouts in either mode, and no rollout runs between
    rounds (where it would slow the other PPO's round down)."""
    start = time.perf_counter()
    for _ in range(steps):
        t0 = time.perf_counter()
        algo.collect()
        t1 = time.perf_counter()
        algo.update()
        if parts is not None:
            parts[0] += t1 - t0
            parts[1] += time.perf_counter() - t1
    algo.close()
    return time.perf_counter() - start


@pytest.mark.parametrize("setup", list(SETUPS))
def test_overlap_throughput(benchmark, setup):
    env = SleepyCartPole if setup == "torch" else Sleepy
    sync = PPO(env, seed=0, **SETUPS[setup])
    overlap = PPO(env, seed=0, collect_mode="overlap", **SETUPS[setup])
    try:
        train(sync, 1), train(overlap, 1)  # warm-up (the first overlap collect runs in the foreground)
        sync_s, overlap_s = [], []
        sync_parts = [0.0, 0.0]  # seconds of the sync collects, of the sync updates
        overlap_parts = [0.0, 0.0]  # seconds of the overlap collects (waits), of its updates
        for i in range(ROUNDS):
            if i % 2:
                overlap_s.append(train(overlap, STEPS, overlap_parts))
                sync_s.append(train(sync, STEPS, sync_parts))
            else:
                sync_s.append(train(sync, STEPS, sync_parts))
                overlap_s.append(train(overlap, STEPS, overlap_parts))
        benchmark.pedantic(train, args=(overlap, STEPS), rounds=1, iterations=1)
    finally:
        overlap.close()
        sync.env.close(), overlap.env.close()
    ratio = statistics.median(s / o for s, o in zip(sync_s, overlap_s))
    benchmark.extra_info["ratio"] = ratio
    ms = 1000.0 / (ROUNDS * STEPS)  # per training step
    print(
        f"\n{setup}: overlap/sync throughput {ratio:.2f}x (median of {ROUNDS} rounds; per training step: "
        f"sync {sum(sync_s) * ms:.0f} ms = collect {sync_parts[0] * ms:.0f} + update {sync_parts[1] * ms:.0f}; "
        f"overlap {sum(overlap_s) * ms:.0f} ms = collect {overlap_parts[0] * ms:.0f} + update (beside the "
        f"background rollout) {overlap_parts[1] * ms:.0f} + the last rollout's wait)"
    )
    benchmark.extra_info["sync_ms"] = [part * ms for part in sync_parts]
    benchmark.extra_info["overlap_ms"] = [part * ms for part in overlap_parts]
    if os.environ.get("RL8_BENCH_ASSERT") == "1":
        assert ratio >= MIN_RATIO[setup]
