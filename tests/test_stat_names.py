"""Stat names: ``rollout/reward_sum_*`` is each env's sum of rewards over the rollout (not an
episode return), and rl8 1.0.0's ``returns/*`` names still answer, with a DeprecationWarning, in
the returned stats, in stop conditions and in checkpoints that stored them."""

from __future__ import annotations

import io
import math
import warnings

import pytest
import torch
from gymnasium import spaces
from hparams import SMALL, STEP
from mlflow.tracking import MlflowClient
from tensordict import TensorDict

from rl8 import PPO, Env, Trainer
from rl8.envs import CartPole
from rl8.io.checkpoint import load_checkpoint, save_checkpoint
from rl8.io.checkpoint_dir import CheckpointManager
from rl8.ppo.stats import RENAMED_STATS, Stats, current_stat_name
from rl8.training.conditions import (
    HitsUpperBound,
    Plateaus,
    StopsIncreasing,
    from_config,
    with_current_stat_names,
)


class IndexRewardEnv(Env):
    """Env ``i`` gets reward ``i + 1`` every step; episodes last ``length`` steps."""

    observation_space = spaces.Box(0, 100, (1,))
    action_space = spaces.Discrete(2)
    episodic = True

    def __init__(self, num_envs, /, horizon=None, *, device="cpu", length=3):
        super().__init__(num_envs, horizon, device=device)
        self.length = length
        self.t = torch.zeros(num_envs, 1)

    def reset(self, *, config=None, seed=None):
        self.t = torch.zeros(self.num_envs, 1)
        return self.t.clone()

    def step(self, action):
        t = self.t + 1
        done = t >= self.length
        self.t = torch.where(done, torch.zeros_like(t), t)
        rewards = torch.arange(1, self.num_envs + 1, dtype=torch.float32)[:, None]
        return TensorDict(
            {
                "obs": self.t.clone(),
                "rewards": rewards,
                "terminated": torch.zeros_like(done),
                "truncated": done,
                "final_obs": t,
            },
            batch_size=[self.num_envs],
        )


def test_rollout_reward_sums_are_each_envs_rewards_summed_over_the_horizon():
    algo = PPO(IndexRewardEnv, num_envs=4, horizon=9, sgd_minibatch_size=36, seed=0)
    stats = algo.collect()
    # env i: 9 steps of reward i + 1; its episodes (3 steps each) return 3 * (i + 1)
    sums = torch.tensor([9.0, 18.0, 27.0, 36.0], dtype=torch.float64)
    assert stats["rollout/reward_sum_min"] == 9.0
    assert stats["rollout/reward_sum_max"] == 36.0
    assert stats["rollout/reward_sum_mean"] == pytest.approx(22.5)
    assert stats["rollout/reward_sum_std"] == pytest.approx(sums.std(unbiased=False).item())
    assert stats["episodes/return_mean"] == pytest.approx(7.5)
    assert stats["rewards/mean"] == pytest.approx(2.5)
    assert not any(key.startswith("returns/") for key in stats)


def test_evaluate_sums_rewards_over_its_own_number_of_steps():
    algo = PPO(IndexRewardEnv, num_envs=4, horizon=9, sgd_minibatch_size=36, seed=0)
    stats = algo.evaluate(num_steps=6)
    assert (stats["rollout/reward_sum_min"], stats["rollout/reward_sum_max"]) == (6.0, 24.0)


def test_the_old_names_answer_lookups_with_a_deprecation_warning():
    stats = PPO(CartPole, **SMALL).collect()
    assert isinstance(stats, Stats)
    with pytest.warns(
        DeprecationWarning, match="'returns/mean' is now called 'rollout/reward_sum_mean'"
    ):
        assert stats["returns/mean"] == stats["rollout/reward_sum_mean"] == 8.0
    with pytest.warns(DeprecationWarning, match="'rollout/reward_sum_std'"):
        assert stats.get("returns/std") == 0.0
    with pytest.warns(DeprecationWarning, match="'rollout/reward_sum_max'"):
        assert "returns/max" in stats
    # the aliases are not keys: iteration (and so MLflow) sees each stat once
    assert not any(key.startswith("returns/") for key in stats) and len(stats) == len(dict(stats))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert "returns/median" not in stats and stats.get("returns/median", -1.0) == -1.0
        with pytest.raises(KeyError):
            stats["eval/returns/mean"]  # noqa: B018 (no eval stats: no alias either)
    evaluated = Stats({"eval/rollout/reward_sum_mean": 3.0})
    with pytest.warns(
        DeprecationWarning, match="'eval/rollout/reward_sum_mean'.*'eval/episodes/return_mean'"
    ):
        assert evaluated["eval/returns/mean"] == 3.0


