"""The rl8 command: train from YAML and flags, config errors, resume, eval, --version."""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
import textwrap
import types

import hparams
import pytest
from cli_errors import one_error_line
from mlflow.tracking import MlflowClient

import rl8
from rl8 import PPO, Trainer, save_policy
from rl8.cli import ConfigError, load_config, main
from rl8.cli.main import build_parser
from rl8.envs import CartPole, Pendulum
from rl8.training.conditions import MAX_CONDITION_DEPTH, from_config

pytestmark = pytest.mark.usefixtures("migrated_store", "one_torch_thread")

TINY_SET = [arg for name, value in hparams.SMALL.items() for arg in ("--set", f"{name}={value}")]
SMALL = {**hparams.SMALL, "num_envs": 4, "sgd_minibatch_size": 16}


def write(tmp_path, text, name="config.yaml"):
    path = tmp_path / name
    path.write_text(textwrap.dedent(text))
    return str(path)


def summary(out: str) -> dict[str, str]:
    fields = dict(re.findall(r"^(run id|checkpoint|mlflow ui|resume):\s+(.*)$", out, re.M))
    return fields


def all_runs(uri):
    client = MlflowClient(uri)
    return client.search_runs([e.experiment_id for e in client.search_experiments()])


# --------------------------------------------------------------------------------------------
# train


def test_train_a_named_task_from_the_rsl_rl_config_its_simulator_registers(
    monkeypatch, capsys, mlflow_uri
):
    from pathlib import Path

    from rl8.envs import tasks

    monkeypatch.syspath_prepend(str(Path(__file__).parent / "envs"))  # sim_fakes
    monkeypatch.setitem(tasks.TASK_PREFIXES, "mjlab", "sim_fakes.make_point_mass")
    monkeypatch.setitem(tasks.TASK_RUNNER_CONFIGS, "mjlab", "sim_fakes.point_mass_runner_cfg")
    argv = ["train", "--env", "mjlab:PointMass", "--set", "num_envs=4", "--max-steps", "32"]
    assert main([*argv, "--task-hparams", "--set", "lr=1e-3", "--quiet"]) == 0
    (run,) = all_runs(mlflow_uri)
    assert run.data.params["hparams/horizon"] == "8"  # the runner config's num_steps_per_env
    assert run.data.params["hparams/model_config/hiddens"] == "[16, 16]"
    assert run.data.params["hparams/lr"] == "0.001"  # --set wins
    capsys.readouterr()
    assert main(["train", "--env", "rl8.envs.CartPole", "--task-hparams"]) == 2
    assert (
        "--task-hparams needs a named task of a simulator that registers rsl_rl configs "
        "('<prefix>:<task>' with a prefix of ['isaaclab', 'mjlab']), got env 'rl8.envs.CartPole'"
    ) in capsys.readouterr().err
    assert main(["train", "--env", "mjlab:Nope", "--task-hparams"]) == 2
    assert "--task-hparams: env 'mjlab:Nope': unknown task 'Nope'" in capsys.readouterr().err


def test_train_from_a_yaml_config(tmp_path, capsys, mlflow_uri):
    config = write(
        tmp_path,
        """
        env: rl8.envs.CartPole
        hparams:
          num_envs: 16
          horizon: 8
          sgd_minibatch_size: 64
          num_sgd_iters: 1
          seed: 0
          lr: 3e-4                # PyYAML reads this as a string: rl8 makes it a number
          model_config: {hiddens: [16, 16]}
        env_config: {max_episode_steps: 20}
        stop_conditions:
          - hits_upper_bound: {key: algorithm/steps, bound: 3}
        max_steps: 1e6
        eval_num_envs: 2
        steps_per_eval: 2
        experiment: yaml-exp
        run_name: yaml-run
        checkpoint_every: 1
    """,
    )
    assert main(["train", config, "--quiet"]) == 0
    out = capsys.readouterr().out
    fields = summary(out)
    run = MlflowClient(mlflow_uri).get_run(fields["run id"])
    assert run.info.status == "FINISHED" and run.info.run_name == "yaml-run"
    assert run.data.params["hparams/lr"] == "0.0003"
    assert run.data.params["hparams/model_config/hiddens"] == "[16, 16]"
    assert run.data.metrics["algorithm/steps"] == 3
    assert "eval/episodes/return_mean" in run.data.metrics
    assert fields["checkpoint"].endswith(f"checkpoint-{3 * 128:012d}.pt")
    assert fields["mlflow ui"] == "mlflow ui"  # sqlite store in the current folder
    assert (tmp_path / "checkpoints" / fields["run id"]).is_dir()


def test_train_with_flags(tmp_path, capsys, mlflow_uri):
    argv = ["train", "--env", "rl8.envs.CartPole", *TINY_SET, "--set", "lr=3e-4",
            "--set", "model_config.hiddens=[8]", "--max-steps", "256", "--experiment", "flags",
            "--tracking-uri", mlflow_uri, "--checkpoint-dir", str(tmp_path / "ck")]  # fmt: skip
    assert main(argv) == 0
    fields = summary(capsys.readouterr().out)
    client = MlflowClient(mlflow_uri)
    run = client.get_run(fields["run id"])
    assert client.get_experiment(run.info.experiment_id).name == "flags"
    assert run.data.params["hparams/lr"] == "0.0003"
    assert run.data.params["hparams/horizon"] == "8"
    assert run.data.metrics["env/steps"] == 256
    assert fields["checkpoint"] == str(tmp_path / "ck" / f"checkpoint-{256:012d}.pt")
    assert (
        fields["mlflow ui"] == f"mlflow ui --backend-store-uri {mlflow_uri}"
        or fields["mlflow ui"] == "mlflow ui"
    )


