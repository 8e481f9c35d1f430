"""The recurrent path: throughput of a large LSTM run, and the Memory task's speed and learning.

* ``test_lstm_collect``, ``test_lstm_collect_and_step``: DiscreteDummyEnv, 2048 envs, horizon
  32; LSTM with 128 hidden units after a 64-wide encoder, sequences of 8 steps, minibatches of
  16384 transitions, 4 SGD passes.
* ``test_memory_collect_and_update[LSTMModel|GRUModel]``: ``Memory(delay=8, num_cues=4)`` at
  the hyper-parameters of ``tests/test_recurrent_ppo.py`` (64 envs x 16 steps, sequences of
  8, hidden 32 after a 32-wide encoder); ``extra_info["env_steps_per_s"]``.
* ``test_lstm_env_steps_to_solve_memory``: the same LSTM trained from seed 0 until its
  deterministic success rate on 256 fresh episodes, every 5 updates, is >= 0.95;
  ``extra_info["env_steps_to_solve"]`` (61,440 at rl8 cb37871 and since) catches a change that
  makes the same seed learn slower, which a throughput row cannot see.

CPU, fp32, ``torch.set_num_threads(RL8_BENCH_THREADS or 2)``.
Run: ``pytest benchmarks/test_recurrent_throughput.py --benchmark-columns=median,rounds``.
"""

from __future__ import annotations

import os

import pytest

from rl8 import PPO
from rl8.envs import DiscreteDummyEnv, Memory
from rl8.policies.recurrent import GRUModel, LSTMModel

THREADS = int(os.environ.get("RL8_BENCH_THREADS", "2"))
NUM_ENVS, HORIZON = 2048, 32
MEMORY = {"delay": 8, "num_cues": 4}
SOLVE_BUDGET = 120_000  # env steps, as tests/test_recurrent_ppo.py


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


def make_memory_algo(model_cls: type) -> PPO:
    """PPO on ``Memory(**MEMORY)`` at the hyper-parameters of tests/test_recurrent_ppo.py."""
    return PPO(
        Memory,
        num_envs=64,
        horizon=16,
        seq_len=8,
        sgd_minibatch_size=256,
        num_sgd_iters=4,
        lr=3e-3,
        gamma=0.9,
        normalize_rewards=False,
        model_cls=model_cls,
        model_config={"hidden_size": 32, "encoder_hiddens": (32,)},
        env_kwargs=MEMORY,
        device="cpu",
        seed=0,
    )


def _record(benchmark, n: int = NUM_ENVS * HORIZON) -> None:
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


@pytest.mark.parametrize("model_cls", [LSTMModel, GRUModel], ids=lambda cls: cls.__name__)
def test_memory_collect_and_update(benchmark, model_cls):
    algo = make_memory_algo(model_cls)

    def run():
        algo.collect()
        algo.update()

    benchmark.pedantic(run, rounds=20, warmup_rounds=2)
    _record(benchmark, algo.hparams.num_envs * algo.hparams.horizon)


def test_lstm_env_steps_to_solve_memory(benchmark):
    algo = make_memory_algo(LSTMModel)
    eval_env = Memory(256, **MEMORY)
    success = 0.0

    def solve():
        nonlocal success
        while algo.env_steps < SOLVE_BUDGET and success < 0.95:
            algo.collect()
            algo.update()
            if algo.steps % 5 == 0:
                success = algo.evaluate(eval_env, num_steps=4 * (MEMORY["delay"] + 1))[
                    "episodes/return_mean"
                ]

    benchmark.pedantic(solve, rounds=1, iterations=1)
    benchmark.extra_info.update(
        {"torch_threads": THREADS, "env_steps_to_solve": algo.env_steps, "success": success}
    )
    assert success >= 0.95, f"LSTM success {success:.2f} on {MEMORY} after {algo.env_steps} env steps"
