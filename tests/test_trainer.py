"""Trainer: counters and stats, MLflow logging, eval rules, run(), progress, checkpoints, resume."""

from __future__ import annotations

import dataclasses
import io
import math
import os
import pickle
import signal
import subprocess
import sys
import textwrap
import time
import warnings
from pathlib import Path

import pytest
import torch
import yaml
from hparams import SMALL, STEP
from launch import free_port
from mlflow.tracking import MlflowClient

import rl8
from rl8 import PPO, Trainer, TrainerConfig, TrainStats
from rl8.envs import CartPole, DiscreteDummyEnv, Pendulum
from rl8.io.checkpoint import CheckpointError, save_checkpoint
from rl8.io.checkpoint_dir import CheckpointDirError
from rl8.mlflow_store import StoreSchemaError
from rl8.tracking import TrackingError
from rl8.training.conditions import (
    HitsLowerBound,
    HitsUpperBound,
    MissingStatError,
    Plateaus,
    StopsDecreasing,
    StopsIncreasing,
    TimeLimit,
)
from rl8.training.progress import Progress, results_lines

pytestmark = pytest.mark.usefixtures("migrated_store", "one_torch_thread")

REPO = Path(__file__).resolve().parents[1]


def make_algo(env=CartPole, **hparams):
    return PPO(env, **{**SMALL, **hparams})


def make_trainer(algo=None, **kwargs):
    return Trainer(algo if algo is not None else make_algo(), progress=False, **kwargs)


def history(uri, run_id, key):
    return [
        (m.step, m.value)
        for m in sorted(MlflowClient(uri).get_metric_history(run_id, key), key=lambda m: m.step)
    ]


def spy_log_batch(monkeypatch):
    calls = []
    real = MlflowClient.log_batch

    def spy(self, run_id, metrics=(), params=(), tags=(), *args, **kwargs):
        calls.append({"metrics": list(metrics), "params": list(params)})
        return real(self, run_id, metrics, params, tags, *args, **kwargs)

    monkeypatch.setattr(MlflowClient, "log_batch", spy)
    return calls


# --------------------------------------------------------------------------------------------
# step(): counters, stats, logging

DESIGN_KEYS = {
    "env/steps", "env/resets", "algorithm/collects", "algorithm/steps",
    "rollout/reward_sum_min", "rollout/reward_sum_max", "rollout/reward_sum_mean", "rollout/reward_sum_std",
    "rewards/min", "rewards/max", "rewards/mean", "rewards/std",
    "episodes/return_mean", "episodes/length_mean", "episodes/count",
    "losses/policy", "losses/vf", "losses/entropy", "losses/total",
    "monitors/kl_div", "monitors/clip_fraction", "monitors/explained_variance", "monitors/grad_norm",
    "coefficients/entropy", "coefficients/vf", "coefficients/lr",
    "profiling/collect_ms", "profiling/step_ms", "throughput/env_steps_per_s",
}  # fmt: skip


def test_step_counters_and_stat_names():
    trainer = make_trainer()
    try:
        first = trainer.step()
        stats = trainer.step()
        assert isinstance(stats, TrainStats) and isinstance(stats, dict)
        assert DESIGN_KEYS <= set(stats)
        assert any(k.startswith("memory/") for k in stats)
        assert stats["memory/rss_mb"] > 0
        assert first["env/steps"] == STEP and stats["env/steps"] == 2 * STEP
        assert stats["algorithm/collects"] == stats["algorithm/steps"] == 2
        assert stats["env/resets"] == 1
        assert stats["profiling/collect_ms"] > 0 and stats["profiling/step_ms"] > 0
        ms = stats["profiling/collect_ms"] + stats["profiling/step_ms"]
        assert stats["throughput/env_steps_per_s"] == pytest.approx(STEP / ms * 1000, rel=1e-6)
        assert all(isinstance(v, (int, float)) for v in stats.values())
    finally:
        trainer.close()


def test_a_run_reads_the_update_count_by_its_name(mlflow_uri):
    """rl8 itself reads ``PPO.updates``: a run warns of no deprecated ``PPO.steps``."""
    trainer = make_trainer(tracking_uri=mlflow_uri)
    with warnings.catch_warnings():
        warnings.filterwarnings("error", message="PPO.steps is renamed", category=DeprecationWarning)
        trainer.run(max_env_steps=2 * STEP)
        lines = results_lines(trainer)  # what the progress display prints at the end
    assert trainer.algo.updates == 2 and "2 training steps" in lines[0]


@pytest.mark.parametrize("async_logging", [True, False])
def test_all_stats_of_a_step_in_one_request_at_env_steps(monkeypatch, mlflow_uri, async_logging):
    trainer = make_trainer(async_logging=async_logging, log_every=1)
    calls = spy_log_batch(monkeypatch)
    try:
        stats = [trainer.step() for _ in range(3)]
        trainer.flush()
    finally:
        trainer.close()
    metric_calls = [c for c in calls if c["metrics"]]
    # never one request per metric: a step's stats travel together (several steps may share a
    # request when the Tracker can batch them; without async logging, one request per step)
    assert 1 <= len(metric_calls) <= 3
    if not async_logging:
        assert len(metric_calls) == 3
    by_step: dict[int, set[str]] = {}
    for call in metric_calls:
        for m in call["metrics"]:
            by_step.setdefault(m.step, set()).add(m.key)
    assert sorted(by_step) == [s["env/steps"] for s in stats]
    for s in stats:  # every stat of the step, at step = env/steps; NaN values are left out
        assert by_step[s["env/steps"]] == {k for k, v in s.items() if not math.isnan(v)}
    assert [step for step, _ in history(mlflow_uri, trainer.run_id, "losses/total")] == [
        STEP,
        2 * STEP,
        3 * STEP,
    ]


