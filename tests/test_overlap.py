"""collect_mode="overlap": the next rollout runs in a background thread while PPO updates.

Each batch is collected with weights one update old (``monitors/policy_lag``), checkpoints
include the rollout in flight, errors in the background surface at the next collect, and no
thread outlives ``close()``.
"""

from __future__ import annotations

import copy
import os
import signal
import subprocess
import sys
import threading
import traceback
from pathlib import Path

import pytest
import torch
from gymnasium import spaces
from launch import free_port
from tensordict import TensorDict

from rl8 import PPO, Env, HParams, Trainer
from rl8.envs import CartPole, GymnasiumEnv, Pendulum
from rl8.policies.recurrent import GRUModel
from rl8.ppo.collectors import SyncCollector
from rl8.ppo.overlap import OverlapCollector
from rl8.training.conditions import Condition, HitsUpperBound

pytestmark = pytest.mark.usefixtures("one_torch_thread")

OVERLAP = dict(
    num_envs=16, horizon=8, sgd_minibatch_size=32, num_sgd_iters=2, seed=0, collect_mode="overlap"
)


def collector_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == "rl8-overlap-collector"]


@pytest.fixture(autouse=True)
def no_thread_left():
    yield
    assert collector_threads() == []


def train(algo: PPO, updates: int) -> list[dict[str, float]]:
    out = []
    for _ in range(updates):
        algo.collect()
        out.append(algo.update())
    return out


def reference(updates: int) -> list[dict[str, float]]:
    """The stats of ``updates`` updates of a fresh overlapped PPO, closed after (no thread left)."""
    algo = PPO(CartPole, **OVERLAP)
    try:
        return train(algo, updates)
    finally:
        algo.close()


def test_invalid_collect_mode_names_the_field_the_values_and_the_given_one():
    with pytest.raises(
        ValueError, match=r"hparam collect_mode: expected 'sync' or 'overlap', got 'async'"
    ):
        HParams(collect_mode="async")
    with pytest.raises(ValueError, match=r"collect_mode.*got None"):
        PPO(CartPole, collect_mode=None)


def test_sync_mode_has_the_sync_collector_and_no_policy_lag():
    algo = PPO(CartPole, **{**OVERLAP, "collect_mode": "sync"})
    assert type(algo.collector) is SyncCollector and algo.collector.carry is algo.carry
    assert type(PPO(CartPole, **OVERLAP).collector) is OverlapCollector
    assert "monitors/policy_lag" not in train(algo, 1)[0]


def test_each_batch_is_collected_with_the_weights_one_update_old():
    """The stored behaviour log-probs are those of the learner's weights (and observation
    normaliser) before the previous update, not the current ones; the lag is 0, then 1."""
    algo = PPO(CartPole, **{**OVERLAP, "lr": 1e-2, "normalize_observations": True})
    reference = copy.deepcopy(algo.policy)
    weights = []  # the learner's state_dict before each update
    lags = []
    for _ in range(4):
        algo.collect()
        weights.append(copy.deepcopy(algo.policy.state_dict()))
        data = algo.buffer.data[:, : algo.hparams.horizon].reshape(-1)
        # the weights that collected this batch: before the previous update (the first: initial)
        reference.load_state_dict(weights[max(len(weights) - 2, 0)])
        with torch.no_grad():
            dist, _ = reference.distribution(data["obs"])
            expected = dist.log_prob(data["actions"])
        torch.testing.assert_close(data["logp"], expected, atol=1e-5, rtol=1e-5)
        if len(weights) > 1:  # the current learner weights would give other log-probs
            reference.load_state_dict(weights[-1])
            with torch.no_grad():
                current, _ = reference.distribution(data["obs"])
            assert (current.log_prob(data["actions"]) - data["logp"]).abs().max() > 1e-3
        lags.append(algo.update()["monitors/policy_lag"])
    assert lags == [0.0, 1.0, 1.0, 1.0]
    algo.close()


def test_overlap_runs_repeat_whatever_the_thread_timing():
    first, second = PPO(CartPole, **OVERLAP), PPO(CartPole, **OVERLAP)
    assert train(first, 4) == train(second, 4)
    first.close(), second.close()  # each has a rollout in flight: wait for it


@pytest.mark.parametrize(
    "env_cls, extra",
    [
        (CartPole, {}),
        (Pendulum, {"normalize_observations": True}),
        (CartPole, {"model_cls": GRUModel, "model_config": {"hidden_size": 8}, "seq_len": 4}),
    ],
    ids=["cartpole", "pendulum", "cartpole-gru"],
)
def test_resume_gives_identical_losses(env_cls, extra):
    """The checkpoint holds the rollout that was in flight; the resumed run hands it over at
    its first collect, as the uninterrupted run does."""
    hparams = {**OVERLAP, **extra}
    reference = PPO(env_cls, **hparams)
    train(reference, 3)
    assert reference.collector.in_flight
    state = copy.deepcopy(reference.state_dict())
    assert state["overlap"]["rollout"] is not None
    expected = train(reference, 3)
    resumed = PPO(env_cls, **{**hparams, "seed": 123})
    resumed.load_state_dict(state)
    assert train(resumed, 3) == expected
    reference.close(), resumed.close()


