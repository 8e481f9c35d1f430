"""``env_episodes/*``: the episodes as the env records them itself (gymnasium's
``RecordEpisodeStatistics``, inside the reward clipping and life loss of the Atari preset), next
to PPO's own ``episodes/*``, in every collection mode of the gymnasium adapter."""

from __future__ import annotations

import math

import gymnasium
import numpy as np
import pytest
import torch
from gymnasium import spaces

from rl8 import PPO
from rl8.envs import GymnasiumEnv
from rl8.envs.episodes import EpisodeLog, EpisodeRecords
from rl8.ppo.distributed import DistContext
from rl8.ppo.stats import rollout_stats

MODES = ["sync", "async", "pool"]
GAME_LENGTH, LIFE_LENGTH = 7, 3
GAME_SCORE = sum(range(1, GAME_LENGTH + 1))  # 28


class Game(gymnasium.Env):
    """A game of ``GAME_LENGTH`` steps in which step ``t`` (1, 2, ...) scores ``t`` points."""

    observation_space = spaces.Box(0, 100, (1,), np.float32)
    action_space = spaces.Discrete(2)

    def __init__(self) -> None:
        self.t = 0

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.t = 0
        return np.array([self.t], np.float32), {}

    def step(self, action):
        self.t += 1
        return np.array([self.t], np.float32), float(self.t), self.t >= GAME_LENGTH, False, {}


class LoseLifeEvery(gymnasium.Wrapper):
    """Like the Atari preset's ``EpisodicLife``: an episode ends every ``LIFE_LENGTH`` steps
    of the game, and the game goes on: a reset in mid-game takes one no-op step (which here
    may end the game; a new one starts then)."""

    def __init__(self, env: gymnasium.Env) -> None:
        super().__init__(env)
        self.steps, self.game_over = 0, True

    def step(self, action):
        obs, reward, terminated, truncated, info = self.env.step(action)
        self.game_over = terminated or truncated
        self.steps += 1
        return obs, reward, terminated or self.steps % LIFE_LENGTH == 0, truncated, info

    def reset(self, **kwargs):
        if not self.game_over:
            obs, _, terminated, truncated, info = self.env.step(0)
            self.steps += 1
        if self.game_over or terminated or truncated:
            obs, info = self.env.reset(**kwargs)
            self.steps = 0
        self.game_over = False
        return obs, info


def make_game() -> gymnasium.Env:
    """The Game as the Atari preset wraps a game: the score recorded first, then rewards
    clipped to their sign and an episode end at each lost life.

    PPO sees episodes of steps 1-3 (clipped return 3), then, after the reset's no-op step 4,
    of steps 5-6 (return 2), ending the game with the next reset's no-op step 7: every 5 PPO
    steps a whole game of 7 steps and score 28 ends, inside a reset."""
    env = gymnasium.wrappers.RecordEpisodeStatistics(Game())
    env = gymnasium.wrappers.TransformReward(env, lambda r: float(np.sign(r)))
    return LoseLifeEvery(env)


def make_plain_game() -> gymnasium.Env:
    """The Game without RecordEpisodeStatistics."""
    return LoseLifeEvery(Game())


def _env_kwargs(mode: str) -> dict:
    return {"vectorization_mode": mode, **({"num_workers": 2} if mode == "pool" else {})}


def _episode_stats(stats) -> dict[str, float]:
    return {k: v for k, v in stats.items() if k.startswith(("episodes/", "env_episodes/"))}