@pytest.mark.parametrize(("log_every", "logged"), [(None, range(1, 13)), (5, [5, 10, 12])])
def test_a_short_run_logs_every_step_by_default_and_every_nth_with_log_every(
    mlflow_uri, log_every, logged
):
    with make_trainer(log_every=log_every) as trainer:  # 12 steps: a young run
        for _ in range(12):
            trainer.step()
    assert [step for step, _ in history(mlflow_uri, trainer.run_id, "losses/total")] == [
        n * STEP for n in logged
    ]  # log_every=5: the 5th, the 10th and the last step


def test_run_params_and_default_experiment(mlflow_uri):
    trainer = make_trainer(run_name="params")
    run_id = trainer.run_id  # starts the run, which logs the configuration
    trainer.close()
    client = MlflowClient(mlflow_uri)
    run = client.get_run(run_id)
    assert client.get_experiment(run.info.experiment_id).name == "CartPole"
    assert run.info.run_name == "params" and run.info.status == "FINISHED"
    params = run.data.params
    assert params["hparams/horizon"] == "8"
    assert params["hparams/optimizer_kwargs/eps"] == "1e-05"
    assert params["env"] == "rl8.envs.cartpole.CartPole"
    assert params["model/class"] == "rl8.policies.models.MLPModel"
    assert params["distribution/class"] == "rl8.policies.distributions.discrete.Categorical"
    assert params["optimizer/class"] == "torch.optim.adam.Adam"
    assert params["optimizer/kwargs/lr"] == "0.001"
    assert params["hparams/seed"] == "0" and params["hparams/device"] == "cpu"  # the values in use
    assert not {"seed", "device", "env_class"} & set(params)  # each param once
    assert params["versions/torch"] == str(torch.__version__)
    assert params["versions/rl8"]


def test_every_option_declared_in_trainer_config_reaches_params_checkpoint_and_resume(
    tmp_path, mlflow_uri
):
    fields = dataclasses.fields(TrainerConfig)
    logged = {f.name for f in fields if f.metadata["param"]}
    stored = {f.name for f in fields if f.metadata["stored"]}
    assert logged and stored
    config = TrainerConfig(
        experiment="declared",
        run_name="once",
        checkpoint_dir=str(tmp_path / "ck"),
        checkpoint_every=3,
        keep_checkpoints=2,
        eval_num_envs=2,
        eval_num_steps=4,
        record_every=7,
        metadata={"a": 1},
        progress=False,
    )
    trainer = Trainer(make_algo(), config)
    trainer.step()
    path = trainer.save_checkpoint()
    resolved = trainer.resolved_config()
    trainer.close()
    params = MlflowClient(mlflow_uri).get_run(trainer.run_id).data.params
    assert {k.split("/", 1)[1] for k in params if k.startswith("trainer/")} == logged
    assert params["trainer/checkpoint_every"] == "3" and params["trainer/record_every"] == "7"
    saved = torch.load(path, weights_only=True)["trainer"]
    assert stored <= set(saved)
    resumed = Trainer.from_checkpoint(path, progress=False)
    resumed.close()
    assert {name: getattr(resumed.config, name) for name in stored} == {
        name: getattr(resolved, name) for name in stored
    }
    assert resumed.config.run_id == trainer.run_id and resumed.config.keep_checkpoints == 2


def test_trainer_config_and_keyword_options_make_the_same_trainer():
    algo = make_algo()
    trainer = Trainer(algo, TrainerConfig(checkpoint_every=2, tracking=False), keep_checkpoints=3)
    assert trainer.config == TrainerConfig(checkpoint_every=2, tracking=False, keep_checkpoints=3)
    assert Trainer(algo, checkpoint_every=2, tracking=False, keep_checkpoints=3).config == trainer.config
    with pytest.raises(
        TypeError, match="unknown option 'checkpoint_evry'; did you mean 'checkpoint_every'"
    ):
        Trainer(algo, checkpoint_evry=2)
    with pytest.raises(ValueError, match="Trainer: keep_checkpoints must be an int >= 1 or None, got 0"):
        Trainer(algo, TrainerConfig(tracking=False), keep_checkpoints=0)
    with pytest.raises(
        TypeError, match="config must be a rl8.training.config.TrainerConfig or None, got 'x'"
    ):
        Trainer(algo, "x")


def test_unreachable_tracking_server_fails_before_training():
    port = free_port()  # nothing listens on it
    algo = make_algo()
    trainer = Trainer(algo, tracking_uri=f"http://127.0.0.1:{port}", progress=False)
    t0 = time.monotonic()
    with pytest.raises(TrackingError, match=f"127.0.0.1:{port}"):
        trainer.run(max_env_steps=STEP)  # the run starts after the argument checks
    assert time.monotonic() - t0 < 20
    assert algo.collects == 0 and algo.steps == 0