def test_the_mlflow_ui_hint_names_the_extra_when_the_ui_is_not_installed(monkeypatch, tmp_path):
    """rl8 needs only mlflow-skinny, whose `mlflow ui` fails for want of flask."""
    import importlib.metadata
    import importlib.util

    from rl8.training.progress import mlflow_ui_command as _mlflow_ui_command

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    find_spec = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "flask" else find_spec(name, *a)
    )
    pin = f'(after pip install "mlflow=={importlib.metadata.version("mlflow-skinny")}")'
    assert _mlflow_ui_command(uri) == f"mlflow ui {pin}"  # the test's cwd
    assert _mlflow_ui_command("/elsewhere") == f"mlflow ui --backend-store-uri /elsewhere {pin}"
    assert _mlflow_ui_command("http://127.0.0.1:5000").startswith("open http://127.0.0.1:5000")
    monkeypatch.setattr(importlib.util, "find_spec", find_spec)
    assert _mlflow_ui_command(uri) == "mlflow ui"


def test_train_a_small_batch_with_the_default_minibatch(capsys, mlflow_uri):
    """docs/cli.md's example with num_envs=16 was refused (minibatch 2048 > 512 transitions)."""
    argv = ["train", "--env", "CartPole-v1", "--set", "num_envs=16", "--set", "model_config.hiddens=[32,32]",
            "--set", "num_sgd_iters=1", "--max-steps", "512", "--quiet"]  # fmt: skip
    assert main(argv) == 0
    run = MlflowClient(mlflow_uri).get_run(summary(capsys.readouterr().out)["run id"])
    assert run.data.params["hparams/sgd_minibatch_size"] == "auto"
    assert run.data.metrics["env/steps"] == 512


@pytest.mark.parametrize(
    "text, argv, message",
    [
        ("env: rl8.envs.CartPole\nhparam: {}\n", [], "unknown key 'hparam'; did you mean 'hparams'"),
        ("env: rl8.envs.CartPole\nhparams: {lr_schedul: null}\n", [], "unknown hyper-parameter 'lr_schedul'; did you mean 'lr_schedule'"),
        ("env: rl8.envs.CartPole\n", ["--set", "hoizon=8"], "unknown hyper-parameter 'hoizon'; did you mean 'horizon'"),
        ("env: rl8.envs.CartPole\n", ["--set", "horizon"], "expected KEY=VALUE"),
        ("env: rl8.envs.CartPole\n", ["--set", "horizon=0"], "horizon: expected an int >= 1, got 0"),
        ("env: rl8.envs.CartPole\nstop_conditions: [{hits_uper_bound: {key: env/steps, bound: 1}}]\n", [],
         "unknown condition 'hits_uper_bound'. Did you mean 'hits_upper_bound'"),
        ("- a list\n", [], "expected a mapping"),
        ("hparams: {horizon: 8}\n", [], "no env"),
        ("env: rl8.envs.NoSuchEnv\n", [], "cannot build PPO for env 'rl8.envs.NoSuchEnv'"),
        ("env: rl8.envs.CartPole\neval_env_config: {gravity: 20}\n", [],
         "eval_env_config is given but steps_per_eval is None"),
        ("env: rl8.envs.CartPole\nmax_steps: lots\n", [], "max_steps must be an int >= 1"),
    ],
)  # fmt: skip
def test_config_errors_are_one_line_and_exit_2(tmp_path, capsys, mlflow_uri, text, argv, message):
    config = write(tmp_path, text)
    assert main(["train", config, *argv]) == 2
    err = capsys.readouterr().err
    assert message in err
    assert err.startswith("rl8: error: ") and err.count("\n") == 1 and "Traceback" not in err
    assert all_runs(mlflow_uri) == []  # nothing was started


def test_unknown_stat_in_a_stop_condition_exits_2(tmp_path, capsys):
    argv = ["train", "--env", "rl8.envs.CartPole", *TINY_SET, "--quiet"]
    config = write(
        tmp_path, "stop_conditions: [{hits_upper_bound: {key: episodes/retrun_mean, bound: 1}}]\n"
    )
    assert main([*argv[:1], config, *argv[1:]]) == 2
    err = capsys.readouterr().err
    assert "episodes/return_mean" in err and "Traceback" not in err


def test_resume_continues_the_run(tmp_path, capsys, mlflow_uri):
    argv = ["train", "--env", "rl8.envs.CartPole", *TINY_SET, "--max-steps", "256", "--quiet"]
    assert main(argv) == 0
    first = summary(capsys.readouterr().out)

    # same hyper-parameters: fine; a changed one: refused, naming it
    assert main(["train", "--resume", first["checkpoint"], "--set", "lr=0.5"]) == 2
    assert "lr (checkpoint: 0.001, given: 0.5)" in capsys.readouterr().err

    assert main(["train", "--resume", first["checkpoint"], "--max-steps", "512", "--quiet"]) == 0
    second = summary(capsys.readouterr().out)
    assert second["run id"] == first["run id"]
    assert second["checkpoint"].endswith(f"{512:012d}.pt")

    # by run id, one more step
    assert main(["train", "--resume", first["run id"], "--max-steps", "640", "--quiet"]) == 0
    third = summary(capsys.readouterr().out)
    assert third["run id"] == first["run id"]
    history = MlflowClient(mlflow_uri).get_metric_history(first["run id"], "env/steps")
    steps = sorted(m.step for m in history)
    assert steps == [128, 256, 384, 512, 640]  # the default cadence: every step of a young run
    assert MlflowClient(mlflow_uri).get_run(first["run id"]).info.status == "FINISHED"


