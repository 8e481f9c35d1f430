"""rl8 sweep: the search space's checks, the budget and evaluation plan checked before any trial,
nested MLflow runs with the best on the study's run, pruning, a resumed study, a failing trial,
--no-stop-conditions (docs/sweeps.md); sweeps under faults are tests/test_sweep_faults.py.
Every store is in tmp_path."""

from __future__ import annotations

import re

import pytest

optuna = pytest.importorskip("optuna")
pytest_plugins = ["sweep_support"]  # the fixture files

from sweep_support import sweep_runs  # noqa: E402

from rl8 import sweep  # noqa: E402
from rl8.cli.main import main  # noqa: E402
from rl8.sweeps.space import read_space  # noqa: E402
from rl8.training.config_file import ConfigError  # noqa: E402


@pytest.mark.slow
def test_sweep_nests_trials_under_the_study_run_and_resumes(files):
    args = [
        "sweep",
        files["config"],
        "--space",
        files["space"],
        "--storage",
        files["storage"],
        "--study",
        "s",
    ]
    assert main([*args, "--trials", "4", "--jobs", "2", "--startup-trials", "1", "--seed", "0"]) == 0
    study = optuna.load_study(study_name="s", storage=files["storage"])
    assert [t.number for t in study.trials] == [0, 1, 2, 3]
    assert {t.state.name for t in study.trials} <= {"COMPLETE", "PRUNED"}
    client, parents, children = sweep_runs(files["uri"])
    assert len(parents) == 1 and len(children) == 4
    parent = parents[0]
    assert study.user_attrs["mlflow_run_id"] == parent.info.run_id
    assert parent.data.tags["rl8.sweep.study"] == "s"
    assert parent.data.metrics["best/value"] == study.best_value
    assert parent.data.tags["best/trial"] == str(study.best_trial.number)
    assert parent.data.tags["best/num_minibatches"] == str(study.best_params["num_minibatches"])
    assert float(parent.data.tags["best/lr"]) == pytest.approx(study.best_params["lr"])
    plots = {a.path for a in client.list_artifacts(parent.info.run_id, "plots")}
    assert "plots/optimization_history.png" in plots
    states = {t.number: t.state.name for t in study.trials}
    for run in children:
        assert run.data.tags["mlflow.parentRunId"] == parent.info.run_id
        assert run.data.tags["rl8.sweep.state"] == states[int(run.data.tags["rl8.sweep.trial"])]
        assert float(run.data.params["hparams/lr"]) == pytest.approx(
            study.trials[int(run.data.tags["rl8.sweep.trial"])].params["lr"]
        )

    assert main([*args, "--trials", "2"]) == 0  # resumed: 2 more trials
    study = optuna.load_study(study_name="s", storage=files["storage"])
    assert [t.number for t in study.trials] == [0, 1, 2, 3, 4, 5]
    _, parents, children = sweep_runs(files["uri"])
    assert [p.info.run_id for p in parents] == [parent.info.run_id]
    assert (
        len(children) == 6
        and parents[0].data.metrics["trials/complete"] + parents[0].data.metrics["trials/pruned"] == 6
    )


@pytest.mark.slow
def test_pruned_and_failed_trials_and_the_sweep_goes_on(files):
    space = {
        "env_config.tau": {"type": "categorical", "choices": [0.02, "fast"]}
    }  # "fast": CartPole raises
    study = sweep(
        files["config"],
        space,
        trials=4,
        study="p",
        storage=files["storage"],
        seed=3,
        startup_trials=10,
        pruner=optuna.pruners.ThresholdPruner(lower=1e9),
    )  # prunes at the first evaluation
    states = {t.number: (t.state.name, t.params["env_config.tau"]) for t in study.trials}
    assert sorted(states) == [0, 1, 2, 3]
    assert {tau for _, tau in states.values()} == {0.02, "fast"}, "the seed must sample both choices"
    assert all(state == ("FAIL" if tau == "fast" else "PRUNED") for state, tau in states.values())
    _, _, children = sweep_runs(files["uri"])
    for run in children:
        state, _ = states[int(run.data.tags["rl8.sweep.trial"])]
        assert run.data.tags["rl8.sweep.state"] == state
        assert run.info.status == ("FAILED" if state == "FAIL" else "FINISHED")
        if state == "PRUNED":  # stopped at the first evaluation (2 steps of 128), not at max_steps
            assert run.data.metrics["env/steps"] == 256


