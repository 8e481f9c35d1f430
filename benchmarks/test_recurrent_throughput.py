"""Throughput of the recurrent (LSTM) path: DiscreteDummyEnv, 2048 envs, horizon 32.

LSTM with 128 hidden units after a 64-wide encoder, sequences of 8 steps, minibatches of
16384 transitions, 4 SGD passes, CPU, fp32, ``torch.set_num_threads(RL8_BENCH_THREADS or 2)``.
Run: ``pytest benchmarks/test_recurrent_throughput.py --benchmark-columns=median,rounds``.
"""

from __future__ import annotations

import os

import pytest

from rl8 import PPO
from rl8.envs import DiscreteDummyEnv
from rl8.policies.recurrent import LSTMModel

THREADS = int(os.environ.get("RL8_BENCH_THREADS", "2"))
NUM_ENVS, HORIZON = 2048, 32


pytestmark = pytest.mark.torch_threads(THREADS)


def make_algo() -> PPO:
    return PPO(
        DiscreteDummyEnv,
        num_envs=NUM_ENVS,
        horizon=HORIZON,
        seq_len=8,
        sgd_minibatch_size=16384,
        num_sgd_iters=4,
        model_cls=LSTMModel,
        model_config={"hidden_size": 128, "encoder_hiddens": (64,)},
        device="cpu",
        seed=0,
    )


def _record(benchmark) -> None:
    n = NUM_ENVS * HORIZON
    benchmark.extra_info.update({"torch_threads": THREADS, "transitions_per_round": n})
    stats = getattr(benchmark, "stats", None)
    if stats is not None and getattr(stats, "stats", None) is not None:
        benchmark.extra_info["transitions_per_s"] = round(n / stats.stats.median)


def test_lstm_collect(benchmark):
    algo = make_algo()
    algo.collect()
    benchmark.pedantic(algo.collect, rounds=5, warmup_rounds=1)
    _record(benchmark)


def test_lstm_collect_and_step(benchmark):
    algo = make_algo()

    def run():
        algo.collect()
        algo.update()

    benchmark.pedantic(run, rounds=3, warmup_rounds=1)
    _record(benchmark)