@pytest.mark.parametrize("mode", MODES)
def test_env_episodes_are_the_recorded_whole_games_and_episodes_the_clipped_lives(mode):
    # 20 steps per env: 4 games of 5 PPO steps, 8 episodes (lives) of 3 and 2 steps
    algo = PPO(
        make_game,
        num_envs=2,
        horizon=20,
        sgd_minibatch_size=40,
        num_sgd_iters=1,
        seed=0,
        env_kwargs=_env_kwargs(mode),
    )
    try:
        for _ in range(2):
            stats = algo.collect()
            assert _episode_stats(stats) == {
                "episodes/return_mean": 2.5,
                "episodes/length_mean": 2.5,
                "episodes/count": 16.0,
                "env_episodes/return_mean": GAME_SCORE,
                "env_episodes/length_mean": GAME_LENGTH,
                "env_episodes/count": 8.0,
            }
            algo.update()
    finally:
        algo.env.close()


@pytest.mark.parametrize("mode", MODES)
def test_an_env_without_records_adds_no_stats(mode):
    algo = PPO(
        make_plain_game,
        num_envs=2,
        horizon=20,
        sgd_minibatch_size=40,
        num_sgd_iters=1,
        seed=0,
        env_kwargs=_env_kwargs(mode),
    )
    try:
        stats = algo.collect()
        assert stats["episodes/count"] == 16.0
        assert not any(key.startswith("env_episodes/") for key in stats)
        assert algo.env.pop_episode_records() is None
        assert algo.buffer.env_episodes is None
    finally:
        algo.env.close()


@pytest.mark.parametrize("mode", MODES)
def test_the_adapter_pops_records_once_and_reset_forgets_them(mode):
    env = GymnasiumEnv(2, env=make_game, **_env_kwargs(mode))
    try:
        env.reset(seed=0)
        assert env.pop_episode_records() == EpisodeRecords(0.0, 0.0, 0)
        for _ in range(5):  # one game each
            env.step(torch.zeros(2, dtype=torch.int64))
        assert env.pop_episode_records() == EpisodeRecords(2.0 * GAME_SCORE, 2.0 * GAME_LENGTH, 2)
        assert env.pop_episode_records() == EpisodeRecords(0.0, 0.0, 0)
        for _ in range(5):
            env.step(torch.zeros(2, dtype=torch.int64))
        env.reset()
        assert env.pop_episode_records() == EpisodeRecords(0.0, 0.0, 0)
    finally:
        env.close()


def test_records_flow_in_overlap_mode_and_through_a_checkpoint():
    algo = PPO(
        make_game,
        num_envs=2,
        horizon=10,
        sgd_minibatch_size=20,
        num_sgd_iters=1,
        seed=0,
        collect_mode="overlap",
    )
    try:
        for _ in range(2):
            stats = algo.collect()
            assert (stats["env_episodes/count"], stats["env_episodes/return_mean"]) == (4.0, GAME_SCORE)
            algo.update()
        state = algo.state_dict()  # the rollout in flight (2 games per env) is saved
        assert state["overlap"]["rollout"]["env_episodes"] == {
            "return_sum": 4.0 * GAME_SCORE,
            "length_sum": 4.0 * GAME_LENGTH,
            "count": 4,
        }
        stats = algo.collect()
        assert (stats["env_episodes/count"], stats["env_episodes/length_mean"]) == (4.0, GAME_LENGTH)
    finally:
        algo.close()
        algo.env.close()
    resumed = PPO(
        make_game,
        num_envs=2,
        horizon=10,
        sgd_minibatch_size=20,
        num_sgd_iters=1,
        seed=0,
        collect_mode="overlap",
    )
    try:
        resumed.collector.load_state_dict(state["overlap"], resumed.env.reset())
        assert resumed.collector.buffer.env_episodes == EpisodeRecords(
            4.0 * GAME_SCORE, 4.0 * GAME_LENGTH, 4
        )
    finally:
        resumed.close()
        resumed.env.close()


def test_evaluate_reports_the_eval_envs_records():
    algo = PPO(make_game, num_envs=2, horizon=20, sgd_minibatch_size=40, num_sgd_iters=1, seed=0)
    eval_env = GymnasiumEnv(3, env=make_game)
    try:
        stats = algo.evaluate(eval_env, num_steps=10)
        assert _episode_stats(stats) == {
            "episodes/return_mean": 2.5,
            "episodes/length_mean": 2.5,
            "episodes/count": 12.0,
            "env_episodes/return_mean": GAME_SCORE,
            "env_episodes/length_mean": GAME_LENGTH,
            "env_episodes/count": 6.0,
        }
    finally:
        eval_env.close()
        algo.env.close()