class BreaksAtStep(Env):
    """Rewards the step count; ``step`` raises at step ``breaks_at`` (counted over all collects)."""

    observation_space = spaces.Box(-1e6, 1e6, (1,))
    action_space = spaces.Discrete(2)

    def __init__(self, num_envs, /, horizon=None, *, device="cpu", breaks_at=20):
        super().__init__(num_envs, horizon, device=device)
        self.breaks_at, self.steps, self.configs = breaks_at, 0, []

    def reset(self, *, config=None, seed=None):
        self.configs.append(config)
        return torch.zeros(self.num_envs, 1)

    def step(self, action):
        self.steps += 1
        if self.steps == self.breaks_at:
            raise RuntimeError("the env broke")
        obs = torch.full((self.num_envs, 1), float(self.steps))
        return TensorDict(
            {"obs": obs, "rewards": torch.ones(self.num_envs, 1)}, batch_size=[self.num_envs]
        )


def test_an_error_in_the_background_rollout_is_raised_by_the_next_collect():
    algo = PPO(BreaksAtStep, **{**OVERLAP, "env_kwargs": {"breaks_at": 12}})  # in the 2nd rollout
    algo.collect()
    assert algo.collector.in_flight  # the second rollout runs while the first is trained on
    algo.update()
    with pytest.raises(RuntimeError, match="the env broke") as info:
        algo.collect()
    frames = [frame.name for frame in traceback.extract_tb(info.value.__traceback__)]
    assert "step" in frames and "rollout" in frames  # the background thread's traceback
    assert algo.collects == 1 and algo.env_steps == 16 * 8
    algo.close()
    assert collector_threads() == []


def test_close_joins_the_thread_and_keeps_the_finished_rollout():
    algo = PPO(CartPole, **OVERLAP)
    expected = reference(3)
    got = train(algo, 2)
    algo.close()
    assert collector_threads() == [] and algo.collector.ready
    algo.close()  # idempotent
    got += train(algo, 1)  # the kept rollout is handed over: nothing lost
    assert got == expected
    algo.close()


def test_resets_wait_for_the_rollout_and_the_envs_reset_on_the_collects_env_config():
    """With horizons_per_env_reset=k no rollout is started ahead across a reset: the collect
    that resets gets its own env_config; a manual reset drops the rollout in flight."""
    algo = PPO(
        BreaksAtStep, **{**OVERLAP, "horizons_per_env_reset": 2, "env_kwargs": {"breaks_at": 10**9}}
    )
    in_flight = []
    for i in range(4):
        algo.collect(env_config={"level": i})
        in_flight.append(algo.collector.in_flight)
        algo.update()
    assert algo.env.configs == [{"level": 0}, {"level": 2}]
    assert in_flight == [True, False, True, False]
    assert algo.env.steps == 4 * 8  # no rollout collected ahead and then thrown away
    algo.evaluate(num_steps=4)  # on the training envs, at the reset boundary
    algo.collect()
    assert algo.collector.in_flight
    algo.reset_envs(env_config={"level": 9})
    assert algo.collector.idle and algo.env.configs[-1] == {"level": 9}
    before = algo.env.steps
    algo.collect()  # runs now, from the reset envs; the next collect resets: none starts ahead
    assert algo.env.steps == before + 8 and algo.collector.idle
    algo.close()


def test_a_collect_must_keep_the_deterministic_flag_of_the_rollout_in_flight():
    algo = PPO(CartPole, **OVERLAP)
    algo.collect()
    algo.update()
    with pytest.raises(
        ValueError, match=r"deterministic=True.*started by the previous one with deterministic=False"
    ):
        algo.collect(deterministic=True)
    algo.collect()  # the rollout is still there
    algo.close()


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_gymnasium_adapter(mode):
    algo = PPO("CartPole-v1", **{**OVERLAP, "env_kwargs": {"vectorization_mode": mode}})
    try:
        stats = train(algo, 3)
        assert [s["monitors/policy_lag"] for s in stats] == [0.0, 1.0, 1.0]
        assert algo.env_steps == 3 * 16 * 8
    finally:
        algo.close()
        algo.env.close()


@pytest.mark.usefixtures("migrated_store")
def test_a_trainer_run_stopped_by_a_condition_ends_cleanly():
    algo = PPO(CartPole, **OVERLAP)
    with Trainer(algo, progress=False) as trainer:
        stats = trainer.run(stop_conditions=HitsUpperBound("algorithm/steps", 3))
        assert trainer.stopped_by is not None and stats["monitors/policy_lag"] == 1.0
    assert trainer.closed and algo.steps == 3
    assert collector_threads() == []


EXIT_WITH_A_ROLLOUT_IN_FLIGHT = """
import time
from rl8 import PPO
from rl8.envs import CartPole

class SlowCartPole(CartPole):
    def step(self, action):
        time.sleep(0.05)
        return super().step(action)

algo = PPO(SlowCartPole, num_envs=16, horizon=8, sgd_minibatch_size=32, num_sgd_iters=2, seed=0,
           collect_mode="overlap")
algo.collect()
algo.update()
print("in flight:", algo.collector.in_flight, flush=True)
"""