def test_current_stat_name():
    assert current_stat_name("returns/min") == "rollout/reward_sum_min"
    assert current_stat_name("eval/returns/mean") == "eval/rollout/reward_sum_mean"
    assert current_stat_name("rollout/reward_sum_mean") is None
    assert current_stat_name("episodes/return_mean") is None
    assert set(RENAMED_STATS) == {"returns/min", "returns/max", "returns/mean", "returns/std"}


@pytest.mark.usefixtures("migrated_store", "one_torch_thread")
def test_trainer_logs_the_new_names_only_and_answers_the_old(tmp_path):
    with Trainer(PPO(CartPole, **SMALL), progress=False, checkpoint_dir=tmp_path / "ck") as trainer:
        stats = trainer.step()
        stats.update(trainer.eval())
        trainer.flush()
        logged = set(MlflowClient().get_run(trainer.run_id).data.metrics)
    assert {"rollout/reward_sum_mean", "eval/rollout/reward_sum_mean"} <= logged
    assert not any("returns/" in key for key in logged)
    with pytest.warns(DeprecationWarning, match="eval/rollout/reward_sum_mean"):
        assert stats["eval/returns/mean"] == stats["eval/rollout/reward_sum_mean"]


def test_the_progress_line_of_an_env_without_episodes_shows_its_reward_sum():
    from rl8.training.progress import Progress

    stream = io.StringIO()
    progress = Progress(None, stream, interval_s=1e-9)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # read by its new name
        progress.update(Stats({"env/steps": 100, "rollout/reward_sum_mean": -3.5}), [])
    assert "| return -3.5" in stream.getvalue()


# --------------------------------------------------------------------------------------------
# stop conditions


def test_a_condition_on_an_old_name_warns_once_and_reads_the_new_stat():
    with pytest.warns(
        DeprecationWarning, match="'returns/mean' is now called 'rollout/reward_sum_mean'"
    ) as caught:
        condition = HitsUpperBound("returns/mean", 5)
    assert len(caught) == 1
    assert condition.key == "rollout/reward_sum_mean"
    assert condition.to_config() == {"hits_upper_bound": {"key": "rollout/reward_sum_mean", "bound": 5}}
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # checks do not warn again
        assert not condition({"rollout/reward_sum_mean": 4.0})
        assert condition(Stats({"rollout/reward_sum_mean": 5.0}))


def test_from_config_accepts_the_old_eval_name_with_a_warning():
    with pytest.warns(DeprecationWarning, match="'eval/rollout/reward_sum_mean'"):
        condition = from_config({"plateaus": {"key": "eval/returns/mean", "patience": 1, "rtol": 0}})
    assert repr(condition) == "Plateaus('eval/rollout/reward_sum_mean', patience=1, rtol=0.0)"
    assert not condition({"env/steps": 1})  # an eval key, absent on a step without eval
    assert not condition({"eval/rollout/reward_sum_mean": 2.0})
    assert condition({"eval/rollout/reward_sum_mean": 2.0})


def test_cli_config_with_an_old_name_prints_the_warning(capsys):
    from rl8.training.config_file import stop_conditions

    (condition,) = stop_conditions(
        {"stop_conditions": [{"hits_upper_bound": {"key": "returns/mean", "bound": 1}}]}
    )
    assert condition.key == "rollout/reward_sum_mean"
    assert (
        "rl8: warning: stop_conditions[0]: stat 'returns/mean' is now called 'rollout/reward_sum_mean'"
        in capsys.readouterr().err
    )


# --------------------------------------------------------------------------------------------
# checkpoints that stored conditions on the old names


