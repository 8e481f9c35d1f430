"""Policies as MLflow models (docs/tracking.md#policies-as-mlflow-models): the checkpoints that
log_models names as logged models linked to their step's stats and the run's params, the rl8 pyfunc flavor, the Model Registry, serving, and
model folders that cannot run code (docs/security.md)."""

from __future__ import annotations

import contextlib
import json
import os
import pickle
import re
import shutil
import signal
import subprocess
import sys
import textwrap
import threading
import time
import urllib.request
from pathlib import Path

import hparams
import mlflow
import mlflow.pyfunc
import numpy as np
import pandas as pd
import pytest
import torch
from gymnasium import spaces
from launch import free_port
from mlflow import MlflowClient
from mlflow.entities import LoggedModelStatus
from mlflow.types import Schema

from rl8 import PPO, Policy, Trainer, load_policy
from rl8.cli.main import build_parser, main
from rl8.envs import CartPole
from rl8.io.checkpoint import CheckpointError, load_checkpoint, save_checkpoint
from rl8.io.mlflow_model import save_model
from rl8.tracking import Tracker
from rl8.tracking.common import TrackingWarning
from rl8.training import resume
from rl8.training.config import TrainerConfig

ROOT = Path(__file__).resolve().parents[1]
RETURN = "eval/episodes/return_mean"
SMALL = {**hparams.SMALL, "num_envs": 8, "horizon": 16}
OBS = np.random.default_rng(0).normal(size=(6, 4)).astype(np.float32)


@pytest.fixture(scope="module")
def run(tmp_path_factory, template_db):
    """One tiny CartPole run shared by the module: 6 steps, evaluations and checkpoints every 2
    (3 logged models: ``log_models="all"``), registered as ``cartpole-ppo``, with system metrics."""
    folder = tmp_path_factory.mktemp("mlflow-models")
    shutil.copy(template_db, folder / "mlflow.db")
    uri = f"sqlite:///{folder / 'mlflow.db'}"
    saved = os.environ.get("MLFLOW_SYSTEM_METRICS_SAMPLING_INTERVAL")
    os.environ["MLFLOW_SYSTEM_METRICS_SAMPLING_INTERVAL"] = "0.2"
    torch.set_num_threads(1)
    try:  # in the folder: the store puts its artifacts (./mlruns) in the working folder
        with (
            contextlib.chdir(folder),
            Trainer(
                PPO(CartPole, **SMALL),
                tracking_uri=uri,
                experiment="models",
                checkpoint_dir=folder / "ckpt",
                register_as="cartpole-ppo",
                log_models="all",
                checkpoint_every=2,
                eval_num_envs=4,
                eval_num_steps=64,
                progress=False,
                system_metrics=True,
            ) as trainer,
        ):
            trainer.run(max_env_steps=6 * 8 * 16, steps_per_eval=2)
            with pytest.raises(ValueError, match="has the stat 'eval/never'") as missing:
                trainer.register_best(metric="eval/never")
            run_id, experiment_id = trainer.run_id, trainer.tracker.experiment_id
    finally:
        if saved is None:
            del os.environ["MLFLOW_SYSTEM_METRICS_SAMPLING_INTERVAL"]
        else:
            os.environ["MLFLOW_SYSTEM_METRICS_SAMPLING_INTERVAL"] = saved
    return {
        "uri": uri,
        "run_id": run_id,
        "experiment_id": experiment_id,
        "missing": missing.value,
        "folder": folder,
    }


@pytest.fixture
def store(run, monkeypatch):
    """The shared run's store as MLflow's default (for mlflow.pyfunc.load_model)."""
    monkeypatch.setenv("MLFLOW_TRACKING_URI", run["uri"])
    mlflow.set_tracking_uri(run["uri"])
    return run


def logged_models(run):
    return mlflow.search_logged_models(
        experiment_ids=[run["experiment_id"]],
        filter_string=f"source_run_id = '{run['run_id']}'",
        order_by=[{"field_name": f"metrics.{RETURN}", "ascending": False}],
        output_format="list",
    )