@pytest.mark.slow
def test_the_interpreter_exits_with_a_rollout_in_flight_and_no_close():
    env = {
        **os.environ,
        "OMP_NUM_THREADS": "1",
        "PYTHONPATH": str(Path(__file__).resolve().parent.parent),
    }
    done = subprocess.run(
        [sys.executable, "-c", EXIT_WITH_A_ROLLOUT_IN_FLIGHT],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert "in flight: True" in done.stdout


class SigtermAtStep(Condition):
    """Never stops; sends this process a SIGTERM after training step ``step``."""

    def __init__(self, step: int):
        self.step = step

    def __call__(self, stats):
        if stats["algorithm/steps"] == self.step:
            os.kill(os.getpid(), signal.SIGTERM)
        return False


@pytest.mark.usefixtures("migrated_store")
def test_a_sigterm_checkpoints_the_rollout_in_flight_and_the_resumed_trainer_goes_on_exactly(tmp_path):
    losses = [s["losses/total"] for s in reference(5)]
    algo = PPO(CartPole, **OVERLAP)
    trainer = Trainer(algo, checkpoint_dir=tmp_path, progress=False)
    with pytest.raises(SystemExit) as info:
        trainer.run(stop_conditions=SigtermAtStep(3))
    assert info.value.code == 128 + signal.SIGTERM
    assert trainer.closed and collector_threads() == []
    resumed = Trainer.from_checkpoint(tmp_path, progress=False)
    assert resumed.algo.collector.ready  # the rollout that was in flight at the signal
    with resumed:
        assert [resumed.step()["losses/total"] for _ in range(2)] == losses[3:]


def _worker_data_parallel() -> None:
    """torchrun worker: 3 updates, a checkpoint, 3 more; a copy resumed from the checkpoint
    gives the same losses; every rank prints what it saw."""
    from rl8.ppo.distributed import init_distributed

    torch.set_num_threads(1)
    init_distributed()
    hparams = {**OVERLAP, "normalize_observations": True, "device": "cpu"}
    algo = PPO(CartPole, **hparams)
    lags = [stats["monitors/policy_lag"] for stats in train(algo, 3)]
    state = copy.deepcopy(algo.state_dict())
    expected = train(algo, 3)
    resumed = PPO(CartPole, **{**hparams, "seed": 9})
    resumed.load_state_dict(state)
    same = train(resumed, 3) == expected
    algo.close(), resumed.close()
    print(
        f"rank {algo.dist.rank}: lags {lags} resumed {same} threads {len(collector_threads())}",
        flush=True,
    )


@pytest.mark.slow
def test_data_parallel_training_on_two_ranks():
    """torchrun, 2 ranks (gloo): the collectives stay on the main thread, nothing hangs."""
    port = free_port()
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nnodes=1",
        "--nproc_per_node=2",
        "--master_addr=127.0.0.1",
        f"--master_port={port}",
        __file__,
        "data_parallel",
    ]
    env = {
        **os.environ,
        "OMP_NUM_THREADS": "1",
        "PYTHONPATH": str(Path(__file__).resolve().parent.parent),
    }
    proc = subprocess.Popen(
        cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env, start_new_session=True
    )
    try:
        output, _ = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()
    assert proc.returncode == 0, output
    for rank in (0, 1):
        assert f"rank {rank}: lags [0.0, 1.0, 1.0] resumed True threads 0" in output, output


@pytest.mark.slow
def test_overlap_learns_gymnasium_cartpole():
    algo = PPO(
        "CartPole-v1",
        seed=0,
        collect_mode="overlap",
        num_envs=16,
        horizon=64,
        sgd_minibatch_size=256,
        num_sgd_iters=8,
    )
    eval_env = GymnasiumEnv(16, env="CartPole-v1")
    best = -float("inf")
    try:
        while algo.env_steps < 150_000 and best < 475:
            train(algo, 4)
            best = max(best, algo.evaluate(eval_env, num_steps=500)["episodes/return_mean"])
    finally:
        algo.close(), algo.env.close(), eval_env.close()
    assert best >= 475, f"best deterministic return {best:.1f} < 475 in 150k env steps"


@pytest.mark.slow
def test_overlap_learns_pendulum():
    algo = PPO(
        Pendulum,
        seed=0,
        collect_mode="overlap",
        num_envs=256,
        horizon=64,
        gamma=0.95,
        gae_lambda=0.95,
        lr=3e-3,
        num_sgd_iters=8,
        sgd_minibatch_size=4096,
        model_config={"hiddens": (64, 64)},
    )
    eval_env = Pendulum(32)
    best = -float("inf")
    while algo.env_steps < 2_000_000 and best < -250:
        train(algo, 4)
        best = max(best, algo.evaluate(eval_env, num_steps=200)["episodes/return_mean"])
    algo.close()
    assert best >= -250, f"best deterministic return {best:.1f} < -250 in 2M env steps"


if __name__ == "__main__":
    {"data_parallel": _worker_data_parallel}[sys.argv[1]]()