@pytest.mark.parametrize(
    "space, message",
    [
        (
            {"learning_rate": {"type": "float", "low": 1e-4, "high": 1e-3}},
            "unknown hyper-parameter 'learning_rate'; did you mean 'lr'",
        ),
        ({"lr": {"type": "float", "low": 1e-3, "high": 1e-3}}, "lr: empty range: low must be < high"),
        (
            {"lr": {"type": "float", "low": 0.0, "high": 1e-3, "log": True}},
            "lr: a log range must be > 0",
        ),
        (
            {"gamma": {"type": "float", "low": -0.5, "high": 0.9, "log": True}},
            "gamma: a log range must be > 0",
        ),
        (
            {"num_minibatches": {"type": "categorical", "choices": [4]}},
            "num_minibatches: choices must be a list of at least 2",
        ),
        (
            {"lr": {"type": "uniform", "low": 1e-4, "high": 1e-3}},
            "lr: expected a mapping with type: float or int or categorical",
        ),
        (
            {"lr": {"type": "float", "low": 1e-4, "hi": 1e-3}},
            "lr: unknown field 'hi' of a float; did you mean 'high'?",
        ),
        ({"horizon": {"type": "int", "low": 8, "high": 32.5}}, "horizon: high must be an int"),
        (
            {"num_minibatches": {"type": "categorical", "choices": [2, 3]}},
            "num_minibatches: 3 is not a valid num_minibatches",
        ),
        (
            {"gamma.x": {"type": "float", "low": 0.9, "high": 0.99}},
            "gamma.x: only the keys of model_config",
        ),
    ],
)
def test_bad_spaces_are_errors_naming_the_entry(space, message):
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace("?", r"\?")):
        read_space(space, {"num_envs": 8, "horizon": 16})


def test_bad_space_file_fails_before_any_trial(files, tmp_path, capsys):
    (tmp_path / "bad.yaml").write_text("lr: {type: float, low: 3.0e-3, high: 1.0e-4}\n")
    args = [
        "sweep",
        files["config"],
        "--space",
        str(tmp_path / "bad.yaml"),
        "--trials",
        "2",
        "--storage",
        files["storage"],
    ]
    assert main(args) == 2
    assert f"{tmp_path / 'bad.yaml'}: lr: empty range" in capsys.readouterr().err
    assert not (tmp_path / "study.db").exists() and not (tmp_path / "mlflow.db").exists()


def test_a_schedule_that_overrides_the_sampled_value_is_an_error():
    with pytest.raises(ConfigError, match="lr: the config's lr_schedule overrides lr"):
        read_space(
            {"lr": {"type": "float", "low": 1e-4, "high": 1e-3}},
            {"lr_schedule": [[0, 1e-3], [1000, 1e-5]]},
        )


@pytest.mark.parametrize(
    "extra, args, space, message",
    [
        (
            "",
            ["--max-env-steps", "128"],
            None,
            "sweep: the budget max_env_steps=128 (--max-env-steps) ends each trial before the first "
            "evaluation, at 256 env steps (steps_per_eval 2 x num_envs 8 x horizon 16), so it would "
            "never report eval/episodes/return_mean: raise the budget to 256 or more "
            "(--max-env-steps 256), or lower steps_per_eval, num_envs or horizon",
        ),
        (
            "max_steps: 100\n",
            [],
            None,
            "sweep: the budget max_steps: 100 of the config ends each trial before the first evaluation",
        ),
        (
            "",
            [],
            "num_envs: {type: categorical, choices: [8, 64]}\n",
            "sweep: the budget max_steps: 768 of the config ends the trials that sample num_envs 64 (the "
            "space's largest) before the first evaluation, at 2048 env steps (steps_per_eval 2 x "
            "num_envs 64 x horizon 16), so they would never report eval/episodes/return_mean: raise the "
            "budget to 2048 or more (--max-env-steps 2048), or lower steps_per_eval, the space's "
            "largest num_envs or horizon",
        ),
        (  # Trainer.run's check_run_plan, before any trial rather than in each
            "checkpoint_every: 3\nregister_as: sweep-model\n",
            [],
            None,
            "sweep: register_as='sweep-model' ranks the checkpoints by 'eval/episodes/return_mean'",
        ),
    ],
)
def test_a_plan_no_trial_could_evaluate_fails_before_any_trial(
    files, tmp_path, capsys, extra, args, space, message
):
    with open(files["config"], "a") as config:  # a later key overrides an earlier one
        config.write(extra)
    if space is not None:
        (tmp_path / "space.yaml").write_text(space)
    argv = ["sweep", files["config"], "--space", files["space"], "--trials", "2"]
    assert main([*argv, "--storage", files["storage"], *args]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"rl8: error: {message}") and err.count("\n") == 1
    assert not (tmp_path / "study.db").exists() and not (tmp_path / "checkpoints").exists()