def test_no_stop_conditions_trains_on_to_max_steps_also_when_resuming(tmp_path, capsys):
    # a stop condition that holds at the first step, as a preset's once the task is solved
    config = write(
        tmp_path,
        """
        env: rl8.envs.CartPole
        stop_conditions: [{hits_upper_bound: {key: algorithm/steps, bound: 1}}]
        max_steps: 384
        """,
    )
    assert main(["train", config, *TINY_SET, "--quiet"]) == 0
    stopped = summary(capsys.readouterr().out)
    assert stopped["checkpoint"].endswith(f"checkpoint-{128:012d}.pt")
    assert main(["train", config, *TINY_SET, "--no-stop-conditions", "--quiet"]) == 0
    assert summary(capsys.readouterr().out)["checkpoint"].endswith(f"checkpoint-{384:012d}.pt")
    # the run that stopped: with its conditions no step; without them on to its max_steps
    assert main(["train", "--resume", stopped["checkpoint"], "--quiet"]) == 0
    assert summary(capsys.readouterr().out)["checkpoint"] == stopped["checkpoint"]
    with pytest.warns(UserWarning, match="stop conditions differ from those saved in the checkpoint"):
        assert main(["train", "--resume", stopped["run id"], "--no-stop-conditions", "--quiet"]) == 0
    assert summary(capsys.readouterr().out)["checkpoint"].endswith(f"checkpoint-{384:012d}.pt")


def test_train_options_come_from_trainer_config(capsys):
    from rl8.cli import CONFIG_KEYS
    from rl8.training.config import TrainerConfig

    with pytest.raises(SystemExit):
        main(["train", "--help"])
    help_text = capsys.readouterr().out
    flags = TrainerConfig.names(cli="flag")
    assert flags and all(f"--{name.replace('_', '-')}" in help_text for name in flags)
    assert set(flags + TrainerConfig.names(cli="config")) <= set(CONFIG_KEYS)


def test_train_options_are_read_and_checked_as_their_fields_say(tmp_path, capsys):
    """Flags and config keys of Trainer options are read by the field's type and checked by
    the field's check (the same words as ``Trainer(...)``)."""
    from rl8.training.config import TrainerConfig

    with pytest.raises(SystemExit):
        main(["train", "--env", "rl8.envs.CartPole", "--max-staleness", "-1"])
    assert (
        "argument --max-staleness: max_staleness must be an int >= 0, got -1" in capsys.readouterr().err
    )
    config = write(tmp_path, "env: rl8.envs.CartPole\nimportance_weight_cap: -1\n")
    assert main(["train", config]) == 2
    assert "importance_weight_cap must be a number > 0 or None, got -1.0" in capsys.readouterr().err
    assert TrainerConfig.read_option("checkpoint_every", "1e3") == 1000
    assert TrainerConfig.read_option("experiment", 2024) == "2024"


def test_resume_takes_the_trainer_options_of_a_config_file(tmp_path, capsys, mlflow_uri):
    ck = tmp_path / "ck"
    argv = ["train", "--env", "rl8.envs.CartPole", *TINY_SET, "--max-steps", "256", "--quiet",
            "--checkpoint-every", "1", "--checkpoint-dir", str(ck)]  # fmt: skip
    assert main(argv) == 0
    first = summary(capsys.readouterr().out)
    assert len(list(ck.glob("checkpoint-*.pt"))) == 2
    config = write(tmp_path, "keep_checkpoints: 1\n")
    assert main(["train", config, "--resume", first["checkpoint"], "--max-steps", "512", "--quiet"]) == 0
    assert [p.name for p in ck.glob("checkpoint-*.pt")] == [f"checkpoint-{512:012d}.pt"]


@pytest.mark.parametrize(
    "argv, message",
    [
        (
            ["train", "--env", "rl8.envs.CartPole", "--trust-code", "--max-steps", "1"],
            "--trust-code only applies with --resume",
        ),
        (["runs", "--dry-run"], "--dry-run only applies with --clean"),
    ],
)
def test_options_that_only_apply_with_another_are_errors(argv, message, capsys):
    assert main(argv) == 2
    assert message in capsys.readouterr().err


def test_resume_missing_checkpoint_exits_1(tmp_path, capsys):
    assert main(["train", "--resume", str(tmp_path / "nope.pt")]) == 1
    assert "no checkpoint" in capsys.readouterr().err


# --------------------------------------------------------------------------------------------
# eval and --version


def test_eval_prints_episode_returns(tmp_path, capsys):
    argv = ["train", "--env", "rl8.envs.CartPole", *TINY_SET, "--max-steps", "128", "--quiet"]
    assert main(argv) == 0
    fields = summary(capsys.readouterr().out)
    for ref in (fields["checkpoint"], fields["run id"]):
        assert main(["eval", ref, "--episodes", "3", "--env-config", "max_episode_steps=10"]) == 0
        out = capsys.readouterr().out
        episodes = re.findall(r"^episode \d+: return ([\d.]+), length (\d+)", out, re.M)
        assert len(episodes) == 3
        assert all(int(length) <= 10 and float(ret) == int(length) for ret, length in episodes)
        mean = sum(float(r) for r, _ in episodes) / 3
        assert re.search(rf"mean return over 3 episodes: {mean:.6g}", out)