@pytest.mark.parametrize(
    "kwargs, error, message",
    [
        ({"async_logging": "no"}, ValueError, "Trainer: async_logging must be True or False, got 'no'"),
        (
            {"metadata": {"when": time.time, "ok": [1, "a"]}},
            TypeError,
            "Trainer: metadata cannot be stored in a checkpoint: metadata['when'] is a builtins.builtin_function_or_method, "
            "which a checkpoint cannot hold",
        ),
        (
            {"metadata": {"config": {"lr": torch.zeros(1).numpy()}}},
            TypeError,
            "metadata['config']['lr'] is a numpy.ndarray, which a checkpoint cannot hold",
        ),
        ({"metadata": ["a"]}, TypeError, "Trainer: metadata must be a mapping or None, got ['a']"),
        (
            {"weight_sync_interval": None},
            ValueError,
            "Trainer: weight_sync_interval must be an int >= 1, got None",
        ),
        ({"experiment": 3}, ValueError, "Trainer: experiment must be a string or None, got 3"),
    ],
)
def test_bad_arguments_are_refused_before_the_run_starts(mlflow_uri, kwargs, error, message):
    with pytest.raises(error) as err:
        make_trainer(**kwargs)
    assert message in str(err.value)
    assert MlflowClient(mlflow_uri).search_experiments(filter_string="name = 'CartPole'") == []


def test_tracking_disabled(tmp_path):
    trainer = make_trainer(tracking=False, checkpoint_dir=tmp_path / "ck")
    stats = trainer.step()
    path = trainer.save_checkpoint()
    trainer.close()
    assert trainer.run_id is None and stats["env/steps"] == STEP and path.is_file()
    assert not MlflowClient().search_runs([e.experiment_id for e in MlflowClient().search_experiments()])


# --------------------------------------------------------------------------------------------
# eval on the training envs: the horizon-aware rules


def test_eval_on_training_envs_that_never_reset():
    trainer = make_trainer()  # horizons_per_env_reset = -1
    try:
        stats = trainer.eval()  # before the first step: allowed
        assert {"eval/rollout/reward_sum_mean", "eval/episodes/count", "profiling/eval_ms"} <= set(stats)
        assert all(k.startswith("eval/") or k.startswith("profiling/") for k in stats)
        assert trainer.eval_envs.eval_env is None  # the training envs were used
    finally:
        trainer.close()


def test_eval_on_training_envs_only_at_reset_boundaries(mlflow_uri):
    trainer = make_trainer(make_algo(horizons_per_env_reset=2))
    try:
        trainer.step()
        trainer.step()
        stats = trainer.eval()
        assert trainer.eval_envs.eval_env is None  # the training envs were used
        # published rl8 rule: an eval on the training envs runs horizons_per_env_reset collects
        assert stats["eval/rollout/reward_sum_max"] <= 2 * 8
        trainer.flush()
        assert history(mlflow_uri, trainer.run_id, "eval/rollout/reward_sum_mean")[0][0] == 2 * STEP
    finally:
        trainer.close()


@pytest.mark.parametrize(
    "hparams, kwargs, match",
    [
        (
            {"horizons_per_env_reset": 2},
            {"eval_env_config": {"gravity": 20.0}},
            "steps_per_eval is None",
        ),
        ({}, {"steps_per_eval": 0}, "steps_per_eval must be an int"),
    ],
)
def test_run_rejects_eval_plans_before_training(hparams, kwargs, match):
    trainer = make_trainer(make_algo(**hparams))
    try:
        with pytest.raises(ValueError, match=match):
            trainer.run(stop_conditions=[HitsUpperBound("env/steps", 10 * STEP)], **kwargs)
        assert trainer.algo.collects == 0  # nothing was trained
        assert not trainer.closed  # still usable
    finally:
        trainer.close()


def test_run_evaluates_every_steps_per_eval_and_eval_does_not_change_training(mlflow_uri):
    # PPO samples from torch's global RNG: build and run one trainer after the other
    stop = lambda: [HitsUpperBound("env/steps", 4 * STEP)]  # noqa: E731
    losses = {}
    for name, kwargs in (
        ("plain", {}),
        ("eval", {"steps_per_eval": 2, "eval_env_config": {"gravity": 30.0}}),
    ):
        trainer = evaluated = make_trainer(make_algo(horizons_per_env_reset=2))
        seen = []
        update = trainer.algo.update

        def record(update=update, seen=seen):
            stats = update()
            seen.append(stats["losses/total"])
            return stats

        trainer.algo.update = record
        last = trainer.run(stop_conditions=stop(), **kwargs)
        trainer.close()
        losses[name] = seen
    assert "eval/rollout/reward_sum_mean" in last
    assert [s for s, _ in history(mlflow_uri, evaluated.run_id, "eval/rollout/reward_sum_mean")] == [
        2 * STEP,
        4 * STEP,
    ]
    assert losses["plain"] == losses["eval"]  # exact: eval restores env state and RNG
    assert evaluated.algo.env.params["gravity"] == 9.8  # the eval config did not leak into training


def test_dedicated_eval_env_any_time_whole_episodes():
    trainer = make_trainer(make_algo(env_config={"max_episode_steps": 12}), eval_num_envs=4)
    try:
        trainer.step()
        a = trainer.eval()  # after a step with horizons_per_env_reset=-1: fine on its own env
        b = trainer.eval()
        # default length: the episode limit, so every eval env finishes a whole episode
        assert a["eval/episodes/count"] >= 4
        assert a["eval/episodes/length_mean"] <= 12
        assert {k: v for k, v in a.items() if k.startswith("eval/")} == {
            k: v for k, v in b.items() if k.startswith("eval/")
        }  # same start state every time: evaluations differ by the policy only
        c = trainer.eval(env_config={"max_episode_steps": 5})
        assert c["eval/episodes/length_mean"] <= 5
        d = trainer.eval()  # the previous eval's config does not stick to the eval env
        assert {k: v for k, v in d.items() if k.startswith("eval/")} == {
            k: v for k, v in a.items() if k.startswith("eval/")
        }
    finally:
        trainer.close()


