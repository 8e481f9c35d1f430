"""``compile=True`` and ``enable_amp=True`` on the peers' workload (rsl_rl's), CPU (pytest-benchmark).

The workload: ``rl8.envs.Pendulum``, 4,096 envs x horizon 24 (and 1,024 envs), actor and critic
MLPs 128x128x128 ELU, 5 epochs (``num_sgd_iters=5``) of 4 minibatches, lr 1e-3, CPU,
``torch.set_num_threads(RL8_BENCH_THREADS)`` (default 2). Four variants each: eager fp32,
compiled fp32, eager bf16, compiled bf16, taking turns round by round. Each round is one
``collect()`` + ``update()``; the warm-up round compiles. ``extra_info`` holds
``env_steps_per_s`` per variant (env steps of one collect / seconds of collect + update, median
of 3 rounds). Run::

    pytest benchmarks/test_compile.py --benchmark-columns=median,rounds -s

One run (2 torch threads, a 2-core AVX-512 CPU shared with other busy processes, load average
3 to 10 during the run: the absolute figures are far below an idle machine's, about 42-49k fp32
and 96k bf16 at 4,096 envs per issue 26, and swing with the load; compare within a row),
env steps/s of collect + update, median of 3 interleaved rounds:

========  ==========  =============  ==========  =============
envs      eager fp32  compiled fp32  eager bf16  compiled bf16
========  ==========  =============  ==========  =============
4,096     7,686       12,509         50,440      73,735
1,024     2,588       3,778          2,756       6,191
========  ==========  =============  ==========  =============

Compiled beat eager in each of the four pairs (1.5x-2.3x) but the load makes the ratios
unreliable, and compiling costs tens of seconds per process (less with a warm
``TORCHINDUCTOR_CACHE_DIR``): ``compile`` stays off by default (``HParams.compile=False``) until
a run on an idle machine confirms it. On a loaded machine the whole file runs about 5 minutes.
"""

from __future__ import annotations

import os
import statistics
import time

import pytest

from rl8 import PPO
from rl8.envs import Pendulum

THREADS = int(os.environ.get("RL8_BENCH_THREADS", "2"))
HORIZON = 24
VARIANTS = {
    "eager-fp32": dict(compile=False, enable_amp=False),
    "compiled-fp32": dict(compile=True, enable_amp=False),
    "eager-bf16": dict(compile=False, enable_amp=True),
    "compiled-bf16": dict(compile=True, enable_amp=True),
}


pytestmark = pytest.mark.torch_threads(THREADS)


def make_algo(num_envs: int, **variant) -> PPO:
    """PPO on the peers' workload with ``num_envs`` envs and the ``variant``'s options."""
    return PPO(
        Pendulum,
        num_envs=num_envs,
        horizon=HORIZON,
        num_sgd_iters=5,
        sgd_minibatch_size=num_envs * HORIZON // 4,
        lr=1e-3,
        model_config={"hiddens": (128, 128, 128), "activation": "elu"},
        device="cpu",
        seed=0,
        **variant,
    )


def _interleaved(num_envs: int, rounds: int) -> dict[str, float]:
    """Median seconds of one collect + update of each variant, the variants taking turns round by
    round (a noisy stretch of a shared machine falls on all of them); the warm-up round compiles."""
    algos = {name: make_algo(num_envs, **variant) for name, variant in VARIANTS.items()}
    times: dict[str, list[float]] = {name: [] for name in algos}
    for r in range(rounds + 1):
        for name, algo in algos.items():
            start = time.perf_counter()
            algo.collect()
            algo.update()
            if r > 0:
                times[name].append(time.perf_counter() - start)
    return {name: statistics.median(t) for name, t in times.items()}


@pytest.mark.parametrize("num_envs", [4096, 1024])
def test_collect_and_update(benchmark, num_envs):
    seconds = benchmark.pedantic(_interleaved, args=(num_envs, 3), rounds=1, iterations=1)
    steps_per_s = {name: round(num_envs * HORIZON / s) for name, s in seconds.items()}
    benchmark.extra_info.update(torch_threads=THREADS, env_steps_per_s=steps_per_s)
    print(f"\n{num_envs} envs, {THREADS} threads, env steps/s of collect + update: {steps_per_s}")


# ------------------------------------------------- the rollout step on CPU: compiled or plain
#: (env, envs, horizon, model) of the rollout-step comparison: a few gymnasium envs stepping in
#: Python (the peers' CartPole-v1 workload) and the batched torch Pendulum (the peers' workload
#: above) at 8, 64 and 4,096 envs.
ROLLOUT_CASES = {
    "CartPole-v1 x8": ("CartPole-v1", 8, 128, {"hiddens": (64, 64), "activation": "tanh"}),
    "Pendulum x8": (Pendulum, 8, HORIZON, {"hiddens": (128, 128, 128), "activation": "elu"}),
    "Pendulum x64": (Pendulum, 64, HORIZON, {"hiddens": (128, 128, 128), "activation": "elu"}),
    "Pendulum x4096": (Pendulum, 4096, HORIZON, {"hiddens": (128, 128, 128), "activation": "elu"}),
}


def _collect_seconds(case: str, rounds: int) -> dict[str, float]:
    """Median seconds of one ``collect()`` with the compiled and with the plain rollout step
    (``CompiledSteps.cpu_rollout_min_envs`` set to 1 or past the env count), taking turns."""
    env, num_envs, horizon, model = ROLLOUT_CASES[case]
    algos = {}
    for kind, min_envs in (("compiled", 1), ("plain", num_envs + 1)):
        algo = PPO(
            env,
            num_envs=num_envs,
            horizon=horizon,
            model_config=model,
            device="cpu",
            seed=0,
            compile=True,
        )
        algo.compiled.cpu_rollout_min_envs = min_envs
        algo.collect()  # compiles (or not)
        algos[kind] = algo
    times: dict[str, list[float]] = {kind: [] for kind in algos}
    for _ in range(rounds):
        for kind, algo in algos.items():
            start = time.perf_counter()
            algo.collect()
            times[kind].append(time.perf_counter() - start)
    return {kind: statistics.median(t) for kind, t in times.items()}


@pytest.mark.parametrize("case", list(ROLLOUT_CASES))
def test_rollout_step_compiled_or_plain(benchmark, case):
    """The rule of ``rl8.ppo.compiled.CPU_COMPILED_ROLLOUT_MIN_ENVS``: where the compiled rollout
    step pays on CPU. ``extra_info``: ms per collect of each and compiled / plain."""
    seconds = benchmark.pedantic(_collect_seconds, args=(case, 7), rounds=1, iterations=1)
    ms = {kind: round(1000 * s, 2) for kind, s in seconds.items()}
    benchmark.extra_info.update(
        torch_threads=THREADS,
        collect_ms=ms,
        compiled_over_plain=round(seconds["compiled"] / seconds["plain"], 3),
    )
    print(
        f"\n{case}, {THREADS} threads, ms per collect: {ms}, compiled / plain "
        f"{seconds['compiled'] / seconds['plain']:.2f}"
    )