def test_every_checkpoint_is_a_logged_model_linked_to_its_step_stats(store):
    models = logged_models(store)
    assert sorted(m.name for m in models) == ["checkpoint-256", "checkpoint-512", "checkpoint-768"]
    assert all(m.status == LoggedModelStatus.READY for m in models)
    client = MlflowClient(store["uri"])
    history = {m.step: m.value for m in client.get_metric_history(store["run_id"], RETURN)}
    ranked = []
    for model in models:
        step = int(model.name.split("-")[1])
        linked = {m.key: m for m in model.metrics}
        assert linked[RETURN].value == history[step] and linked[RETURN].step == step
        assert {"losses/total", "env/steps"} <= set(linked) and linked["env/steps"].value == step
        ranked.append(linked[RETURN].value)
    assert ranked == sorted(ranked, reverse=True)  # search_logged_models ranks them by the stat
    assert len(history) == 3  # linking logged no second copy of the values in the run
    outputs = client.get_run(store["run_id"]).outputs.model_outputs
    assert sorted(o.step for o in outputs) == [256, 512, 768]


def test_the_pyfunc_predicts_what_load_policy_predicts(store, tmp_path):
    best = logged_models(store)[0]
    for uri in (f"models:/{best.model_id}", f"runs:/{store['run_id']}/policy"):
        model = mlflow.pyfunc.load_model(uri)
        expected, _ = load_policy(uri, tracking_uri=store["uri"]).predict(OBS)
        assert np.array_equal(model.predict(OBS), expected)
        assert np.array_equal(model.predict(pd.DataFrame(OBS)), expected)
        assert model.predict(OBS, params={"deterministic": False}).shape == (6,)
    signature = model.metadata.signature
    assert signature.inputs is None  # MLflow would refuse all but float32; the model checks
    inputs = Schema.from_json(model.metadata.flavors["rl8"]["inputs"])
    assert [(s.type, s.shape) for s in inputs.inputs] == [(np.dtype("float32"), (-1, 4))]
    assert [(s.type, s.shape) for s in signature.outputs.inputs] == [(np.dtype("int64"), (-1,))]
    assert np.asarray(model.input_example).shape == (2, 4)
    folder = save_model(
        load_policy(f"models:/{best.model_id}", tracking_uri=store["uri"]), tmp_path / "m"
    )
    assert np.array_equal(
        mlflow.pyfunc.load_model(str(folder)).predict(OBS), load_policy(folder).predict(OBS)[0]
    )


def test_the_pyfunc_casts_a_float64_batch_and_reads_a_data_frame_of_features(store):
    best = logged_models(store)[0]
    model = mlflow.pyfunc.load_model(f"models:/{best.model_id}")
    policy = load_policy(f"models:/{best.model_id}", tracking_uri=store["uri"])
    expected = policy.predict(OBS)[0]
    assert np.array_equal(model.predict(OBS.astype(np.float64)), expected)  # float64 to float32
    assert np.array_equal(
        model.predict(np.zeros((2, 4))), policy.predict(np.zeros((2, 4), np.float32))[0]
    )
    assert np.array_equal(model.predict(np.ones((2, 4), np.int64)), policy.predict(np.ones((2, 4)))[0])
    columns = ["x", "x_dot", "theta", "theta_dot"]
    assert np.array_equal(model.predict(pd.DataFrame(OBS.astype(np.float64), columns=columns)), expected)
    assert np.array_equal(model.predict(OBS[0].tolist()), expected[:1])  # one observation
    with pytest.raises(
        ValueError,
        match=re.escape(
            "expected a batch of observations [B, 4] (or one of shape (4,)), got shape (2, 3)"
        ),
    ):
        model.predict(np.zeros((2, 3)))
    with pytest.raises(
        ValueError,
        match=re.escape(
            "model input: expected a DataFrame of 4 columns (the flat features of an observation of shape (4,)), got 3 columns"
        ),
    ):
        model.predict(pd.DataFrame(np.zeros((2, 3))))
    with pytest.raises(
        ValueError,
        match=re.escape(
            "model input: expected float32 values (numbers of any width and bools are cast), got <U1 values"
        ),
    ):
        model.predict(np.array([["a"] * 4]))


