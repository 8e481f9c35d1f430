"""Collect throughput of the worker pool (``vectorization_mode="pool"``) against gymnasium's
sync and async vector envs, and (HalfCheetah) against Stable-Baselines3's SubprocVecEnv.

Run: ``PYTHONPATH=$PWD python -m pytest benchmarks/test_pool.py -q -p no:cacheprovider -s``.

Two envs:

* ``Sleepy``: gymnasium's CartPole-v1 whose every step first sleeps 0-4 ms at random (uniform,
  from the wrapper's own seeded generator): latency without CPU, like a remote simulator or a
  robot. 32 envs, horizon 64; PPO's default MLP. Pool: ``num_workers=32`` (the latency is
  sleeping, not computing, so one env per worker lets every env wait at once; a worker steps
  its envs one after the other), ``min_batch_size`` 4 and 16 (issue 26's settings),
  ``max_wait_s=None``. Async: gymnasium's AsyncVectorEnv, one process per env, the reference.
  (Sync, all 32 envs sleeping in turn in the learner, runs at about 460 env steps/s: left out.)
  Beside the measured ratios the test prints the ratio of a zero-overhead simulation
  (:func:`simulated_ratio`: no forward pass, no messages) and the CPU time per env step of the
  learner and of the env workers (``/proc``), the two things that bound the measured ratio.
* ``HalfCheetah-v5`` (gymnasium[mujoco]): 8 envs, horizon 128, on this machine's cores; pool:
  ``num_workers = cores``, ``min_batch_size = 4``; async: one process per env. Collect and
  collect+update throughput, beside SB3's ``SubprocVecEnv`` (8 processes) running its PPO's
  ``collect_rollouts`` with the same horizon (skipped without mujoco or SB3).

Each test builds every variant, warms each up with one collect, then times ROUNDS rounds in
which every variant collects once, in turn (so that load from other processes hits all
alike); throughput is env steps over the summed time of the variant's rounds. The ratios
printed (and stored in ``benchmark.extra_info``) come from one such run; ``benchmark`` itself
times the pool's collect. torch runs with one intra-op thread (``torch.set_num_threads(1)``):
the envs' processes need the cores. Only with ``RL8_BENCH_ASSERT=1`` does the Sleepy test
assert pool (``min_batch_size=4``) >= 1.5x async (issue 26's target).

Sleepy, from ``PYTHONPATH=$PWD OMP_NUM_THREADS=1 python -m pytest benchmarks/test_pool.py -q
-p no:cacheprovider -s -k variable`` on the development machine (2 cores, shared: load
average 4.8-5.1 from other jobs), collect, env steps/s:

====================  ======  ======  =======
run                   async   pool 4  pool 16
====================  ======  ======  =======
1                     4324    4708    5165
2                     4456    4773    4194
3                     3422    4177    3621
ratio to async, 1               1.09x   1.19x
ratio to async, 2               1.07x   0.94x
ratio to async, 3               1.22x   1.06x
zero-overhead sim.              1.58x   1.28x
====================  ======  ======  =======

CPU per env step: async: learner 64-69 us + workers 214-264 us; pool 4: 98 + 210-217;
pool 16: 89-90 + 193-212 (runs 2 and 3). Earlier runs on a quieter machine (issue 26) gave pool 4 1.30-1.62x and pool 16
1.46x against async. On a quiet machine (nothing else running; 2026-11-26, rl8 ``e002525``),
three runs of ``-k variable``: pool 4/async 1.46x, 1.34x and 1.36x (async 4848 and pool 4 7071
env steps/s in the first), pool 16/async 1.23x, 1.21x and 1.26x; the zero-overhead simulation
1.58x and 1.28x; CPU per env step: async learner 55 us + workers 199 us, pool 4 99 + 145,
pool 16 74 + 154. Issue 26's 1.5x is missed here too, by 3-11%: the simulated ceiling at
horizon 64 is 1.58x.

Why not 1.5x here. The target assumes the collect is bound by the envs' latency: with zero
overhead the lock-step loop waits for the slowest of 32 sleeps per step (about 3.9 ms, 250 ms
a collect) and the pool at ``min_batch_size=4`` for much less (about 160 ms), so 1.58x at
horizon 64 (1.75x at horizon 512: near the end of a collect fast envs wait for the slow
ones; issue 26's 1.85x is the steady state). On this machine both modes are instead bound by
CPU: every env step costs about 300 us of CPU (2048 steps: 0.6 core-seconds a collect, while
the zero-overhead pool collect lasts 0.16 s), nearly all of it process wake-ups, not Python:
a worker is woken twice per step (its command on the pipe, the end of its sleep; the same for
gymnasium's async workers), the learner once per batch, and one wake-up costs 50-70 us of CPU
here (``time.sleep(0)`` alone measures 67 us on this VM under load), against 13 us for the
worker's whole Python step (``_step_env`` with CartPole, measured in-process). Both modes pay
the same wake-ups per env step, so when the CPU, not the latency, is what runs out, their
ratio falls towards their CPU ratio, about 1.1x, whatever ``min_batch_size``. And the
learner's own cycle is slow enough that ``min_batch_size=4`` rarely binds: its CPU per
collect, split by ``time.thread_time`` around the pool's ``recv`` and ``send`` and the
policy's ``rollout_step`` (5 collects), was 255 ms in 132 batches of 15.5 envs on average
(16: 242 ms, 107 batches of 19.1): per env step ``recv`` 36 us (the workers' reports read
from the pipes, the outputs gathered from shared memory into tensors), ``send`` 31 us (the
actions written to shared memory, one pipe write per worker, each waking it), the forward
pass 22 us, the rest of ``rollout_ready_envs`` (sampling, the buffer's indexed writes) 36 us. Two changes to
the learner's side were measured in one run against the code before them and dropped for no
gain: reading the workers' pipes raw (``os.read`` of several reports at once instead of
``Connection.recv_bytes``, two system calls and a few Python calls fewer per env step) with
one ``os.write`` per step command (learner CPU 819 ms before, 823 ms after, over the same 5
collects; pool 4/async 1.14x before, 1.28x after, within the noise of the load), and
``SCHED_BATCH`` for the workers so that a woken worker does not preempt the learner (pool
4/async 1.13x -> 0.93x, pool 16 1.14x -> 0.84x: the workers' steps start later). The pool
pays off most when its envs' latency, not the machine's CPU, bounds the collect: more cores
than busy processes.

HalfCheetah-v5, from an earlier run of all benchmark files (quiet machine):
8 envs, horizon 128, 2 cores, collect (env steps/s): sync 13328, async 7394,
pool 10095, SB3 SubprocVecEnv 7232 (pool/SB3 1.40x, async/SB3 1.02x, sync/SB3 1.84x).
Collect + update: sync 12747, async 5654, pool 8759 (pool/async 1.55x). With 2 cores a
MuJoCo step is too cheap for processes to pay off; sync wins.
"""