@pytest.mark.parametrize("value", [0, 1.5, True])
def test_a_bad_max_env_steps_is_an_error(files, tmp_path, value):
    with pytest.raises(
        ConfigError, match=rf"sweep: max_env_steps must be an int >= 1 or None, got {value}$"
    ):
        sweep(files["config"], files["space"], trials=1, storage=files["storage"], max_env_steps=value)
    assert not (tmp_path / "study.db").exists()


@pytest.mark.slow
def test_a_trial_stopped_before_its_first_evaluation_fails_and_its_run_is_failed(files):
    with open(files["config"], "a") as config:  # a condition that holds at the first step
        config.write("stop_conditions: [{hits_upper_bound: {key: env/steps, bound: 128}}]\n")
    study = sweep(files["config"], files["space"], trials=1, study="f", storage=files["storage"], seed=0)
    assert [t.state.name for t in study.trials] == ["FAIL"]
    _, _, (run,) = sweep_runs(files["uri"])
    assert run.info.status == "FAILED" and run.data.tags["rl8.sweep.state"] == "FAIL"


#: A trial's heartbeat every second, stale after 3 s without one (the defaults: 30 s, 120 s).


def test_no_stop_conditions_leaves_out_the_configs_and_each_trial_trains_its_budget(files, capsys):
    with open(files["config"], "a") as config:  # a condition that holds at the first step
        config.write("stop_conditions: [{hits_upper_bound: {key: env/steps, bound: 128}}]\n")
    args = ["sweep", files["config"], "--space", files["space"], "--storage", files["storage"]]
    assert main([*args, "--study", "n", "--trials", "1", "--no-stop-conditions"]) == 0
    assert "rl8: study n: 1 trials (1 complete, 0 pruned, 0 fail)" in capsys.readouterr().out
    _, _, (run,) = sweep_runs(files["uri"])
    assert run.data.metrics["env/steps"] == 768  # the config's max_steps, the budget


@pytest.mark.parametrize(
    "kwargs, env, message",
    [
        (
            {"heartbeat_interval": 0},
            {},
            "heartbeat_interval must be a whole number of seconds >= 1, got 0",
        ),
        ({"grace_period": 2.5}, {}, "grace_period must be a whole number of seconds >= 1, got 2.5"),
        (
            {},
            {"RL8_SWEEP_HEARTBEAT_INTERVAL": "1s"},
            "the environment variable RL8_SWEEP_HEARTBEAT_INTERVAL (heartbeat_interval) must be a "
            "whole number of seconds >= 1, got '1s'",
        ),
        (
            {"heartbeat_interval": 10},
            {"RL8_SWEEP_GRACE_PERIOD": "10"},
            "grace_period must be more than heartbeat_interval (10 s), got 10",
        ),
    ],
)
def test_a_bad_heartbeat_setting_is_an_error_before_any_study(
    files, tmp_path, monkeypatch, kwargs, env, message
):
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    with pytest.raises(ConfigError, match=re.escape(f"sweep: {message}") + "$"):
        sweep(files["config"], files["space"], trials=1, storage=files["storage"], **kwargs)
    assert not (tmp_path / "study.db").exists()