def test_the_pyfunc_of_integer_observations_refuses_floats(tmp_path):
    space = spaces.Dict({"cell": spaces.Discrete(5), "level": spaces.Box(0, 255, (3,), np.uint8)})
    folder = save_model(Policy(space, spaces.Discrete(3)), tmp_path / "m")
    model = mlflow.pyfunc.load_model(str(folder))
    batch = {"cell": np.array([1, 4]), "level": np.full((2, 3), 200, np.int64)}
    expected = load_policy(folder).predict(batch)[0]
    assert np.array_equal(model.predict(batch), expected)  # int64 to uint8: the values fit
    frame = pd.DataFrame({"cell": [1, 4], "level": list(batch["level"])})
    assert np.array_equal(model.predict(frame), expected)
    ints = "ints and bools are cast, floats are not: they need not be whole"
    with pytest.raises(
        ValueError,
        match=re.escape(f"model input['cell']: expected int64 values ({ints}), got float64 values"),
    ):
        model.predict({**batch, "cell": np.array([1.0, 4.0])})
    with pytest.raises(
        ValueError,
        match=re.escape(
            "model input['level']: expected uint8 values in [0, 255], got values in [256, 256]"
        ),
    ):
        model.predict({**batch, "level": np.full((2, 3), 256)})


def test_a_dict_observation_policy_is_a_pyfunc_of_named_tensors(tmp_path):
    observation_space = spaces.Dict(
        {"token": spaces.Box(0, 9, (1,), np.float32), "state": spaces.Box(-1, 1, (3,), np.float32)}
    )
    folder = save_model(Policy(observation_space, spaces.Box(-1, 1, (2,), np.float32)), tmp_path / "m")
    model = mlflow.pyfunc.load_model(str(folder))
    batch = {"token": np.arange(3, dtype=np.float32).reshape(3, 1), "state": OBS[:3, :3]}
    expected = load_policy(folder).predict(batch)[0]
    assert expected.shape == (3, 2) and np.array_equal(model.predict(batch), expected)
    frame = pd.DataFrame({"token": list(batch["token"]), "state": list(batch["state"])})
    assert np.array_equal(model.predict(frame), expected)
    inputs = Schema.from_json(model.metadata.flavors["rl8"]["inputs"])
    assert sorted(s.name for s in inputs.inputs) == ["state", "token"]


def test_the_best_checkpoint_is_registered_with_the_alias_best(store):
    client = MlflowClient(store["uri"], registry_uri=store["uri"])
    version = client.get_model_version_by_alias("cartpole-ppo", "best")
    best = logged_models(store)[0]
    assert str(version.version) == "1" and version.source == best.artifact_location
    assert version.run_id == store["run_id"]
    by_alias = load_policy("models:/cartpole-ppo@best", tracking_uri=store["uri"])
    by_version = load_policy("models:/cartpole-ppo/1", tracking_uri=store["uri"])
    by_id = load_policy(f"models:/{best.model_id}", tracking_uri=store["uri"])
    for policy in (by_alias, by_version):
        assert all(
            torch.equal(a, b) for a, b in zip(policy.state_dict().values(), by_id.state_dict().values())
        )
    assert np.array_equal(
        mlflow.pyfunc.load_model("models:/cartpole-ppo@best").predict(OBS), by_id.predict(OBS)[0]
    )
    assert "no logged model (checkpoint)" in str(store["missing"])
    assert (
        main(["eval", "models:/cartpole-ppo@best", "--episodes", "2", "--tracking-uri", store["uri"]])
        == 0
    )


def test_system_metrics_are_logged_when_asked(store):
    metrics = MlflowClient(store["uri"]).get_run(store["run_id"]).data.metrics
    assert {"system/cpu_utilization_percentage", "system/system_memory_usage_megabytes"} <= set(metrics)
    assert TrainerConfig().system_metrics is False  # opt-in