from __future__ import annotations

import os
import time

import numpy as np
import pytest
import rates
from rates import SLEEP_S, Sleepy, report, sb3_collect

from rl8 import PPO

ROUNDS = 3
MIN_POOL_OVER_ASYNC = 1.5


def simulated_ratio(
    num_envs: int, horizon: int, min_batch_size: int, rounds: int = 20, seed: int = 0
) -> float:
    """The pool's collect throughput over a lock-step loop's (async) with zero overhead: no
    forward pass, no messages, one env per worker, each step lasting uniform(0, ``SLEEP_S``).
    The lock-step loop's step lasts the slowest env's; the pool acts as soon as
    ``min_batch_size`` envs (or all that are still stepping) are ready, and an env that made
    ``horizon`` steps stops, as in ``rollout_ready_envs``. The ceiling the measured ratio
    approaches as the learner's and the workers' overheads shrink."""
    rng = np.random.default_rng(seed)
    lock_step = pool = 0.0
    for _ in range(rounds):
        lock_step += rng.uniform(0, SLEEP_S, (horizon, num_envs)).max(1).sum()
        steps = np.zeros(num_envs, dtype=int)
        ready_at = rng.uniform(0, SLEEP_S, num_envs)  # all act at time 0
        now = 0.0
        while True:
            going = np.flatnonzero(steps < horizon)
            if going.size == 0:
                break
            need = min(min_batch_size, going.size)
            now = max(now, np.sort(ready_at[going])[need - 1])
            taken = going[ready_at[going] <= now]
            steps[taken] += 1
            again = taken[steps[taken] < horizon]
            ready_at[taken] = np.inf
            ready_at[again] = now + rng.uniform(0, SLEEP_S, again.size)
        pool += now
    return lock_step / pool


pytestmark = pytest.mark.torch_threads(1)


def measure(variants: dict, step, rounds: int = ROUNDS) -> dict[str, float]:
    """:func:`rates.measure` with this file's number of rounds."""
    return rates.measure(variants, step, rounds)


def make_ppo(env, mode: str, num_envs: int, horizon: int, **pool) -> PPO:
    env_kwargs = {"vectorization_mode": mode, **(pool if mode == "pool" else {})}
    return PPO(
        env,
        num_envs=num_envs,
        horizon=horizon,
        seed=0,
        env_kwargs=env_kwargs,
        sgd_minibatch_size=num_envs * horizon // 4,
        num_sgd_iters=2,
    )


def collect(algo: PPO) -> int:
    algo.collect()
    return algo.hparams.num_envs * algo.hparams.horizon


def collect_update(algo: PPO) -> int:
    algo.collect()
    algo.update()
    return algo.hparams.num_envs * algo.hparams.horizon


def worker_pids(algo: PPO) -> list[int]:
    """The process ids of ``algo``'s env workers (pool or gymnasium async)."""
    env = algo.env
    if hasattr(env, "worker_pids"):
        return list(env.worker_pids)
    return [process.pid for process in env.vector_env.processes]