def test_eval_of_an_env_without_episodes(tmp_path, capsys):
    argv = ["train", "--env", "rl8.envs.DiscreteDummyEnv", *TINY_SET, "--max-steps", "128", "--quiet"]
    assert main(argv) == 0
    fields = summary(capsys.readouterr().out)
    assert (
        main(["eval", fields["checkpoint"], "--num-envs", "2", "--max-steps", "5", "--stochastic"]) == 0
    )
    out = capsys.readouterr().out
    assert "does not end episodes: returns over 5 steps" in out and "env 1: return" in out


def test_eval_in_another_env_does_not_get_the_stored_envs_arguments(tmp_path, capsys):
    from rl8 import PPO, save_policy
    from rl8.envs import CartPole

    path = tmp_path / "policy.pt"  # as trained on the gymnasium id, with its own arguments
    save_policy(
        PPO(CartPole, num_envs=4, horizon=8).policy,
        path,
        env={"spec": "CartPole-v1", "env_kwargs": {"max_episode_steps": 20}, "env_config": {}},
    )
    assert (
        main(
            [
                "eval",
                str(path),
                "--env",
                "rl8.envs.CartPole",
                "--episodes",
                "1",
                "--env-config",
                "max_episode_steps=5",
            ]
        )
        == 0
    )
    assert "episode 1: return 5, length 5" in capsys.readouterr().out


@pytest.mark.parametrize(
    "argv",
    [
        ["eval", "0" * 32],
        ["runs"],
        ["train", "--env", "rl8.envs.CartPole", *TINY_SET, "--max-steps", "128", "--quiet"],
    ],
    ids=["eval", "runs", "train"],
)
def test_a_store_of_a_newer_mlflow_exits_2_with_one_line_that_says_what_to_install(
    argv, capsys, newer_mlflow_store
):
    assert main(argv) == 2
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.startswith("rl8: error:")]
    assert len(lines) == 1 and "Traceback" not in err, err
    assert newer_mlflow_store in lines[0] and 'python -m pip install -e ".[ui]"' in lines[0]


def test_eval_of_an_asymmetric_policy_in_an_env_without_the_critics_group(tmp_path, capsys):
    from group_envs import GroupCartPole

    from rl8 import PPO, save_policy

    path = save_policy(PPO(GroupCartPole, num_envs=4, horizon=8).policy, tmp_path / "policy.pt")
    argv = ["eval", str(path), "--episodes", "2", "--env-config", "max_episode_steps=5"]
    assert main([*argv, "--env", "group_envs.RobotCartPole"]) == 0  # the robot's env: no "critic"
    assert "mean return over 2 episodes" in capsys.readouterr().out
    assert main([*argv, "--env", "rl8.envs.CartPole"]) == 2  # no "policy" group: refused
    assert (
        "or a Dict observation space with the actor's entries Dict('policy': Box(-inf, inf, (4,), float32))"
        in capsys.readouterr().err
    )


def test_eval_missing_policy_exits_1(tmp_path, capsys):
    assert main(["eval", str(tmp_path / "nope.pt")]) == 1
    assert "no policy" in capsys.readouterr().err


# --------------------------------------------------------------------------------------------
# -v/--verbose: other libraries' routine output


@pytest.fixture
def verbosity_env(monkeypatch):
    """RL8_VERBOSE and MLflow's progress bar switch unset, and as they were after the test."""
    from rl8.verbosity import MLFLOW_PROGRESS_BAR_ENV, VERBOSE_ENV

    for name in (VERBOSE_ENV, MLFLOW_PROGRESS_BAR_ENV):
        monkeypatch.setenv(name, "")  # recorded, so that the test's changes are undone
        monkeypatch.delenv(name)
    return monkeypatch