def registered_checkpoint(trainer: Trainer, name: str, version: str) -> str:
    """The name (``checkpoint-<env steps>``) of the logged model of ``trainer``'s run that version
    ``version`` of ``name`` was registered from."""
    source = MlflowClient().get_model_version(name, version).source
    models = mlflow.search_logged_models([trainer.tracker.experiment_id], output_format="list")
    [model] = [m for m in models if m.artifact_location == source]
    return model.name


def test_register_as_with_an_eval_plan_checkpoints_at_the_evaluations(migrated_store, capsys):
    trainer = Trainer(PPO(CartPole, **SMALL), register_as="x", eval_num_envs=4, eval_num_steps=64)
    with trainer:  # no checkpoint_every: a checkpoint at every evaluation, ranked by its return
        trainer.run(max_env_steps=5 * 128, steps_per_eval=2)
    err = capsys.readouterr().err
    line = re.search(
        r"rl8: registered 'x' version 1 \(models:/x@best\): the checkpoint at step (\d+) "
        rf"\(ranked by {RETURN} = [-\d.e+]+\)\n",
        err,
    )
    assert line is not None, err
    assert line[1] in ("256", "512")  # an evaluation's, not the final one (step 640)
    assert registered_checkpoint(trainer, "x", "1") == f"checkpoint-{line[1]}"


def test_register_as_without_an_eval_plan_registers_the_final_checkpoint(migrated_store, capsys):
    with Trainer(PPO(CartPole, **SMALL), register_as="x") as trainer:
        trainer.run(max_env_steps=3 * 128)
    assert (
        "rl8: registered 'x' version 1 (models:/x@best): the final checkpoint at step 384 (no eval "
        "plan: ranked by the training return episodes/return_mean = "
    ) in capsys.readouterr().err
    assert registered_checkpoint(trainer, "x", "1") == "checkpoint-384"


@pytest.mark.parametrize(
    "options, steps_per_eval, message",
    [
        (
            {"checkpoint_every": 3},
            2,
            "Trainer.run: register_as='x' ranks the checkpoints by 'eval/episodes/return_mean' (register_metric), "
            "an evaluation stat, which only the checkpoints written at evaluation steps have: set "
            "checkpoint_every (now 3) to a multiple of steps_per_eval (now 2), or leave it None",
        ),
        (
            {"register_metric": RETURN},
            None,
            "Trainer.run: register_as='x' ranks the checkpoints by 'eval/episodes/return_mean' (register_metric), "
            "an evaluation stat, but steps_per_eval is None (this run never evaluates): pass steps_per_eval=N",
        ),
    ],
)
def test_registering_by_an_eval_stat_no_checkpoint_has_is_an_error_before_training(
    migrated_store, options, steps_per_eval, message
):
    with Trainer(PPO(CartPole, **SMALL), register_as="x", progress=False, **options) as trainer:
        with pytest.raises(ValueError, match=re.escape(message)):
            trainer.run(max_env_steps=256, steps_per_eval=steps_per_eval)
        assert trainer.algo.steps == 0


def test_rl8_train_register_checks_the_plan_before_training(migrated_store, capsys):
    assert (
        build_parser().parse_args(["train", "--register", "cartpole-ppo"]).register_as == "cartpole-ppo"
    )
    argv = ["train", "--env", "rl8.envs.CartPole", "--max-steps", "64", "--register", "x"]
    assert main([*argv, "--steps-per-eval", "2", "--checkpoint-every", "3"]) == 2
    assert "checkpoint_every (now 3) to a multiple of steps_per_eval (now 2)" in capsys.readouterr().err
    with pytest.raises(
        ValueError, match="register_as='x' registers in MLflow's Model Registry, but tracking=False"
    ):
        Trainer(PPO(CartPole, **SMALL), register_as="x", tracking=False)