def cpu_seconds(pids: list[int]) -> float:
    """CPU seconds (user + system) that the processes ``pids`` used so far, from Linux's
    ``/proc`` (0 where it is missing)."""
    total = 0
    for pid in pids:
        try:
            with open(f"/proc/{pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        total += int(fields[11]) + int(fields[12])  # utime, stime (clock ticks)
    return total / os.sysconf("SC_CLK_TCK")


def test_pool_on_an_env_of_variable_latency(benchmark):
    num_envs, horizon = 32, 64
    sizes = (4, 16)
    algos = {"async": make_ppo(Sleepy, "async", num_envs, horizon)}
    for size in sizes:
        algos[f"pool {size}"] = make_ppo(
            Sleepy, "pool", num_envs, horizon, num_workers=num_envs, min_batch_size=size
        )
    names = {id(algo): name for name, algo in algos.items()}
    cpu = {name: [0.0, 0.0, 0] for name in algos}  # learner seconds, workers' seconds, env steps

    def timed_collect(algo: PPO) -> int:
        pids = worker_pids(algo)
        learner, workers = time.process_time(), cpu_seconds(pids)
        steps = collect(algo)
        used = cpu[names[id(algo)]]
        used[0] += time.process_time() - learner
        used[1] += cpu_seconds(pids) - workers
        used[2] += steps
        return steps

    try:
        rates = measure(algos, timed_collect)
        ratios = report(
            f"Sleepy (CartPole-v1, 0-4 ms per step), {num_envs} envs, horizon {horizon}, collect",
            rates,
            "async",
        )
        simulated = {f"pool {size}/async": simulated_ratio(num_envs, horizon, size) for size in sizes}
        for name, ratio in simulated.items():
            print(f"  {name:>24}: {ratio:.2f}x with zero overhead (simulated)")
        per_step = {
            name: (1e6 * learner / steps, 1e6 * workers / steps)
            for name, (learner, workers, steps) in cpu.items()
        }
        for name, (learner, workers) in per_step.items():
            print(f"  {name:>24}: CPU per env step: learner {learner:.0f} us, workers {workers:.0f} us")
        benchmark.extra_info.update(
            rates=rates, ratios=ratios, simulated=simulated, cpu_us_per_step=per_step
        )
        benchmark.pedantic(collect, args=(algos["pool 4"],), rounds=2, iterations=1)
        if os.environ.get("RL8_BENCH_ASSERT") == "1":
            assert ratios["pool 4/async"] >= MIN_POOL_OVER_ASYNC
    finally:
        for algo in algos.values():
            algo.env.close()


def sb3_collector(num_envs: int, horizon: int):
    """SB3's PPO on a SubprocVecEnv of HalfCheetah-v5: a function that collects one rollout
    (``collect_rollouts``) and returns its env steps, and the vec env to close."""
    from stable_baselines3 import PPO as SB3PPO
    from stable_baselines3.common.env_util import make_vec_env
    from stable_baselines3.common.vec_env import SubprocVecEnv

    venv = make_vec_env("HalfCheetah-v5", n_envs=num_envs, seed=0, vec_env_cls=SubprocVecEnv)
    model = SB3PPO(
        "MlpPolicy",
        venv,
        n_steps=horizon,
        batch_size=num_envs * horizon // 4,
        n_epochs=2,
        device="cpu",
        seed=0,
    )
    return sb3_collect(model, num_envs, horizon), venv


def test_pool_on_halfcheetah(benchmark):
    pytest.importorskip("mujoco")
    pytest.importorskip("stable_baselines3")
    num_envs, horizon = 8, 128
    cores = os.cpu_count() or 1
    pool_kwargs = {"num_workers": min(cores, num_envs), "min_batch_size": num_envs // 2}
    algos = {
        mode: make_ppo("HalfCheetah-v5", mode, num_envs, horizon, **pool_kwargs)
        for mode in ("sync", "async", "pool")
    }
    sb3_step, venv = sb3_collector(num_envs, horizon)
    try:
        rates = measure(
            {**algos, "sb3 SubprocVecEnv": None},
            lambda algo: sb3_step(algo) if algo is None else collect(algo),
        )
        ratios = report(
            f"HalfCheetah-v5, {num_envs} envs, horizon {horizon}, collect ({cores} cores)",
            rates,
            "sb3 SubprocVecEnv",
        )
        updated = measure(algos, collect_update)
        update_ratios = report(
            f"HalfCheetah-v5, {num_envs} envs, horizon {horizon}, collect + update", updated, "async"
        )
        benchmark.extra_info.update(
            collect=rates,
            ratios=ratios,
            collect_update=updated,
            update_ratios=update_ratios,
            pool=pool_kwargs,
        )
        benchmark.pedantic(collect, args=(algos["pool"],), rounds=2, iterations=1)
    finally:
        venv.close()
        for algo in algos.values():
            algo.env.close()
