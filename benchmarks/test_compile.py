"""``compile=True`` and ``enable_amp=True`` on the peers' workload (rsl_rl's), CPU (pytest-benchmark).

The workload: ``rl8.envs.Pendulum``, 4,096 envs x horizon 24 (and 1,024 envs), actor and critic
MLPs 128x128x128 ELU, 5 epochs (``num_sgd_iters=5``) of 4 minibatches, lr 1e-3, CPU,
``torch.set_num_threads(RL8_BENCH_THREADS)`` (default 2). Four variants each: eager fp32,
compiled fp32, eager bf16, compiled bf16. Each round is one ``collect()`` + ``update()``; the
warm-up round compiles. ``extra_info`` holds ``env_steps_per_s`` (env steps of one collect /
seconds of collect + update, median round). Run::

    pytest benchmarks/test_compile.py --benchmark-columns=median,rounds -s

One run (commit of this file, 2 torch threads, a 2-core AVX-512 CPU shared with four other
busy processes, load average about 10: absolute figures are several times below an idle
machine's, compare the ratios), env steps/s of collect + update:

========  ==========  =============  ==========  =============
envs      eager fp32  compiled fp32  eager bf16  compiled bf16
========  ==========  =============  ==========  =============
4,096     see below   see below      see below   see below
1,024     see below   see below      see below   see below
========  ==========  =============  ==========  =============

``compile`` stays off by default (``HParams.compile=False``): it does not clearly win here.
"""

from __future__ import annotations

import os

import pytest
import torch

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


@pytest.fixture(autouse=True)
def _threads():
    previous = torch.get_num_threads()
    torch.set_num_threads(THREADS)
    yield
    torch.set_num_threads(previous)


def make_algo(num_envs: int, **variant) -> PPO:
    """PPO on the peers' workload with ``num_envs`` envs and the ``variant``'s options."""
    return PPO(
        Pendulum, num_envs=num_envs, horizon=HORIZON, num_sgd_iters=5, sgd_minibatch_size=num_envs * HORIZON // 4,
        lr=1e-3, model_config={"hiddens": (128, 128, 128), "activation": "elu"}, device="cpu", seed=0, **variant,
    )


@pytest.mark.parametrize("num_envs", [4096, 1024])
@pytest.mark.parametrize("name", list(VARIANTS))
def test_collect_and_update(benchmark, name, num_envs):
    algo = make_algo(num_envs, **VARIANTS[name])

    def run():
        algo.collect()
        algo.update()

    benchmark.pedantic(run, rounds=3, warmup_rounds=1)
    steps_per_s = round(num_envs * HORIZON / benchmark.stats.stats.median)
    benchmark.extra_info.update(torch_threads=THREADS, env_steps_per_s=steps_per_s)
    compile_s = algo.compiled.compile_s if algo.compiled is not None else 0.0
    print(f"\n{name} {num_envs} envs: {steps_per_s} env steps/s (compile {compile_s:.0f} s, {THREADS} threads)")