def _with_old_names(value):
    """A checkpoint entry as rl8 wrote it before the rename (the stored condition keys)."""
    if isinstance(value, dict):
        return {k: _with_old_names(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_with_old_names(v) for v in value]
    if isinstance(value, str) and "rollout/reward_sum_" in value:
        return value.replace("rollout/reward_sum_", "returns/")
    return value


def _count_steps(monkeypatch):
    """Count the training steps of every Trainer.run (the rl8 command's too) with a callback."""
    steps, run = [], Trainer.run

    def counted_run(self, *, callbacks=None, **kwargs):
        return run(
            self, callbacks=[*(callbacks or []), lambda trainer, stats: steps.append(1)], **kwargs
        )

    monkeypatch.setattr(Trainer, "run", counted_run)
    return steps


@pytest.mark.usefixtures("migrated_store", "one_torch_thread")
def test_a_checkpoint_with_conditions_on_old_names_resumes(monkeypatch, tmp_path):
    from rl8.cli import main

    stop = [
        StopsIncreasing("eval/rollout/reward_sum_mean", patience=100),
        HitsUpperBound("env/steps", 2 * STEP),
    ]
    with Trainer(PPO(CartPole, **SMALL), progress=False, checkpoint_dir=tmp_path / "ck") as trainer:
        trainer.run(steps_per_eval=1, stop_conditions=stop)
    path = CheckpointManager(tmp_path / "ck").latest()
    state = load_checkpoint(path)
    state["trainer"] = {
        **state["trainer"],
        "stop_conditions": _with_old_names(state["trainer"]["stop_conditions"]),
        "stop_condition_configs": _with_old_names(state["trainer"]["stop_condition_configs"]),
    }
    assert state["trainer"]["stop_conditions"][0]["key"] == "eval/returns/mean"
    save_checkpoint(state, path)
    saved = stop[0].state_dict()
    assert saved["best"] is not None and not math.isnan(saved["best"])
    steps = _count_steps(monkeypatch)

    # Python: the same conditions under their old names get their state back; finished: no step
    with pytest.warns(DeprecationWarning):
        again = [
            StopsIncreasing("eval/returns/mean", patience=100),
            HitsUpperBound("env/steps", 2 * STEP),
        ]
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # neither "the stop conditions differ" nor a rename
        with Trainer.from_checkpoint(path, progress=False) as resumed:
            resumed.run(steps_per_eval=1, stop_conditions=again)
    assert steps == []
    assert again[0].state_dict() == saved

    # the command line rebuilds the stored conditions, silently (a finished run: zero more steps)
    with warnings.catch_warnings():
        warnings.simplefilter("error", DeprecationWarning)
        assert main(["train", "--resume", str(path), "--quiet"]) == 0
    assert steps == []


def test_with_current_stat_names_upgrades_stored_states_and_configs():
    saved = {
        "type": "Or",
        "conditions": [
            {"type": "Plateaus", "key": "returns/mean", "reference": 2.0, "count": 1},
            {"type": "HitsUpperBound", "key": "eval/returns/max"},
        ],
    }
    upgraded = with_current_stat_names(saved)
    assert [c["key"] for c in upgraded["conditions"]] == [
        "rollout/reward_sum_mean",
        "eval/rollout/reward_sum_max",
    ]
    assert saved["conditions"][0]["key"] == "returns/mean"  # a copy
    config = {"or": [{"plateaus": {"key": "returns/mean", "patience": 2, "rtol": 0}}]}
    assert with_current_stat_names(config) == {
        "or": [{"plateaus": {"key": "rollout/reward_sum_mean", "patience": 2, "rtol": 0}}]
    }
    condition = Plateaus("rollout/reward_sum_mean", patience=2, rtol=0)
    condition.load_state_dict(upgraded["conditions"][0])
    assert condition({"rollout/reward_sum_mean": 2.0})  # count 1 + 1 reaches patience 2


def test_reduce_stats_names_each_value_and_refuses_a_name_twice():
    """reduce_stats turns {name: 0-d tensor} groups into {name: float} (one process: the values
    as they are, in float64), and names a stat given in two groups."""
    import torch

    from rl8.ppo.distributed import DistContext
    from rl8.ppo.stats import reduce_stats

    dist = DistContext()
    out = reduce_stats(
        dist,
        sums={"a": torch.tensor(1.5)},
        means={"b": torch.tensor(2, dtype=torch.int64)},
        mins={"c": torch.tensor(-3.0, dtype=torch.float64)},
        maxs={"d": torch.tensor(1e-9)},
        local={"e": torch.tensor(True)},
    )
    assert out == {"a": 1.5, "b": 2.0, "c": -3.0, "d": pytest.approx(1e-9), "e": 1.0}
    assert reduce_stats(dist) == {}
    with pytest.raises(
        ValueError, match=r"reduce_stats: expected each stat name once, got \['a', 'a'\]"
    ):
        reduce_stats(dist, sums={"a": torch.tensor(1.0)}, maxs={"a": torch.tensor(2.0)})