def test_a_failure_to_log_the_model_keeps_the_checkpoint(migrated_store, monkeypatch):
    def broken(*args, **kwargs):
        raise RuntimeError("disk on fire")

    monkeypatch.setattr(resume, "save_model", broken)
    with Trainer(PPO(CartPole, **SMALL), progress=False) as trainer:
        with pytest.warns(TrackingWarning, match="disk on fire.*the checkpoint is written"):
            path = trainer.save_checkpoint()
    assert load_checkpoint(path)["algo"]["counters"] is not None


def test_a_model_delivery_that_fails_midway_goes_on_without_a_second_model(
    migrated_store, tmp_path, monkeypatch
):
    folder = save_model(PPO(CartPole, **SMALL).policy, tmp_path / "m")
    upload, calls = MlflowClient.log_model_artifacts, []

    def flaky(self, *args, **kwargs):
        calls.append(args)
        if len(calls) == 1:
            raise ConnectionError("server went away")
        return upload(self, *args, **kwargs)

    monkeypatch.setattr(MlflowClient, "log_model_artifacts", flaky)
    with Tracker(experiment="flaky", retry_interval_s=0.0) as tracker:
        tracker.log_metrics({"eval/episodes/return_mean": 7.0}, step=64)
        with pytest.warns(TrackingWarning, match="server went away"):
            tracker.log_model(folder, "checkpoint-64", step=64)
        assert tracker.pending_artifacts == 1 and tracker.flush() and len(calls) == 2
    models = mlflow.search_logged_models(experiment_ids=[tracker.experiment_id], output_format="list")
    assert [(m.name, m.status, [(x.key, x.value, x.step) for x in m.metrics]) for m in models] == [
        ("checkpoint-64", LoggedModelStatus.READY, [("eval/episodes/return_mean", 7.0, 64)])
    ]


def test_a_logged_model_carries_the_run_params(store):
    run = MlflowClient(store["uri"]).get_run(store["run_id"])
    for model in logged_models(store):
        assert model.params == run.data.params
    assert {"hparams/num_envs", "trainer/log_models", "trainer/checkpoint_every"} <= set(run.data.params)
    assert model.params["trainer/log_models"] == "all"


def test_a_long_param_is_cut_on_the_logged_model_as_on_the_run(migrated_store, tmp_path):
    folder = save_model(PPO(CartPole, **SMALL).policy, tmp_path / "m")
    with Tracker(experiment="long") as tracker:
        tracker.log_params({"notes": "x" * 7000, "n": 3})
        tracker.log_model(folder, "checkpoint-64", step=64)
        run_params = MlflowClient().get_run(tracker.run_id).data.params
    (model,) = mlflow.search_logged_models(experiment_ids=[tracker.experiment_id], output_format="list")
    assert model.params == run_params == {"notes": "x" * 6000, "n": "3"}


def _checkpoint_models(uri, log_models, **options):
    """A run of 8 training steps that evaluates and checkpoints every 2 (4 checkpoints); the
    names of its logged models, and the return of each checkpoint, by env step."""
    with Trainer(
        PPO(CartPole, **SMALL),
        log_models=log_models,
        checkpoint_every=2,
        eval_num_envs=4,
        eval_num_steps=64,
        progress=False,
        **options,
    ) as trainer:
        trainer.run(max_env_steps=8 * 8 * 16, steps_per_eval=2)
    client = MlflowClient(uri)
    models = client.search_logged_models(
        [trainer.tracker.experiment_id], filter_string=f"source_run_id = '{trainer.run_id}'"
    )
    returns = {m.step: m.value for m in client.get_metric_history(trainer.run_id, RETURN)}
    return trainer, sorted(m.name for m in models), returns