def test_mlflow_artifact_progress_bars_show_only_with_verbose(verbosity_env, capsys):
    import os

    argv = ["train", "--env", "rl8.envs.CartPole", *TINY_SET, "--max-steps", "128", "--quiet"]
    assert main(argv) == 0
    run_id = summary(capsys.readouterr().out)["run id"]
    assert os.environ["MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR"] == "false"
    assert main(["eval", run_id, "--episodes", "1"]) == 0  # downloads the run's policy
    assert "Downloading artifacts" not in capsys.readouterr().err
    verbosity_env.delenv("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR")
    assert main(["eval", run_id, "--episodes", "1", "-v"]) == 0
    assert "Downloading artifacts" in capsys.readouterr().err
    assert os.environ["RL8_VERBOSE"] == "1" and "MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR" not in os.environ
    # the user's own setting stays
    verbosity_env.delenv("RL8_VERBOSE")
    verbosity_env.setenv("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "true")
    assert main(["eval", run_id, "--episodes", "1"]) == 0
    assert "Downloading artifacts" in capsys.readouterr().err


class FakeWarp(types.ModuleType):
    """warp as ``rl8.envs.mjlab`` sees it: ``config.log_level`` and ``LOG_WARNING`` (warp with
    logging levels, whose ``config.quiet`` is deprecated), or only ``config.quiet``."""

    def __init__(self, levels: bool):
        super().__init__("warp")
        if levels:
            self.LOG_INFO, self.LOG_WARNING = 20, 30
            self.config = types.SimpleNamespace(log_level=self.LOG_INFO)
        else:
            self.config = types.SimpleNamespace(quiet=False)


@pytest.mark.parametrize("levels", [True, False], ids=["log_level", "quiet"])
def test_warp_is_quiet_when_an_mjlab_task_is_built_unless_verbose(levels, verbosity_env, capsys):
    from rl8.envs.mjlab import make_mjlab_env

    verbosity_env.setitem(sys.modules, "mjlab", None)  # mjlab missing: ImportError after warp's turn

    def warp_config_after_building() -> dict:
        warp = FakeWarp(levels)
        verbosity_env.setitem(sys.modules, "warp", warp)
        with pytest.raises(ImportError):
            make_mjlab_env("Mjlab-Cartpole-Balance", 2, device="cpu")
        return vars(warp.config)

    assert warp_config_after_building() == ({"log_level": 30} if levels else {"quiet": True})
    assert main(["eval", "-v", "no-such-policy.pt"]) == 1  # -v, whatever the command then does
    capsys.readouterr()
    assert warp_config_after_building() == ({"log_level": 20} if levels else {"quiet": False})


def test_version_and_python_dash_m(capsys):
    with pytest.raises(SystemExit) as exc:
        main(["--version"])
    assert exc.value.code == 0
    assert capsys.readouterr().out.strip() == f"rl8 {rl8.version.__version__}"
    done = subprocess.run(
        [sys.executable, "-m", "rl8", "--version"], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0 and done.stdout.strip() == f"rl8 {rl8.version.__version__}"
    done = subprocess.run([sys.executable, "-m", "rl8"], capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and "train" in done.stderr


# --------------------------------------------------------------------------------------------
# errors: one line without a traceback, unless --debug or RL8_DEBUG=1

TOO_MANY_EVAL_ENVS = """
    env: rl8.envs.CartPole
    eval_num_envs: 1000000000000   # some 54 TB: refused before anything is allocated
    steps_per_eval: 1
    """
needs_optuna = pytest.mark.skipif(
    importlib.util.find_spec("optuna") is None, reason="rl8 sweep needs optuna"
)


def bad_input(tmp_path, command):
    """``(argv, status, message)``: a mistake given to ``command`` and what rl8 says of it."""
    config = write(tmp_path, TOO_MANY_EVAL_ENVS)
    garbage = tmp_path / "garbage.pt"
    garbage.write_bytes(b"not a checkpoint")
    space = write(tmp_path, "lr: {type: float, low: 1, high: 0}\n", "space.yaml")
    return {
        "train": ([config, *TINY_SET], 2, "eval_num_envs=1000000000000 needs about"),
        "eval": ([str(garbage)], 2, "garbage.pt is corrupt or truncated"),
        "record": ([str(garbage), "-o", ""], 2, "-o/--output must name an MP4 file to write"),
        "export": ([str(garbage), "-o", str(tmp_path)], 2, "is a folder; give a file name"),
        "runs": (["--dry-run"], 2, "--dry-run only applies with --clean"),
        "sweep": (
            [config, "--space", space, "--trials", "1", "--storage", f"sqlite:///{tmp_path}/o.db"],
            2,
            "lr: empty range: low must be < high, got low=1, high=0",
        ),
    }[command]


COMMANDS = ["train", "eval", "record", "export", "runs", pytest.param("sweep", marks=needs_optuna)]


def test_the_error_tests_cover_every_command():
    listed = re.findall(r"^    (\w+)\s", build_parser().format_help(), re.M)  # rl8 --help's commands
    assert sorted(listed) == sorted(getattr(c, "values", [c])[0] for c in COMMANDS)


@pytest.mark.parametrize("command", COMMANDS)
def test_a_mistake_is_one_line_without_traceback_in_every_command(command, tmp_path, capsys, mlflow_uri):
    argv, status, message = bad_input(tmp_path, command)
    assert main([command, *argv]) == status
    err = capsys.readouterr().err
    assert err.startswith("rl8: error: ") and err.count("\n") == 1 and "Traceback" not in err, err
    assert message in err
    assert all_runs(mlflow_uri) == []  # refused before any MLflow run


@pytest.mark.parametrize("command", COMMANDS)
@pytest.mark.parametrize("debug", ["--debug first", "--debug last", "RL8_DEBUG=1"])
def test_debug_shows_the_traceback_then_the_same_line(command, debug, tmp_path, capsys, monkeypatch):
    argv, status, message = bad_input(tmp_path, command)
    line = {"--debug first": ["--debug", command, *argv], "--debug last": [command, *argv, "--debug"]}
    if debug == "RL8_DEBUG=1":
        monkeypatch.setenv("RL8_DEBUG", "1")
    assert main(line.get(debug, [command, *argv])) == status
    err = capsys.readouterr().err
    last = err.splitlines()[-1]
    assert err.startswith("Traceback (most recent call last):") and message in last, err
    assert last.startswith("rl8: error: ") and f": {last.removeprefix('rl8: error: ')}\n" in err


def test_rl8_debug_0_is_off(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("RL8_DEBUG", "0")
    assert main(["runs", "--dry-run"]) == 2
    assert "Traceback" not in capsys.readouterr().err


def test_an_error_not_raised_by_rl8_keeps_its_traceback(monkeypatch, capsys):
    def buggy(args):  # a ValueError of code outside rl8: a bug, not a mistake in the input
        return int("not a number")

    monkeypatch.setattr("rl8.cli.runs.run", buggy)
    with pytest.raises(ValueError, match="invalid literal for int"):
        main(["runs"])
    monkeypatch.setattr("rl8.cli.runs.run", lambda args: 1 / 0)
    with pytest.raises(ZeroDivisionError):
        main(["runs"])
    assert capsys.readouterr().err == ""


@pytest.mark.slow
def test_the_rl8_command_prints_one_line_and_exits_2_or_the_traceback_with_rl8_debug(tmp_path):
    config = write(tmp_path, TOO_MANY_EVAL_ENVS)
    command = [sys.executable, "-m", "rl8", "train", config, *TINY_SET]
    done = subprocess.run(command, capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and done.stderr.count("\n") == 1, done.stderr
    assert done.stderr.startswith("rl8: error: eval_num_envs=1000000000000 needs about")
    env = {**os.environ, "RL8_DEBUG": "1"}
    debug = subprocess.run(command, capture_output=True, text=True, timeout=120, env=env)
    assert debug.returncode == 2 and "Traceback (most recent call last):" in debug.stderr
    assert debug.stderr.endswith(done.stderr) and "check_memory" in debug.stderr


def test_a_policy_that_cannot_be_exported_is_one_line_exit_1_and_its_traceback_with_debug(
    tmp_path, capsys, monkeypatch
):
    from rl8 import PPO, save_policy
    from rl8.policies.deploy import ExportError
    from rl8.policies.policy import Policy

    path = save_policy(PPO("rl8.envs.CartPole", num_envs=4, horizon=8).policy, tmp_path / "p.pt")

    def refuse(self, path, format):
        raise ExportError("cannot export MLP with Categorical as onnx (a test)")

    monkeypatch.setattr(Policy, "export", refuse)
    argv = ["export", str(path), "-o", str(tmp_path / "p.onnx")]
    assert main(argv) == 1
    err = capsys.readouterr().err
    assert err == f"rl8: error: {path}: cannot export MLP with Categorical as onnx (a test)\n"
    assert main([*argv, "--debug"]) == 1
    debug = capsys.readouterr().err
    assert "Traceback" in debug and "in refuse" in debug and debug.endswith(err)


# --------------------------------------------------------------------------------------------
# rl8 train NAME: a preset's typo, a gymnasium id without a preset


def test_a_preset_typo_suggests_the_close_presets_and_env(capsys):
    assert main(["train", "CartPol-v1"]) == 2
    line = one_error_line(capsys.readouterr().err)
    assert "no preset or config file 'CartPol-v1'" in line
    assert "did you mean 'CartPole-v1' or 'CartPole'?" in line
    assert "rl8 train --env ID" in line and "No such file" not in line


def test_a_gymnasium_id_without_a_preset_says_how_to_train_it(capsys):
    assert main(["train", "HalfCheetah-v4"]) == 2
    line = one_error_line(capsys.readouterr().err)
    assert "no preset or config file 'HalfCheetah-v4'" in line
    assert "rl8 train --env HalfCheetah-v4" in line and "did you mean 'HalfCheetah-v5'?" in line


def test_a_missing_yaml_file_is_still_a_missing_file(capsys, tmp_path):
    assert main(["train", str(tmp_path / "nope.yaml")]) == 2
    assert "cannot read config file" in one_error_line(capsys.readouterr().err)


# --------------------------------------------------------------------------------------------
# hyper-parameter names, model_config keys, YAML errors


def test_an_unknown_model_config_key_names_the_field_and_the_valid_keys(capsys, migrated_store):
    argv = [
        "train",
        "--env",
        "rl8.envs.CartPole",
        "--set",
        "model_config.hiden=[32,32]",
        "--max-steps",
        "64",
    ]
    assert main(argv) == 2
    line = one_error_line(capsys.readouterr().err)
    assert "model_config.hiden" in line and "did you mean 'hiddens'?" in line
    assert (
        "(valid: hiddens, critic_hiddens, activation, shared, state_dependent_std, init_log_std, "
        "init_noise_std, noise_std_type, ortho_init, obs_groups)"
    ) in line
    assert not all_runs(migrated_store)  # checked before the run starts
    with pytest.raises(
        ValueError,
        match=r"model_config\.hiden: MLPModel has no option 'hiden'; did you mean 'hiddens'\?",
    ):
        PPO(CartPole, model_config={"hiden": [32, 32]}, **SMALL)


def test_set_an_unknown_hparam_lists_the_valid_names(capsys):
    assert main(["train", "--env", "rl8.envs.CartPole", "--set", "learning_rate=1e-3"]) == 2
    line = one_error_line(capsys.readouterr().err)
    assert (
        "--set learning_rate=1e-3: unknown hyper-parameter 'learning_rate'; did you mean 'lr'?" in line
    )
    assert "(valid: num_envs, horizon," in line and ", lr," in line
    with pytest.raises(
        TypeError,
        match=r"unknown hyper-parameter 'learning_rate'; did you mean 'lr'\? \(valid: num_envs",
    ):
        PPO(CartPole, learning_rate=1e-3)


def test_yaml_errors_keep_the_line_column_and_caret(capsys, tmp_path):
    config = tmp_path / "bad.yaml"
    config.write_text("env: CartPole-v1\nhparams: {lr: [1, 2}\n")
    assert main(["train", str(config)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"rl8: error: {config}: invalid YAML:\n") and "Traceback" not in err
    assert f'in "{config}", line 2, column 15:' in err
    assert "    hparams: {lr: [1, 2}\n" in err and re.search(r"\n +\^\n", err)


def test_rl8_1_command_lines_and_configs_get_hints(tmp_path, capsys):
    (tmp_path / "old.yaml").write_text("env_cls: rl8.envs.CartPole\nalgorithm_config:\n  horizon: 8\n")
    assert main(["train", "-f", "old.yaml"]) == 2
    assert (
        "rl8 train takes the config file as its argument: rl8 train old.yaml" in capsys.readouterr().err
    )
    assert main(["train", "old.yaml"]) == 2
    assert "rl8 1.0's env_cls is now env (see docs/migrating.md)" in capsys.readouterr().err
    (tmp_path / "old.yaml").write_text("env: rl8.envs.CartPole\nalgorithm_config:\n  horizon: 8\n")
    assert main(["train", "old.yaml"]) == 2
    assert "rl8 1.0's algorithm_config is now hparams" in capsys.readouterr().err
    args = [
        "train",
        "--env",
        "rl8.envs.CartPole",
        "--set",
        "num_envs=4",
        "--set",
        "horizon=8",
        "--max-steps",
        "10",
        "--tracking-uri",
        str(tmp_path / "mlruns-off"),
        "--quiet",
        "--checkpoint-dir",
        str(tmp_path / "ck"),
    ]
    main(args)
    assert (
        "max_steps counts env steps (rl8 1.0: training steps); 10 is less than one training step (32"
        in (capsys.readouterr().err)
    )


def test_an_env_config_mistake_is_an_error_before_training(tmp_path, migrated_store, capsys):
    with Trainer(PPO(CartPole, **SMALL), progress=False, checkpoint_dir=tmp_path / "ck") as trainer:
        with pytest.raises(ValueError, match="Trainer.run: env_config: .*'nope'"):
            trainer.run(max_env_steps=64, env_config={"nope": 1})
        assert trainer.algo.env_steps == 0
        trainer.run(max_env_steps=32)
    assert main(["train", "--resume", str(tmp_path / "ck"), "--max-steps", "64", "--quiet"]) == 0
    capsys.readouterr()
    (tmp_path / "run.yaml").write_text("env_config:\n  nope: 1\n")
    code = main(["train", "run.yaml", "--resume", str(tmp_path / "ck"), "--max-steps", "128"])
    err = capsys.readouterr().err
    assert code == 2 and "rl8: error: env_config: CartPole.reset: unknown config key 'nope'" in err, err


def test_an_empty_run_name_is_refused_before_anything_starts(tmp_path, capsys):
    store = tmp_path / "store" / "mlflow.db"  # not this file's migrated store, which exists
    with pytest.raises(SystemExit, match="2"):
        main(["train", "--env", "CartPole", "--run-name", "", "--tracking-uri", f"sqlite:///{store}"])
    assert "run_name must be a non-empty string or None, got ''" in capsys.readouterr().err
    assert not store.exists() and not (tmp_path / "checkpoints").exists()
    with pytest.raises(ValueError, match="run_name must be a non-empty string"):
        Trainer(
            PPO(CartPole, num_envs=4, horizon=4, sgd_minibatch_size=16), run_name=" ", tracking=False
        )


@pytest.mark.parametrize(
    "command",
    [
        ["eval", "/dev/zero"],
        ["record", "/dev/zero", "-o", "v.mp4"],
        ["train", "--resume", "/dev/zero"],
        ["train", "/dev/zero"],
    ],
)
def test_files_that_are_not_regular_files_are_refused_not_read_forever(capsys, command):
    assert main(command) in (1, 2)
    assert "/dev/zero is not a regular file" in capsys.readouterr().err


def test_a_config_that_is_too_large_or_not_utf8_is_a_one_line_error(tmp_path, capsys):
    (tmp_path / "big.yaml").write_text("a: 1\n" * 300_000)
    (tmp_path / "bad.yaml").write_bytes(b"env: \xff\n")
    assert main(["train", "big.yaml"]) == 2
    assert "is larger than 1048576 bytes" in capsys.readouterr().err
    assert main(["train", "bad.yaml"]) == 2
    assert "bad.yaml: not UTF-8 text (invalid start byte at byte 5)" in capsys.readouterr().err


def test_rl8_train_with_an_unwritable_checkpoint_dir_exits_2_before_training(
    tmp_path, migrated_store, capsys
):
    (tmp_path / "afile").write_text("a file, not a folder")
    code = main(
        [
            "train",
            "--env",
            "rl8.envs.CartPole",
            *TINY_SET,
            "--max-steps",
            "128",
            "--quiet",
            "--checkpoint-dir",
            str(tmp_path / "afile" / "ck"),
        ]
    )
    err = capsys.readouterr().err
    assert code == 2, err
    assert f"checkpoint_dir {tmp_path / 'afile' / 'ck'} cannot be used" in err
    assert err.count("\n") == 1  # one line, no traceback
    assert all_runs(migrated_store) == []


def test_rl8_train_into_the_folder_of_another_run_exits_2_and_resume_goes_on(
    tmp_path, migrated_store, capsys
):
    argv = [
        "train",
        "--env",
        "rl8.envs.CartPole",
        *TINY_SET,
        "--max-steps",
        "128",
        "--quiet",
        "--checkpoint-dir",
        str(tmp_path / "ck"),
    ]
    assert main(argv) == 0
    capsys.readouterr()
    assert main(argv[:-2] + ["--set", "seed=1", "--checkpoint-dir", str(tmp_path / "ck")]) == 2
    assert re.search(
        r"ck already holds \d checkpoint\(s\) of run [0-9a-f]{32} ", capsys.readouterr().err
    )
    assert main(["train", "--resume", str(tmp_path / "ck"), "--max-steps", "256", "--quiet"]) == 0
    assert len(all_runs(migrated_store)) == 1


# ---- configs that would exhaust memory or the stack ------------------------------------------

BILLION_LAUGHS = (
    "env: rl8.envs.CartPole\nhparams:\n  model_config:\n    a: &a [x, x, x, x, x, x, x, x, x]\n"
    + "".join(f"    {c}: &{c} [{', '.join(['*' + p] * 9)}]\n" for p, c in zip("abcdefgh", "bcdefghi"))
)


def test_a_yaml_alias_bomb_is_a_config_error(tmp_path, capsys):
    path = tmp_path / "bomb.yaml"
    path.write_text(BILLION_LAUGHS)  # 9**9 values once expanded
    with pytest.raises(
        ConfigError, match=r"bomb.yaml: the YAML holds more than 100000 values once its aliases"
    ):
        load_config(path)
    assert main(["train", str(path)]) == 2
    assert "more than 100000 values" in capsys.readouterr().err
    assert (
        main(
            [
                "train",
                "--env",
                "rl8.envs.CartPole",
                "--set",
                "model_config={a: &a [1, 1, 1, 1, 1, 1, 1, 1, 1, 1], b: &b [*a, *a, *a, *a, *a, *a, *a, *a, *a, *a], "
                "c: &c [*b, *b, *b, *b, *b, *b, *b, *b, *b, *b], d: &d [*c, *c, *c, *c, *c, *c, *c, *c, *c, *c], "
                "e: [*d, *d, *d, *d, *d, *d, *d, *d, *d, *d, *d]}",
            ]
        )
        == 2
    )
    assert "--set value" in capsys.readouterr().err


def test_a_yaml_that_contains_itself_is_a_config_error(tmp_path):
    path = tmp_path / "loop.yaml"
    path.write_text("env: rl8.envs.CartPole\nenv_config: &a {inner: [*a]}\n")
    with pytest.raises(ConfigError, match="contains itself"):
        load_config(path)


def test_a_deeply_nested_or_is_a_config_error(tmp_path, capsys):
    path = tmp_path / "deep.yaml"
    path.write_text(
        "env: rl8.envs.CartPole\nstop_conditions:\n  - "
        + "{or: [" * 400
        + "{time_limit: {seconds: 1}}"
        + "]}" * 400
        + "\n"
    )
    assert main(["train", str(path)]) == 2  # was a RecursionError
    assert "deep.yaml: the YAML is nested deeper than 100 levels (line 3)" in capsys.readouterr().err
    # within the YAML bound, the conditions' own bound (also for specs built in Python)
    path.write_text(
        "env: rl8.envs.CartPole\nstop_conditions:\n  - "
        + "{or: [" * 40
        + "{time_limit: {seconds: 1}}"
        + "]}" * 40
        + "\n"
    )
    assert main(["train", str(path)]) == 2
    assert "nested deeper than 32 levels" in capsys.readouterr().err
    spec = {"time_limit": {"seconds": 1}}
    for _ in range(400):
        spec = {"or": [spec]}
    with pytest.raises(ValueError, match=f"nested deeper than {MAX_CONDITION_DEPTH} levels"):
        from_config(spec)
    shallow = {"time_limit": {"seconds": 1}}
    for _ in range(MAX_CONDITION_DEPTH - 1):  # at the bound: built
        shallow = {"or": [shallow]}
    from_config(shallow)


@pytest.mark.parametrize(
    "config,argv,where",
    [
        ("env_config: {nope: 1}\n", [], "env_config"),
        ("steps_per_eval: 1\neval_env_config: {nope: 1}\n", [], "eval_env_config"),
        ("", ["--set", "env_config.nope=1"], "hparams: env_config"),
    ],
    ids=["env_config", "eval_env_config", "--set env_config"],
)
def test_an_env_config_mistake_exits_2_before_anything_is_tracked(
    tmp_path, migrated_store, capsys, config, argv, where
):
    path = tmp_path / "config.yaml"
    path.write_text("env: rl8.envs.CartPole\nmax_steps: 128\n" + config)
    assert main(["train", str(path), *TINY_SET, *argv, "--quiet"]) == 2
    err = capsys.readouterr().err
    assert err == (
        f"rl8: error: {where}: CartPole.reset: unknown config key 'nope'; allowed keys: "
        "['force_mag', 'gravity', 'length', 'masscart', 'masspole', 'max_episode_steps', 'tau']\n"
    )
    assert all_runs(migrated_store) == []  # no MLflow run was created


def test_train_and_resume_a_distillation_from_a_config(tmp_path, capsys, mlflow_uri):
    teacher = save_policy(PPO(Pendulum, num_envs=4, horizon=4, seed=1).policy, tmp_path / "teacher.pt")
    config = write(
        tmp_path,
        f"""
        env: rl8.envs.Pendulum
        algorithm: Distillation
        teacher: {teacher}
        hparams: {{num_envs: 16, horizon: 8, num_minibatches: 2, loss_type: huber, seed: 0}}
        max_steps: 256
    """,
    )
    assert main(["train", config, "--quiet"]) == 0
    first = summary(capsys.readouterr().out)
    run = MlflowClient(mlflow_uri).get_run(first["run id"])
    assert (
        run.data.params["algorithm"] == "Distillation"
        and run.data.params["hparams/loss_type"] == "huber"
    )
    assert "losses/behavior" in run.data.metrics
    assert main(["train", "--resume", first["checkpoint"], "--max-steps", "384", "--quiet"]) == 0
    assert summary(capsys.readouterr().out)["checkpoint"].endswith(f"{384:012d}.pt")

    no_teacher = write(tmp_path, "env: rl8.envs.Pendulum\nalgorithm: Distillation\n", "no_teacher.yaml")
    assert main(["train", no_teacher, "--quiet"]) == 2
    assert "config teacher: algorithm Distillation needs the teacher's policy" in capsys.readouterr().err
    assert main(["train", config, "--set", "clip_param=0.3", "--quiet"]) == 2
    assert "hparam clip_param: Distillation trains by behaviour cloning" in capsys.readouterr().err
    unknown = write(tmp_path, "env: rl8.envs.Pendulum\nalgorithm: SAC\n", "sac.yaml")
    assert main(["train", unknown, "--quiet"]) == 2
    assert (
        "sac.yaml: algorithm: expected one of ['Distillation', 'PPO'], got 'SAC'"
        in capsys.readouterr().err
    )