class _TwoEqualRanks(DistContext):
    """A data-parallel context of two ranks that hold the same values: sums double."""

    enabled = True
    world_size = 2

    def __init__(self) -> None:
        pass

    def all_reduce_(self, tensor, op="sum"):
        return tensor.mul_(2) if op == "sum" else tensor


def test_env_episode_sums_reduce_over_ranks_into_means_and_counts():
    rewards = torch.ones(2, 4)
    records = EpisodeRecords(return_sum=30.0, length_sum=12.0, count=3).stat_sums("cpu")
    stats, _ = rollout_stats(_TwoEqualRanks(), rewards, env_episode_sums=records)
    assert (stats["env_episodes/return_mean"], stats["env_episodes/length_mean"]) == (10.0, 4.0)
    assert stats["env_episodes/count"] == 6.0  # both ranks' episodes
    assert "episodes/count" not in stats
    none_ended = EpisodeRecords().stat_sums("cpu")
    stats, _ = rollout_stats(DistContext(), rewards, env_episode_sums=none_ended)
    assert stats["env_episodes/count"] == 0.0 and math.isnan(stats["env_episodes/return_mean"])


@pytest.mark.slow
def test_actors_send_their_envs_records_to_the_learner(tmp_path):
    """2 actors (2 envs each) and 1 learner: the learner's stats count both actors' games."""
    import json
    from pathlib import Path

    from launch import torchrun

    job = torchrun(
        [str(Path(__file__).resolve()), "actors", str(tmp_path)],
        nproc=3,
        timeout=240,
        env={"RL8_DIST_TIMEOUT_S": "60"},
    )
    assert job.returncode == 0, job.output
    stats = json.loads((tmp_path / "learner.json").read_text())
    assert stats["env/steps"] == 2 * 80  # two steps of 4 envs x 20 steps
    # each actor: 2 envs x 4 games (8 lives) in 20 steps
    assert {k: v for k, v in stats.items() if "episodes/" in k} == {
        "episodes/return_mean": 2.5,
        "episodes/length_mean": 2.5,
        "episodes/count": 32.0,
        "env_episodes/return_mean": GAME_SCORE,
        "env_episodes/length_mean": GAME_LENGTH,
        "env_episodes/count": 16.0,
    }


def _worker_actors(out: str) -> None:
    import json
    from pathlib import Path

    from rl8 import Trainer
    from rl8.ppo.distributed import init_distributed
    from rl8.training.conditions import HitsUpperBound

    torch.set_num_threads(1)
    assert init_distributed(actors=2), "run me with torchrun"
    algo = PPO(
        make_game, num_envs=4, horizon=20, sgd_minibatch_size=80, num_sgd_iters=1, seed=0, device="cpu"
    )
    trainer = Trainer(algo, actors=2, tracking=False, progress=False)
    stats = trainer.run(stop_conditions=HitsUpperBound("env/steps", 2 * 80))
    if not trainer.is_actor:
        (Path(out) / "learner.json").write_text(json.dumps(dict(stats)))


if __name__ == "__main__":
    import sys

    {"actors": _worker_actors}[sys.argv[1]](*sys.argv[2:])