@pytest.mark.parametrize("log_models", ["all", "best_and_last", "none"])
def test_log_models_says_which_checkpoints_are_logged_models(migrated_store, log_models):
    trainer, names, returns = _checkpoint_models(migrated_store, log_models, register_as="ppo")
    steps = [256, 512, 768, 1024]  # an evaluation without a whole episode logs no return
    assert returns and set(returns) <= set(steps)
    best = max(returns, key=lambda s: (returns[s], -s))  # the first of equal returns
    expected = {
        "all": steps,
        "best_and_last": sorted({best, steps[-1]}),
        "none": [],
    }[log_models]
    assert names == sorted(f"checkpoint-{s}" for s in expected)
    client = MlflowClient(migrated_store)
    artifacts = {a.path for a in client.list_artifacts(trainer.run_id)}
    assert "policy" in artifacts and ("best_policy" in artifacts) == (log_models == "none")
    version = MlflowClient(migrated_store, registry_uri=migrated_store).get_model_version_by_alias(
        "ppo", "best"
    )
    assert version.description.startswith(f"checkpoint-{best} of run {trainer.run_id}")
    assert load_checkpoint(trainer.last_checkpoint)["trainer"]["best_checkpoint"] == {
        "metric": RETURN,
        "mode": "max",
        "step": best,
        "value": returns[best],
    }


def test_a_resumed_run_goes_on_from_its_best_checkpoint(migrated_store):
    trainer, names, returns = _checkpoint_models(migrated_store, "best_and_last")
    best = max(returns, key=lambda s: (returns[s], -s))
    with Trainer.from_checkpoint(trainer.last_checkpoint, progress=False) as resumed:
        resumed.step()  # no evaluation: no return, so no new best
        path = resumed.save_checkpoint()
    assert load_checkpoint(path)["trainer"]["best_checkpoint"]["step"] == best
    models = MlflowClient(migrated_store).search_logged_models(
        [trainer.tracker.experiment_id], filter_string=f"source_run_id = '{trainer.run_id}'"
    )
    assert sorted(m.name for m in models) == sorted({f"checkpoint-{best}", "checkpoint-1152"})


def test_best_and_last_is_the_default_and_a_bad_value_is_refused():
    assert TrainerConfig().log_models == "best_and_last"
    with pytest.raises(
        ValueError,
        match=r"Trainer: log_models must be one of 'all', 'best_and_last', 'none', got 'every'",
    ):
        TrainerConfig(log_models="every")
    with pytest.raises(ValueError, match="log_models must be one of 'all', 'best_and_last', 'none'"):
        TrainerConfig.read_option("log_models", "best")
    assert build_parser().parse_args(["train", "--log-models", "none"]).log_models == "none"


def test_best_and_last_replaces_the_checkpoints_that_are_no_longer_kept():
    ranking = resume.LoggedModels("best_and_last", RETURN, "max")
    replaced = [
        ranking.checkpoint(step, value, last).replaces
        for step, value, last in [
            (10, 1.0, None),
            (20, None, 10),
            (30, 3.0, 20),
            (40, 2.0, 30),
            (50, None, 40),
        ]
    ]
    assert replaced == [(), (), ("checkpoint-20", "checkpoint-10"), (), ("checkpoint-40",)]
    assert ranking.best == {"metric": RETURN, "mode": "max", "step": 30, "value": 3.0}
    lowest = resume.LoggedModels("best_and_last", "losses/total", "min")
    assert [
        lowest.checkpoint(s, v, s - 10 or None).replaces for s, v in [(10, 2.0), (20, 1.0), (30, 1.0)]
    ] == [
        (),
        ("checkpoint-10",),
        (),
    ]
    assert lowest.best["step"] == 20  # a tie is no new best
    none = resume.LoggedModels("none", RETURN, "max")
    assert [none.checkpoint(s, v, None) for s, v in [(10, 1.0), (20, float("nan")), (30, 0.5)]] == [
        resume.CheckpointModels(log_model=False, best_policy=True),
        resume.CheckpointModels(log_model=False),
        resume.CheckpointModels(log_model=False),
    ]
    # a resumed run keeps its best only under the same ranking
    assert resume.LoggedModels("all", RETURN, "max", best=ranking.best).best == ranking.best
    assert resume.LoggedModels("all", RETURN, "min", best=ranking.best).best is None