def test_dedicated_eval_env_does_not_disturb_training():
    kw = dict(env_config={"max_episode_steps": 12})
    plain = make_trainer(make_algo(**kw))  # one after the other: PPO uses torch's global RNG
    expected = [plain.step()["losses/total"] for _ in range(2)]
    plain.close()
    other = make_trainer(make_algo(**kw), eval_num_envs=3)
    try:
        got = []
        for _ in range(2):
            other.eval(deterministic=False)  # builds the eval env, samples: RNG untouched
            got.append(other.step()["losses/total"])
        assert got == expected
        assert (
            other.run(steps_per_eval=1, stop_conditions=HitsUpperBound("eval/episodes/count", 1))[
                "eval/episodes/count"
            ]
            >= 3
        )
    finally:
        other.close()


# --------------------------------------------------------------------------------------------
# run() and stop conditions


@pytest.mark.parametrize(
    "condition, steps",
    [
        (HitsUpperBound("env/steps", 5 * STEP), 5),
        (HitsUpperBound("algorithm/steps", 3), 3),
        (HitsLowerBound("coefficients/entropy", 0.0), 1),
        (Plateaus("coefficients/lr", patience=2, rtol=0.0), 3),
        (StopsIncreasing("coefficients/lr", patience=1), 2),
        (StopsDecreasing("coefficients/vf", patience=2), 3),
        (TimeLimit(1e-6), 1),
    ],
)
def test_run_stops_when_a_condition_holds(condition, steps, mlflow_uri):
    trainer = make_trainer()
    stats = trainer.run(stop_conditions=[condition, HitsUpperBound("env/steps", 20 * STEP)])
    trainer.close()
    assert trainer.algo.steps == steps and stats["algorithm/steps"] == steps
    assert trainer.last_checkpoint is not None and trainer.last_checkpoint.name.endswith(
        f"{steps * STEP:012d}.pt"
    )


def test_run_stops_on_an_eval_stat():
    trainer = make_trainer(make_algo(horizons_per_env_reset=2))
    stats = trainer.run(
        steps_per_eval=2, stop_conditions=HitsUpperBound("eval/rollout/reward_sum_mean", -1e9)
    )
    trainer.close()
    assert stats["algorithm/steps"] == 2  # step 1 has no eval stats: not a stop


def test_unknown_stat_key_surfaces_and_fails_the_run(mlflow_uri):
    trainer = make_trainer()
    with pytest.raises(MissingStatError, match="episodes/return_mean"):
        trainer.run(stop_conditions=[HitsUpperBound("episodes/retrun_mean", 1)])
    assert trainer.closed and trainer.algo.steps == 1
    assert MlflowClient(mlflow_uri).get_run(trainer.run_id).info.status == "FAILED"


def test_run_restores_signal_handlers():
    before = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM, signal.SIGUSR1)}
    trainer = make_trainer()
    trainer.run(stop_conditions=HitsUpperBound("algorithm/steps", 1))
    trainer.close()
    assert {s: signal.getsignal(s) for s in before} == before


class _Tty(io.StringIO):
    def isatty(self):
        return True


@pytest.mark.parametrize(
    "progress, tty, shown",
    [(None, True, True), (None, False, True), (False, True, False), (True, False, True)],
)
def test_progress_line(monkeypatch, progress, tty, shown):
    stream = _Tty() if tty else io.StringIO()
    monkeypatch.setattr(sys, "stderr", stream)
    trainer = Trainer(make_algo(), progress=progress)
    trainer.run(stop_conditions=[HitsUpperBound("env/steps", 3 * STEP)])
    trainer.close()
    text = stream.getvalue()
    if not shown:
        assert text == ""
        return
    # first where the run goes (its MLflow run starts in the background: once it has an id)
    run_line, folder_line, text = text.split("\n", 2)
    assert run_line.startswith(f"rl8: MLflow run {trainer.run_id} in ")
    assert folder_line == f"rl8: checkpoints in {trainer.checkpoint_dir}"
    *lines, summary, end = text.split("\n")
    assert end == ""
    if tty:  # one line redrawn in place, then the summary
        assert text.startswith("\r") and len(lines) == 1
        last = lines[0].split("\r")[-1]
    else:  # plain lines for log files
        assert "\r" not in text
        last = lines[-1]
    assert "384 env steps" in last and "steps/s" in last and "return" in last
    assert "100% to env/steps >= 384" in last and "ETA 0s" in last
    assert summary.startswith("rl8: stopped by HitsUpperBound('env/steps', 384) after 384 env steps")


# --------------------------------------------------------------------------------------------
# checkpoints


def test_checkpoints_keep_last_n_and_log_the_policy(tmp_path, mlflow_uri):
    trainer = make_trainer(checkpoint_dir=tmp_path / "ck", checkpoint_every=1, keep_checkpoints=2)
    trainer.run(stop_conditions=HitsUpperBound("algorithm/steps", 4))
    trainer.close()
    files = sorted(p.name for p in (tmp_path / "ck").iterdir())
    # no .tmp left; the lock file names the run that owns the folder (rl8.io.checkpoint_dir.CheckpointDirLock)
    assert files == [".rl8.lock", f"checkpoint-{3 * STEP:012d}.pt", f"checkpoint-{4 * STEP:012d}.pt"]
    client = MlflowClient(mlflow_uri)
    artifacts = {f.path for d in ("policy", "rl8") for f in client.list_artifacts(trainer.run_id, d)}
    assert artifacts == {
        "rl8/checkpoint.json",
        *(
            f"policy/{name}"
            for name in (  # an MLflow model folder
                "MLmodel",
                "policy.pt",
                "input_example.json",
                "serving_input_example.json",
                "requirements.txt",
                "python_env.yaml",
            )
        ),
    }
    assert trainer.last_checkpoint == (tmp_path / "ck" / files[-1]).absolute()
    state = torch.load(trainer.last_checkpoint, weights_only=True)  # plain data only
    assert state["trainer"]["run_id"] == trainer.run_id
    assert state["algo"]["counters"]["env_steps"] == 4 * STEP
    assert state["env"]["spec"] == "rl8.envs.cartpole.CartPole"