def test_the_progress_line_shows_the_envs_own_returns_first():
    """With both, the progress line shows the env's whole games (unclipped), not PPO's lives;
    an update in which no game ended keeps the last one shown."""
    import io

    from rl8.ppo.stats import Stats
    from rl8.training.progress import Progress

    stream = io.StringIO()
    progress = Progress(None, stream, interval_s=1e-9)
    progress.update(
        Stats(
            {
                "env/steps": 100,
                "env_episodes/return_mean": 28.0,
                "episodes/return_mean": 2.5,
                "eval/env_episodes/return_mean": 21.0,
                "eval/episodes/return_mean": 1.0,
            }
        ),
        [],
    )
    first = stream.getvalue()
    assert "| return 28 " in first and "eval return 21" in first
    progress.update(
        Stats({"env/steps": 200, "env_episodes/return_mean": math.nan, "episodes/return_mean": 3.0}), []
    )
    second = stream.getvalue()[len(first) :]
    assert "env steps" in second or "200" in second  # a second line was written
    assert "| return 28 " in second and "| return 3 " not in second


# --------------------------------------------------------------------------------------------
# EpisodeLog: the per-episode means of what a simulator logs when its sub-envs reset


def _ended(n: int) -> torch.Tensor:
    return torch.tensor(n)


def test_episode_log_weighs_each_step_by_the_episodes_that_ended():
    log = EpisodeLog("cpu")
    log.add({"Episode_Reward/x": torch.tensor(1.0), "Episode_Termination/time_out": 2}, _ended(3))
    log.add({"Episode_Reward/x": torch.tensor(5.0), "Episode_Termination/time_out": 1}, _ended(1))
    log.add({"Episode_Reward/x": torch.tensor(100.0), "Episode_Termination/time_out": 7}, _ended(0))
    log.add({"rew_y": torch.tensor([1.0, 2.0, 6.0])}, _ended(3))  # one value per ended episode
    out = log.pop()
    # 3 episodes of mean 1 and 1 of 5 (not the steps' mean, 3); the step where none ended is out
    assert out["Episode_Reward/x"].item() == pytest.approx(2.0)
    assert out["Episode_Termination/time_out"].item() == pytest.approx(3 / 4)  # of the 4 episodes
    assert out["rew_y"].item() == pytest.approx(3.0)
    assert out["rew_y"].dtype == torch.float64 and out["rew_y"].shape == ()
    assert log.pop() == {}  # forgotten
    log.add({"Curriculum/level": 0.5}, _ended(0))
    assert math.isnan(log.pop()["Curriculum/level"].item())  # no episode ended: no mean


def test_episode_log_leaves_out_per_episode_values_left_stale_on_steps_where_none_ended():
    log, stale = EpisodeLog("cpu"), {"rew_y": torch.tensor([1.0, 2.0, 6.0])}
    log.add(stale, _ended(3))
    for _ in range(3):  # the log left as it was while no episode ends (Isaac Lab's direct envs)
        log.add(stale, _ended(0))
    log.add({"rew_y": torch.tensor([10.0, 10.0])}, _ended(2))
    assert log.pop()["rew_y"].item() == pytest.approx((1 + 2 + 6 + 10 + 10) / 5)


def test_episode_log_copies_values_that_the_simulator_rewrites_in_place():
    log, buffer = EpisodeLog("cpu"), torch.zeros(())
    values = {"Episode_Reward/x": buffer}
    for step in range(300):  # more steps than are kept before they are summed
        buffer.fill_(float(step % 2))
        log.add(values, _ended(1))
    buffer.fill_(1000.0)
    values.clear()
    assert log.pop()["Episode_Reward/x"].item() == pytest.approx(0.5)


@pytest.mark.parametrize(
    "values, message",
    [
        (
            {"Episode_Reward/x": "high"},
            "extras\\[\"log\"\\]\\['Episode_Reward/x'\\]: expected a number or a non-empty tensor, got 'high'",
        ),
        ({"Episode_Reward/x": None}, "got None"),
        ({"Episode_Reward/x": torch.zeros(0)}, "non-empty tensor"),
        ({3: 1.0}, "expected string names, got 3"),
    ],
)
def test_episode_log_refuses_values_that_are_not_numbers(values, message):
    with pytest.raises(ValueError, match=message):
        EpisodeLog("cpu").add(values, _ended(1))