def test_a_replaced_model_that_is_registered_is_kept(migrated_store, tmp_path):
    folder = save_model(PPO(CartPole, **SMALL).policy, tmp_path / "m")
    with Tracker(experiment="kept") as tracker:
        tracker.log_metrics({RETURN: 5.0}, step=64)
        tracker.log_model(folder, "checkpoint-64", step=64)
        assert tracker.register_best("kept-ppo", RETURN) == ("1", 5.0, 64)
        tracker.log_model(folder, "checkpoint-128", step=128, replaces=["checkpoint-64"])
        tracker.log_model(folder, "checkpoint-192", step=192, replaces=["checkpoint-128"])
    models = mlflow.search_logged_models(experiment_ids=[tracker.experiment_id], output_format="list")
    tags = {m.name: m.tags.get("mlflow.modelVersions") for m in models}
    assert tags == {"checkpoint-64": '[{"name": "kept-ppo", "version": "1"}]', "checkpoint-192": None}
    assert load_policy("models:/kept-ppo@best", tracking_uri=migrated_store) is not None


def test_register_as_works_without_logged_models(migrated_store):
    trainer, names, returns = _checkpoint_models(migrated_store, "none", register_as="none-ppo")
    assert names == []
    client = MlflowClient(migrated_store, registry_uri=migrated_store)
    version = client.get_model_version_by_alias("none-ppo", "best")
    best = max(returns, key=lambda s: (returns[s], -s))
    assert version.source.endswith(f"{trainer.run_id}/artifacts/best_policy")
    assert version.description.startswith(f"checkpoint-{best} of run {trainer.run_id}")
    registered = load_policy("models:/none-ppo@best", tracking_uri=migrated_store)
    at_best = load_policy(trainer.checkpoint_dir / f"checkpoint-{best:012d}.pt")
    assert all(
        torch.equal(a, b)
        for a, b in zip(registered.state_dict().values(), at_best.state_dict().values(), strict=True)
    )
    with Trainer(PPO(CartPole, **SMALL), log_models="none", progress=False) as other:
        # no run yet, so no eval plan: ranked by the training return
        with pytest.raises(
            ValueError,
            match=r"with log_models='none' the run keeps only the best checkpoint by "
            r"register_metric='episodes/return_mean' \(register_mode='max'\), got "
            r"metric='losses/total', mode='max'",
        ):
            other.register_best("x", metric="losses/total")
        with pytest.raises(ValueError, match="no checkpoint of MLflow run .* has the stat"):
            other.register_best("x")


# ------------------------------------------------------------ model folders that cannot run code


class Payload:
    """Unpickling it would touch the marker file (what a crafted python_model.pkl does)."""

    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return (Path.touch, (Path(self.marker),))


def pickled_python_model(folder: Path, marker: Path) -> Path:
    """A model folder as mlflow.pyfunc.log_model(python_model=...) writes it: a cloudpickle."""
    folder.mkdir(parents=True)
    (folder / "python_model.pkl").write_bytes(pickle.dumps(Payload(marker)))
    (folder / "MLmodel").write_text(
        textwrap.dedent("""
        flavors:
          python_function:
            cloudpickle_version: 3.0.0
            loader_module: mlflow.pyfunc.model
            python_model: python_model.pkl
            python_version: 3.11.7
    """)
    )
    return folder


def test_a_pickled_python_model_folder_is_refused(store, tmp_path):
    marker = tmp_path / "ran"
    folder = pickled_python_model(tmp_path / "evil", marker)
    with pytest.raises(
        CheckpointError,
        match=r"not an rl8 policy: its MLmodel has no 'rl8' flavor.*"
        r"flavors: \['python_function'\]",
    ):
        load_policy(folder)
    client = MlflowClient(store["uri"])
    model = client.create_logged_model(store["experiment_id"], name="evil")
    client.log_model_artifacts(model.model_id, str(folder))
    with pytest.raises(CheckpointError, match="never a pickled python_model"):
        load_policy(f"models:/{model.model_id}", tracking_uri=store["uri"])
    assert not marker.exists()


