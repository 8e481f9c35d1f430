"""The worker pool (GymnasiumEnv vectorization_mode="pool") and the rollout over ready envs."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import threading
import time

import gymnasium
import numpy as np
import pytest
import torch
from toy_envs import Counter, DictCounter, alive

from rl8 import PPO
from rl8.envs import EnvWorkerDied, GymnasiumEnv, PoolEnv, PoolWorkerDied
from rl8.policies.recurrent import LSTMModel

SEED = 11


def make_failing() -> gymnasium.Env:
    return Counter(fail_at=SEED + 3)


def ppo(env, mode: str, **kwargs) -> PPO:
    pool = mode == "pool"
    env_kwargs = {
        "vectorization_mode": mode,
        **(
            {
                k: kwargs.pop(k)
                for k in list(kwargs)
                if k in ("num_workers", "min_batch_size", "max_batch_size", "max_wait_s")
            }
            if pool
            else {}
        ),
    }
    hparams = dict(num_envs=8, horizon=16, sgd_minibatch_size=64, num_sgd_iters=1, seed=SEED)
    return PPO(env, env_kwargs=env_kwargs, **{**hparams, **kwargs})


def test_pool_equals_sync_when_it_waits_for_every_env():
    sync = ppo("CartPole-v1", "sync")
    pool = ppo("CartPole-v1", "pool", num_workers=3, min_batch_size=8)  # 3 workers: blocks 3, 3, 2
    try:
        assert isinstance(pool.env, PoolEnv) and [len(b) for b in pool.env.env_blocks] == [3, 3, 2]
        ended = False
        for _ in range(3):
            sync.collect()
            pool.collect()
            for key, value in sync.buffer.data.items():
                assert (pool.buffer.data[key] == value).all(), key
            ended |= bool(sync.buffer.data["terminated"].any())
            sync.update()
            pool.update()
        assert ended  # auto-resets were compared too
        # the ordinary step of all envs: an evaluation gives the sync mode's stats
        np.testing.assert_equal(
            pool.evaluate(pool.env, num_steps=40), sync.evaluate(sync.env, num_steps=40)
        )
    finally:
        sync.env.close()
        pool.env.close()


def test_dict_observations_go_through_the_pool_as_through_the_sync_mode():
    sync = ppo(DictCounter, "sync")
    pool = ppo(DictCounter, "pool", num_workers=2, min_batch_size=8)
    ragged = ppo(DictCounter, "pool", num_workers=2, min_batch_size=1, max_wait_s=0.0)
    try:
        for _ in range(2):
            for algo in (sync, pool, ragged):
                algo.collect()
            for key, value in sync.buffer.data.items(True, True):
                assert (pool.buffer.data[key] == value).all(), key
            # rows filled at their own pace: every row holds its own sub-env's observations
            obs = ragged.buffer.data["obs"]
            assert obs["state"].shape == (8, 17, 3)
            assert (obs["token"][..., 0] == torch.arange(SEED, SEED + 8)[:, None]).all()
            assert (obs["state"][..., 1] == obs["state"][..., 0] ** 2).all()
            for algo in (sync, pool, ragged):
                algo.update()
    finally:
        for algo in (sync, pool, ragged):
            algo.env.close()


def test_overlap_mode_runs_the_pool_in_its_background_thread():
    """collect_mode='overlap' over a pool: the background rollout acts on ready envs and, with
    min_batch_size == num_envs, collects exactly what overlap over the sync mode collects."""
    sync = ppo("CartPole-v1", "sync", collect_mode="overlap")
    pool = ppo("CartPole-v1", "pool", num_workers=2, min_batch_size=8, collect_mode="overlap")
    try:
        for _ in range(3):
            sync.collect()
            pool.collect()
            for key, value in sync.buffer.data.items():
                assert (pool.buffer.data[key] == value).all(), key
            assert sync.update()["monitors/policy_lag"] == pool.update()["monitors/policy_lag"]
        assert pool.steps == 3
    finally:
        for algo in (sync, pool):
            algo.close()
            algo.env.close()
    assert not [t for t in threading.enumerate() if t.name == "rl8-overlap-collector"]


def reference_gae(rewards, values, terminated, truncated, final_values, gamma, lam):
    """Row by row, step by step."""
    n, horizon = rewards.shape
    advantages = torch.zeros(n, horizon)
    for i in range(n):
        last = 0.0
        for t in reversed(range(horizon)):
            next_value = final_values[i, t] if truncated[i, t] else values[i, t + 1]
            if terminated[i, t]:
                next_value = 0.0
            delta = rewards[i, t] + gamma * next_value - values[i, t]
            done = bool(terminated[i, t] or truncated[i, t])
            last = delta + gamma * lam * (0.0 if done else last)
            advantages[i, t] = last
    return advantages


def test_rows_filling_at_different_speeds_hold_each_envs_own_trajectory():
    algo = ppo(
        Counter,
        "pool",
        num_workers=2,
        min_batch_size=1,
        max_batch_size=3,
        max_wait_s=0.0,
        normalize_rewards=False,
    )
    sizes = []
    recv = algo.env.recv

    def counting_recv(*args):
        env_ids, out = recv(*args)
        sizes.append(len(env_ids))
        return env_ids, out

    algo.env.recv = counting_recv
    try:
        for _ in range(2):
            algo.collect()
            data, h = algo.buffer.data, algo.hparams.horizon
            obs, final = data["obs"], data["final_obs"]
            for i in range(8):
                token = SEED + i
                assert (obs[i, :, 0] == token).all()  # row i holds sub-env i only
                for t in range(h):
                    count = obs[i, t, 1]
                    assert data["rewards"][i, t] == count + data["actions"][i, t]
                    ended = bool(data["truncated"][i, t])
                    assert ended == bool(count + 1 == 4 + token % 3)
                    assert obs[i, t + 1, 1] == (0 if ended else count + 1)
                    if ended:
                        assert final[i, t, 1] == count + 1
            hp = algo.hparams
            with torch.no_grad():
                advantages, _ = algo.compute_advantages()
                truncated = data["truncated"][:, :h]
                final_values = torch.zeros(8, h)
                for i, t in truncated.nonzero().tolist():
                    final_values[i, t] = algo.policy.value(final[i, t][None])[0]
            assert truncated.any()
            expected = reference_gae(
                data["rewards"][:, :h],
                data["values"],
                data["terminated"][:, :h],
                truncated,
                final_values,
                hp.gamma,
                hp.gae_lambda,
            )
            torch.testing.assert_close(advantages, expected)
            algo.update()
        assert min(sizes) < 8  # batches of some envs while the others were stepping
    finally:
        algo.env.close()


def test_recurrent_policy_collects_and_updates_with_a_pool():
    kwargs = dict(model_cls=LSTMModel, model_config={"hidden_size": 8}, seq_len=4, horizon=8)
    exact = ppo("CartPole-v1", "pool", num_workers=2, min_batch_size=8, **kwargs)
    sync = ppo("CartPole-v1", "sync", **kwargs)
    ragged = ppo(Counter, "pool", num_workers=2, min_batch_size=1, max_wait_s=0.0, **kwargs)
    try:
        for _ in range(2):
            exact.collect()
            sync.collect()
            for key, value in sync.buffer.data.items():
                assert (exact.buffer.data[key] == value).all(), key
            assert (exact.buffer.states == sync.buffer.states).all()
            assert (exact.buffer.post_states == sync.buffer.post_states).all()
            exact.update()
            sync.update()
            ragged.collect()
            # each row's values are what the model gives stepping through that row alone
            data, policy = ragged.buffer.data, ragged.policy
            for i in range(8):
                carry = ragged.buffer.states[i : i + 1, 0]
                for t in range(ragged.hparams.horizon):
                    _, value, carry = policy.rollout_step(
                        data["obs"][i, t][None], carry, data["firsts"][i, t][None]
                    )
                    torch.testing.assert_close(value[0], data["values"][i, t])
            assert np.isfinite(list(ragged.update().values())).all()
    finally:
        for algo in (exact, sync, ragged):
            algo.env.close()


@pytest.mark.timeout(60)
def test_a_worker_exception_names_the_sub_env_and_carries_its_traceback():
    env = GymnasiumEnv(6, env=make_failing, vectorization_mode="pool", num_workers=2)
    env.reset(seed=SEED)
    with pytest.raises(ValueError, match="boom in env with token 14") as info:
        for _ in range(3):
            env.step(torch.zeros(6, dtype=torch.long))
    assert any("sub-env 3 by pool worker 1" in note for note in info.value.__notes__)
    assert "in step" in str(info.value.__cause__) and "Traceback" in str(info.value.__cause__)
    assert not any(alive(pid) for pid in env.worker_pids)  # closed on the error


@pytest.mark.timeout(60)
def test_a_killed_worker_is_reported_with_its_exit_code_not_a_hang():
    env = GymnasiumEnv(4, env=Counter, vectorization_mode="pool", num_workers=2)
    env.reset(seed=SEED)
    env.send(torch.arange(4), torch.zeros(4, dtype=torch.long))
    env.recv(4, 4, None)
    os.kill(env.worker_pids[1], signal.SIGKILL)
    env.send(torch.arange(4), torch.zeros(4, dtype=torch.long))
    died = r"pool worker 1 .*sub-envs 2\.\.3.*exit code -9 \(killed by signal SIGKILL\)"
    # caught as any worker backend's death; the timeout mark guards against a hang
    with pytest.raises(EnvWorkerDied, match=died) as info:
        while True:
            ids, _ = env.recv(1, 4, None)
            env.send(ids, torch.zeros(len(ids), dtype=torch.long))
    assert type(info.value) is PoolWorkerDied
    assert not any(alive(pid) for pid in env.worker_pids)


@pytest.mark.timeout(60)
def test_workers_ignore_sigint_and_close_reaps_them_all():
    env = GymnasiumEnv(4, env="CartPole-v1", vectorization_mode="pool", num_workers=2)
    env.reset(seed=SEED)
    for pid in env.worker_pids:
        os.kill(pid, signal.SIGINT)  # Ctrl-C reaches the whole process group
    time.sleep(0.2)
    assert env.step(torch.zeros(4, dtype=torch.long))["obs"].shape == (4, 4)
    pids = env.worker_pids
    env.close()
    env.close()
    assert not any(alive(pid) for pid in pids)
    with pytest.raises(RuntimeError, match="is closed"):
        env.step(torch.zeros(4, dtype=torch.long))


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"num_workers": 0}, "num_workers must be an int >= 1 or None, got 0"),
        ({"num_workers": 1.5}, "num_workers must be an int >= 1 or None, got 1.5"),
        ({"min_batch_size": 0}, "min_batch_size must be an int >= 1 or None, got 0"),
        (
            {"min_batch_size": 3, "max_batch_size": 2},
            "max_batch_size must be >= min_batch_size=3, got 2",
        ),
        ({"max_wait_s": -1}, "max_wait_s must be a number of seconds >= 0 or None, got -1"),
        ({"max_wait_s": "1"}, "max_wait_s must be a number of seconds >= 0 or None, got '1'"),
    ],
)
def test_bad_pool_settings_are_refused_naming_field_and_value(kwargs, message):
    with pytest.raises(ValueError, match=f"PoolEnv: {message}"):
        GymnasiumEnv(4, env="CartPole-v1", vectorization_mode="pool", **kwargs)


def test_settings_above_num_envs_build_the_one_env_copies_of_videos_and_evals(tmp_path):
    pytest.importorskip("imageio_ffmpeg")
    from rl8.training.video import make_recording_env, record_video

    pool = {"vectorization_mode": "pool", "num_workers": 4, "min_batch_size": 8, "max_batch_size": 16}
    algo = PPO("CartPole-v1", num_envs=16, horizon=8, seed=0, env_kwargs=pool)
    env = make_recording_env("CartPole-v1", env_kwargs=pool)
    try:
        assert isinstance(env, PoolEnv)
        assert (env.num_workers, env.min_batch_size, env.max_batch_size) == (1, 1, 1)
        path = record_video(algo.policy, env, tmp_path / "pool.mp4", max_steps=10, seed=0)
        assert path.stat().st_size > 0
    finally:
        env.close()
        algo.env.close()


@pytest.mark.slow
def test_ppo_with_a_pool_learns_cartpole():
    """Acting on 8 ready envs of 16 at a time; the exactness tests above cover the rest."""
    algo = PPO(
        "CartPole-v1",
        num_envs=16,
        horizon=64,
        sgd_minibatch_size=256,
        num_sgd_iters=8,
        seed=0,
        env_kwargs={"vectorization_mode": "pool", "num_workers": 2, "min_batch_size": 8},
    )
    try:
        best = 0.0
        while algo.env_steps < 20_000 and best < 200:
            stats = algo.collect()
            algo.update()
            if stats["episodes/count"] > 0:
                best = max(best, stats["episodes/return_mean"])
        assert best >= 200, f"best mean episode return {best:.1f} after {algo.env_steps} env steps"
    finally:
        algo.env.close()


@pytest.mark.timeout(60)
def terminal_signals() -> None:
    """In the child: SIGINT as a program started from a terminal has it (default, unblocked),
    whatever the test process's worker left ignored or blocked (both are inherited)."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})


@pytest.mark.slow
def test_ctrl_c_during_a_collect_ends_the_learner_and_reaps_the_workers():
    """The pool is never closed by the script: its workers end with the interpreter."""
    script = textwrap.dedent("""
        from rl8 import PPO
        algo = PPO("CartPole-v1", num_envs=4, horizon=8, seed=0,
                   env_kwargs={"vectorization_mode": "pool", "num_workers": 2, "min_batch_size": 1})
        print(*algo.env.worker_pids, flush=True)
        while True:
            algo.collect()
    """)
    learner = subprocess.Popen(
        [sys.executable, "-c", script],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
        preexec_fn=terminal_signals,
        env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)},
    )
    try:
        pids = [int(pid) for pid in learner.stdout.readline().split()]
        assert len(pids) == 2, learner.stderr.read()
        time.sleep(0.5)
        os.killpg(learner.pid, signal.SIGINT)  # what Ctrl-C in a terminal does: the whole group
        _, stderr = learner.communicate(timeout=30)
    finally:
        if learner.poll() is None:
            learner.kill()
    assert "KeyboardInterrupt" in stderr
    time.sleep(0.5)
    assert not any(alive(pid) for pid in pids)