def test_default_checkpoint_dir_is_named_after_the_run(tmp_path):
    trainer = make_trainer()
    trainer.step()
    path = trainer.save_checkpoint()
    trainer.close()
    assert path.parent == (tmp_path / "checkpoints" / trainer.run_id)


class _Evil:
    def __reduce__(self):
        return (os.system, ("echo pwned",))


@pytest.mark.parametrize("kind", ["truncated", "garbage", "foreign", "not-a-trainer", "unsafe"])
def test_bad_checkpoint_files_are_clear_errors(tmp_path, kind):
    path = tmp_path / "bad.pt"
    if kind in ("truncated", "garbage"):
        trainer = make_trainer(tracking=False)
        good = trainer.save_checkpoint(tmp_path / "good.pt")
        trainer.close()
        data = good.read_bytes()
        path.write_bytes(data[: len(data) // 2] if kind == "truncated" else b"\x00junk" * 100)
        match = "corrupt or truncated"
    elif kind == "foreign":
        torch.save({"weights": torch.zeros(2)}, path)
        match = "not an rl8 checkpoint"
    elif kind == "not-a-trainer":
        save_checkpoint({"weights": torch.zeros(2)}, path)
        match = "not a Trainer checkpoint"
    else:
        path.write_bytes(pickle.dumps({"x": _Evil()}, protocol=2))
        match = "corrupt|execute code"
    with pytest.raises(CheckpointError, match=match):
        Trainer.from_checkpoint(path)


def test_missing_checkpoint_is_a_clear_error(tmp_path):
    with pytest.raises(FileNotFoundError, match="no checkpoint"):
        Trainer.from_checkpoint(tmp_path / "nope.pt")
    (tmp_path / "empty").mkdir()
    with pytest.raises(FileNotFoundError, match="no checkpoint"):
        Trainer.from_checkpoint(tmp_path / "empty")


def test_a_store_of_a_newer_mlflow_is_an_error_that_says_what_to_install(newer_mlflow_store):
    with pytest.raises(StoreSchemaError, match=r'newer MLflow.*pip install -e "\.\[ui\]"'):
        make_trainer(async_logging=False).step()  # the run starts before the first collect
    trainer = make_trainer()  # a new run in a local store: it starts in the background
    with pytest.raises(StoreSchemaError, match="newer MLflow"):
        trainer.run_id
    trainer.close()  # the error was raised: closing does not raise it again
    with pytest.raises(StoreSchemaError, match="newer MLflow"):
        Trainer.from_checkpoint("0" * 32)  # a run id of that store


# --------------------------------------------------------------------------------------------
# resume


RESUME_CASES = {
    "cartpole": (CartPole, dict(normalize_observations=True, entropy_coeff=0.01,
                                lr_schedule=[(0, 1e-3), (2 * STEP, 5e-4)])),
    "dummy-resets": (DiscreteDummyEnv, dict(horizons_per_env_reset=2, num_sgd_iters=2)),
    # the extensions' state (RND's networks, normalisers, optimizer) resumes; the checkpoint
    # names the mirror by its qualified name, registered below
    "pendulum-rnd-symmetry": (Pendulum, dict(
        rnd={"weight": 0.1, "reward_normalization": True, "state_normalization": True},
        symmetry={"data_augmentation_func": Pendulum.mirror, "use_data_augmentation": True,
                  "use_mirror_loss": True, "mirror_loss_coeff": 0.5})),
}  # fmt: skip
rl8.register(Pendulum.mirror)


@pytest.mark.parametrize("case", list(RESUME_CASES))
def test_resume_gives_the_same_losses_in_the_same_run(case, tmp_path, mlflow_uri):
    env, hparams = RESUME_CASES[case]
    keys = ("losses/total", "losses/policy", "losses/vf", "monitors/kl_div", "coefficients/lr")

    straight = make_trainer(make_algo(env, **hparams), tracking=False)
    pick = lambda stats: [stats[k] for k in keys]  # noqa: E731
    expected = [pick(straight.step()) for _ in range(4)]
    straight.close()

    first = make_trainer(
        make_algo(env, **hparams), checkpoint_dir=tmp_path / "ck", log_every=1
    )  # kept by the resume
    got = [pick(first.step()) for _ in range(2)]
    path = first.save_checkpoint()
    first.close("KILLED")  # as if the process had died
    del first

    resumed = Trainer.from_checkpoint(path, progress=False)
    assert resumed.algo.env_steps == 2 * STEP
    got += [pick(resumed.step()) for _ in range(2)]
    run_id = resumed.run_id
    resumed.close()
    assert got == expected  # bitwise: same RNG, env, optimizer, normaliser and schedule state
    assert (
        run_id
        == MlflowClient(mlflow_uri)
        .search_runs([MlflowClient(mlflow_uri).get_run(run_id).info.experiment_id])[0]
        .info.run_id
    )  # one run, continued
    steps = [s for s, _ in history(mlflow_uri, run_id, "losses/total")]
    assert steps == [STEP, 2 * STEP, 3 * STEP, 4 * STEP]
    assert MlflowClient(mlflow_uri).get_run(run_id).info.status == "FINISHED"


def test_resume_from_run_id_and_folder_continues_run_and_conditions(tmp_path, mlflow_uri):
    trainer = make_trainer(checkpoint_dir=tmp_path / "ck", log_every=1)
    trainer.run(
        steps_per_eval=None,
        stop_conditions=[
            HitsUpperBound("algorithm/steps", 2),
            Plateaus("losses/total", patience=50, rtol=0.0),
        ],
    )
    trainer.close()
    saved_count = torch.load(trainer.last_checkpoint, weights_only=True)["trainer"]["stop_conditions"][
        1
    ]["count"]

    by_folder = Trainer.from_checkpoint(tmp_path / "ck", progress=False)
    assert by_folder.algo.steps == 2 and by_folder.run_id == trainer.run_id
    by_folder.close()

    resumed = Trainer.from_checkpoint(trainer.run_id, progress=False)
    plateau = Plateaus("losses/total", patience=50, rtol=0.0)
    resumed.run(stop_conditions=[HitsUpperBound("algorithm/steps", 4), plateau])
    resumed.close()
    assert resumed.algo.steps == 4 and resumed.run_id == trainer.run_id
    assert plateau.reference is not None and plateau.count >= saved_count
    steps = [s for s, _ in history(mlflow_uri, trainer.run_id, "env/steps")]
    assert steps == sorted(set(steps)) == [STEP, 2 * STEP, 3 * STEP, 4 * STEP]


def test_resume_from_another_folder(tmp_path, monkeypatch):
    trainer = make_trainer(tracking_uri="sqlite:///mlflow.db", checkpoint_dir="ck")  # relative
    trainer.step()
    path = trainer.save_checkpoint()
    trainer.close()
    (tmp_path / "elsewhere").mkdir()
    monkeypatch.chdir(tmp_path / "elsewhere")
    resumed = Trainer.from_checkpoint(path, progress=False)
    assert resumed.run_id == trainer.run_id
    resumed.close()
    assert resumed.checkpoint_dir == tmp_path / "ck"


def test_trainer_context_manager_statuses(mlflow_uri):
    with pytest.raises(ZeroDivisionError):
        with make_trainer() as trainer:
            trainer.step()
            1 / 0
    assert MlflowClient(mlflow_uri).get_run(trainer.run_id).info.status == "FAILED"
    with make_trainer() as trainer:
        trainer.step()
    assert MlflowClient(mlflow_uri).get_run(trainer.run_id).info.status == "FINISHED"
    with pytest.raises(RuntimeError, match="closed"):
        trainer.step()


# --------------------------------------------------------------------------------------------
# every run a script starts ends


SCRIPT = """
import sys
import torch
from rl8 import PPO, Trainer
from rl8.training.conditions import HitsUpperBound
from rl8.envs import CartPole

torch.set_num_threads(1)

def main():
    algo = PPO(CartPole, num_envs=16, horizon=8, sgd_minibatch_size=64, num_sgd_iters=1)
    trainer = Trainer(algo, run_name="in-a-function", progress=False)
    trainer.step()
    print(trainer.run_id)
    if sys.argv[1] == "raise":
        raise ValueError("the script fails after training")
    if sys.argv[1] == "interrupt":
        raise KeyboardInterrupt

main()
"""


@pytest.mark.slow
@pytest.mark.parametrize(
    "ending, status", [("return", "FINISHED"), ("raise", "FAILED"), ("interrupt", "KILLED")]
)
def test_a_trainer_made_in_a_function_ends_its_run_at_exit(mlflow_uri, tmp_path, ending, status):
    script = tmp_path / "script.py"
    script.write_text(textwrap.dedent(SCRIPT))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    done = subprocess.run(
        [sys.executable, str(script), ending], env=env, capture_output=True, text=True, timeout=120
    )
    assert (done.returncode == 0) == (ending == "return"), done.stderr
    run_id = done.stdout.split()[0]
    run = MlflowClient(mlflow_uri).get_run(run_id)
    assert run.info.status == status
    assert run.info.end_time is not None
    assert run.data.metrics["env/steps"] == STEP  # the queued metrics were sent before the end


# --------------------------------------------------------------------------------------------
# Trainer.eval() after the first step: an eval env on demand


def eval_stats(stats):
    return {k: v for k, v in stats.items() if k.startswith("eval/")}


def test_eval_after_the_first_step_builds_an_eval_env_on_demand():
    kw = dict(num_envs=32, env_config={"max_episode_steps": 12})  # reset once (the default)
    plain = Trainer(make_algo(**kw), progress=False)
    expected = [plain.step()["losses/total"] for _ in range(2)]
    plain.close()
    trainer = Trainer(make_algo(**kw), progress=False)
    try:
        got = [trainer.step()["losses/total"]]
        a = trainer.eval()
        assert trainer.eval_envs.eval_env.num_envs == 16  # min(num_envs, 16)
        # the training env's config, run for its episode limit: whole episodes in every env
        assert a["eval/episodes/count"] >= 16 and a["eval/episodes/length_mean"] <= 12
        short = trainer.eval(env_config={"max_episode_steps": 5})  # explicit options still apply
        assert short["eval/episodes/length_mean"] <= 5
        assert eval_stats(trainer.eval()) == eval_stats(a)  # the same start state every time
        trainer.eval(deterministic=False)  # samples: torch's RNG untouched
        got.append(trainer.step()["losses/total"])
        assert got == expected  # training goes on as without the evaluations
    finally:
        trainer.close()


def test_run_evaluates_between_reset_boundaries_on_an_eval_env():
    trainer = Trainer(make_algo(horizons_per_env_reset=2), progress=False)
    try:
        stats = trainer.run(steps_per_eval=3, stop_conditions=HitsUpperBound("algorithm/steps", 3))
        assert stats["algorithm/steps"] == 3 and "eval/rollout/reward_sum_mean" in stats
        assert (
            trainer.eval_envs.eval_env is not None
        )  # step 3 is not a reset boundary of the training envs
    finally:
        trainer.close()


# --------------------------------------------------------------------------------------------
# progress: plain lines outside a terminal, the nearest condition, the summary


def run_logged(monkeypatch, **kwargs):
    stream = io.StringIO()  # not a terminal: a log file, a pipe
    monkeypatch.setattr(sys, "stderr", stream)
    trainer = Trainer(make_algo(), **kwargs)
    # a progress line waits for the lines saying where the run goes, which wait for its id (a run
    # starting in the background gets it, on a busy machine, after the first step)
    assert trainer.run_id is not None  # starts the run and waits for its id
    trainer.run(stop_conditions=HitsUpperBound("env/steps", 3 * STEP))
    trainer.close()
    lines = stream.getvalue().splitlines()
    assert lines[0].startswith("rl8: MLflow run ") and lines[1].startswith("rl8: checkpoints in ")
    return lines[2:]


def test_progress_lines_outside_a_terminal_by_default_every_n_seconds(monkeypatch):
    default = run_logged(monkeypatch)  # every 10 s: the first step, the final state, the summary
    assert [line.split(" | ")[0] for line in default] == [
        "rl8 128 env steps",
        "rl8 384 env steps",
        default[-1],
    ]
    assert default[-1].startswith("rl8: stopped by")
    often = run_logged(monkeypatch, progress_every_s=1e-9)  # a line every step, the last once
    assert [line.split(" | ")[0] for line in often[:-1]] == [
        "rl8 128 env steps",
        "rl8 256 env steps",
        "rl8 384 env steps",
    ]
    with pytest.raises(ValueError, match="progress_every_s must be a number of seconds > 0, got 0"):
        Trainer(make_algo(), progress_every_s=0)


def test_run_without_a_stop_condition_warns(monkeypatch):
    trainer = Trainer(make_algo(), progress=False)
    steps = []
    update = trainer.algo.update

    def interrupted_after_two_steps():
        if len(steps) == 2:
            raise KeyboardInterrupt
        steps.append(update())
        return steps[-1]

    monkeypatch.setattr(trainer.algo, "update", interrupted_after_two_steps)
    with pytest.warns(UserWarning, match="no stop_conditions, so training runs until interrupted"):
        with pytest.raises(KeyboardInterrupt):
            trainer.run()
    assert len(steps) == 2


def test_progress_shows_the_condition_with_the_nearest_eta_and_the_eval_return():
    stream = io.StringIO()
    progress = Progress(None, stream, interval_s=1e-9)
    conditions = [HitsUpperBound("env/steps", 10_000), HitsUpperBound("episodes/return_mean", 110)]
    progress.update(
        {"env/steps": 100, "episodes/return_mean": 10.0, "eval/episodes/return_mean": 12.0}, conditions
    )
    time.sleep(0.01)
    progress.update({"env/steps": 200, "episodes/return_mean": 60.0}, conditions)
    line = stream.getvalue().splitlines()[-1]
    # the return target is half way from the first return seen (10) to 110, but two values give
    # it no ETA: the env/steps bound, at 2% and with an ETA, ends the run at the latest
    assert "return 60 | eval return 12 | 2% to env/steps >= 1e+04 | ETA " in line


def test_the_summary_says_which_condition_stopped_training(monkeypatch):
    stream = io.StringIO()
    monkeypatch.setattr(sys, "stderr", stream)
    target = HitsUpperBound("eval/rollout/reward_sum_mean", -1.0)
    trainer = Trainer(make_algo(), progress_every_s=1e-9)
    trainer.run(steps_per_eval=2, stop_conditions=[HitsUpperBound("env/steps", 100 * STEP), target])
    trainer.close()
    assert trainer.stopped_by is target and trainer.algo.steps == 2
    *lines, summary = stream.getvalue().splitlines()
    assert "eval return" not in lines[0] and "eval return" in lines[-1]
    assert summary.startswith(
        "rl8: stopped by HitsUpperBound('eval/rollout/reward_sum_mean', -1.0) after 256 env steps in "
    )
    assert "eval return" in summary


# --------------------------------------------------------------------------------------------
# metrics and params that say what they are


def test_params_are_logged_once(mlflow_uri):
    trainer = Trainer(make_algo(seed=None, device="auto"), progress=False)
    run_id = trainer.run_id  # starts the run, which logs the configuration
    trainer.close()
    params = MlflowClient(mlflow_uri).get_run(run_id).data.params
    assert params["hparams/seed"] == str(trainer.algo.seed)  # the seed drawn, not "None"
    assert params["hparams/device"] == str(trainer.algo.device)  # not "auto"
    assert not {"seed", "device", "env_class"} & set(params)


def test_the_example_config_uses_the_default_experiment_name():
    config = yaml.safe_load((REPO / "examples" / "cartpole.yaml").read_text())
    trainer = Trainer(make_algo(), tracking=False, progress=False)
    trainer.close()
    assert config["experiment"] == trainer.experiment == "CartPole"  # one experiment per env


def test_log_every_logs_every_nth_step_the_evaluations_checkpoints_and_the_last(
    tmp_path, migrated_store
):
    with pytest.raises(ValueError, match="Trainer: log_every must be an int >= 1 or None, got 0"):
        Trainer(PPO(CartPole, num_envs=4, horizon=4, sgd_minibatch_size=16), log_every=0, tracking=False)
    algo = PPO(CartPole, num_envs=4, horizon=4, sgd_minibatch_size=16, seed=0)
    with Trainer(
        algo,
        log_every=4,
        log_models="all",  # both checkpoints, though no evaluation ranks them
        checkpoint_every=7,
        eval_num_envs=2,
        eval_num_steps=4,
        progress=False,
        checkpoint_dir=tmp_path / "ck",
    ) as trainer:
        trainer.run(max_env_steps=16 * 11, steps_per_eval=5)
        run_id = trainer.run_id
    client = MlflowClient()
    history = lambda run, key: sorted(m.step // 16 for m in client.get_metric_history(run, key))  # noqa: E731
    # every 4th step (4, 8); the evaluations (5, 10); checkpoint 7; the last (11)
    assert history(run_id, "env/steps") == [4, 5, 7, 8, 10, 11]
    assert history(run_id, "eval/episodes/count") == [5, 10]
    values = {m.step // 16: m.value for m in client.get_metric_history(run_id, "algorithm/steps")}
    assert values == {s: float(s) for s in [4, 5, 7, 8, 10, 11]}
    models = {
        m.name: {x.key for x in m.metrics}
        for m in client.search_logged_models([client.get_run(run_id).info.experiment_id])
    }
    assert (
        "losses/total" in models["checkpoint-112"] and "losses/total" in models["checkpoint-176"]
    )  # linked
    with Trainer(
        PPO(CartPole, num_envs=4, horizon=4, sgd_minibatch_size=16, seed=0),
        log_every=4,
        progress=False,
        checkpoint_dir=tmp_path / "steps",
    ) as trainer:
        for _ in range(6):
            trainer.step()
    assert history(trainer.run_id, "env/steps") == [4, 6]  # the last step at close


def _runs(uri):
    client = MlflowClient(uri)
    return client.search_runs([e.experiment_id for e in client.search_experiments()])


def test_two_trainers_never_share_a_checkpoint_folder(tmp_path, migrated_store):
    first = make_trainer(checkpoint_dir=tmp_path / "ck", async_logging=False)
    first.step()
    written = first.save_checkpoint()
    # while the first is open: refused, before a second MLflow run is created
    with pytest.raises(
        CheckpointDirError,
        match=rf"{tmp_path / 'ck'} is in use by run {first.run_id}.*close\(\) it first",
    ):
        make_trainer(checkpoint_dir=tmp_path / "ck")
    assert len(_runs(migrated_store)) == 1
    first.close()
    # after it ended: a new run would overwrite and prune its checkpoints (the same step names)
    with pytest.raises(
        CheckpointDirError,
        match=rf"already holds 1 checkpoint\(s\) of run {first.run_id} "
        rf"\(pid {os.getpid()} on .*, ended\) \(latest: {written.name}\).*"
        "rl8 train --resume",
    ):
        make_trainer(checkpoint_dir=tmp_path / "ck")
    assert len(_runs(migrated_store)) == 1
    # resuming that run may: from the folder, the file, or the run id
    for ref in (tmp_path / "ck", written, first.run_id):
        with Trainer.from_checkpoint(ref, progress=False) as resumed:
            assert resumed.checkpoint_dir == tmp_path / "ck" and resumed.run_id == first.run_id
            resumed.step()
            resumed.save_checkpoint()
    # the same without tracking (no run id): resuming from the folder's checkpoint
    untracked = make_trainer(checkpoint_dir=tmp_path / "quiet", tracking=False)
    untracked.save_checkpoint()
    untracked.close()
    with pytest.raises(
        CheckpointDirError, match="quiet already holds 1 checkpoint.* of a run without MLflow tracking"
    ):
        make_trainer(checkpoint_dir=tmp_path / "quiet", tracking=False)
    Trainer.from_checkpoint(tmp_path / "quiet", progress=False).close()


def test_default_folders_of_untracked_runs_are_unique(tmp_path):
    first, second = make_trainer(tracking=False), make_trainer(tracking=False)
    assert first.checkpoint_dir != second.checkpoint_dir
    assert first.checkpoint_dir.parent == second.checkpoint_dir.parent == tmp_path / "checkpoints"
    first.close()
    second.close()


@pytest.mark.parametrize("where", ["under a file", "a file"])
def test_an_unwritable_checkpoint_dir_is_refused_before_training(tmp_path, migrated_store, where):
    (tmp_path / "afile").write_text("a file, not a folder")  # root ignores chmod: a file stops it
    folder = tmp_path / "afile" / "ck" if where == "under a file" else tmp_path / "afile"
    with pytest.raises(
        CheckpointDirError, match=rf"checkpoint_dir {folder} cannot be used for checkpoints"
    ):
        make_trainer(checkpoint_dir=folder)
    assert _runs(migrated_store) == []


def test_an_unwritable_default_checkpoint_folder_is_refused_before_training(tmp_path, migrated_store):
    (tmp_path / "checkpoints").write_text("a file where the default folder goes")
    with pytest.raises(
        CheckpointDirError, match=rf"checkpoint folder {tmp_path / 'checkpoints'} cannot be used"
    ):
        make_trainer()
    assert _runs(migrated_store) == []