@pytest.mark.parametrize("flavor", ["{data: ../policy.pt}", "{data: /etc/passwd}", "[]", "{}"])
def test_an_rl8_flavor_naming_another_file_is_refused(tmp_path, flavor):
    folder = tmp_path / "m"
    folder.mkdir()
    (folder / "MLmodel").write_text(f"flavors:\n  rl8: {flavor}\n")
    with pytest.raises(CheckpointError, match="with data 'policy.pt'"):
        load_policy(folder)


def test_an_rl8_model_folder_naming_an_unregistered_class_imports_nothing(store, tmp_path, monkeypatch):
    lib, marker = tmp_path / "lib", tmp_path / "imported"
    lib.mkdir()
    (lib / "rl8_evil_models.py").write_text(f"import pathlib\npathlib.Path({str(marker)!r}).touch()\n")
    monkeypatch.syspath_prepend(str(lib))
    folder = save_model(PPO(CartPole, **SMALL).policy, tmp_path / "m")
    state = load_checkpoint(folder / "policy.pt")
    state["model_cls"] = "rl8_evil_models.Model"
    save_checkpoint(state, folder / "policy.pt")
    for load in (load_policy, mlflow.pyfunc.load_model):  # MLflow's loader goes through load_policy
        with pytest.raises(CheckpointError, match="'rl8_evil_models.Model', which is not registered"):
            load(str(folder))
    assert "rl8_evil_models" not in sys.modules and not marker.exists()


# ------------------------------------------------------------------------------------ serving


def post(port: int, body: dict) -> dict:
    request = urllib.request.Request(
        f"http://127.0.0.1:{port}/invocations",
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=10) as answer:
        return json.loads(answer.read())


def wait_until_up(port: int, timeout_s: float, alive=lambda: True) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and alive():
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/ping", timeout=2):
                return
        except OSError:
            time.sleep(0.2)
    raise AssertionError(f"the scoring server on port {port} did not answer within {timeout_s} s")


def test_the_scoring_server_app_answers_in_process(store):
    import uvicorn
    from mlflow.pyfunc import scoring_server

    best = logged_models(store)[0]
    app = scoring_server.init(mlflow.pyfunc.load_model(f"models:/{best.model_id}"))
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    try:
        wait_until_up(port, 20)
        expected = load_policy(f"models:/{best.model_id}", tracking_uri=store["uri"]).predict(OBS)[0]
        assert post(port, {"inputs": OBS.tolist()}) == {"predictions": expected.tolist()}
        frame = {"dataframe_split": {"columns": list("abcd"), "data": OBS.tolist()}}
        assert post(port, frame) == {"predictions": expected.tolist()}
    finally:
        server.should_exit = True
        thread.join(10)


@pytest.mark.slow
def test_mlflow_models_serve_serves_a_logged_policy(store, tmp_path):
    """``mlflow models serve --env-manager local`` (no network: no virtualenv is built)."""
    best = logged_models(store)[0]
    port = free_port()
    env = {**os.environ, "MLFLOW_TRACKING_URI": store["uri"], "PYTHONPATH": str(ROOT)}
    log = open(tmp_path / "serve.log", "wb")
    server = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "mlflow",
            "models",
            "serve",
            "-m",
            f"models:/{best.model_id}",
            "--env-manager",
            "local",
            "-h",
            "127.0.0.1",
            "-p",
            str(port),
        ],
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    try:
        wait_until_up(port, 120, alive=lambda: server.poll() is None)
        expected = load_policy(f"models:/{best.model_id}", tracking_uri=store["uri"]).predict(OBS)[0]
        assert post(port, {"inputs": OBS.tolist()}) == {"predictions": expected.tolist()}
    finally:
        os.killpg(server.pid, signal.SIGTERM)  # the server's process group: mlflow and its uvicorn
        try:
            server.wait(20)
        except subprocess.TimeoutExpired:
            os.killpg(server.pid, signal.SIGKILL)
            server.wait(5)
        log.close()
