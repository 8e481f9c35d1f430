"""Faults and bad input found by fault injection (issue 23): jobs never destroy each other's
data, malformed files and configs are clear errors, and tracking never fails training."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import textwrap
import warnings
from pathlib import Path

import pytest

import rl8

ROOT = Path(rl8.__file__).resolve().parent.parent


def _env() -> dict[str, str]:
    """The environment of a subprocess that imports this rl8."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")])
    return env


# ---- the default SQLite store, created by several processes at once ---------------------------


@pytest.mark.slow
def test_three_processes_create_a_fresh_sqlite_store_at_once_quietly(tmp_path):
    uri = f"sqlite:///{tmp_path / 'fresh' / 'mlflow.db'}"
    (tmp_path / "fresh").mkdir()
    script = textwrap.dedent(f"""
        from rl8.tracking import Tracker
        with Tracker(experiment="together", tracking_uri={uri!r}) as tracker:
            tracker.log_metrics({{"x": 1.0}}, step=0)
    """)
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", script],
            env=_env(),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for _ in range(3)
    ]
    outputs = [p.communicate(timeout=120)[0] for p in procs]
    assert [p.returncode for p in procs] == [0, 0, 0], outputs
    for out in outputs:  # MLflow's INFO lines on a new store are silenced
        assert "Creating initial MLflow database tables" not in out, out
        assert "alembic" not in out.lower(), out
    from mlflow.tracking import MlflowClient

    experiment = MlflowClient(uri).get_experiment_by_name("together")
    assert len(MlflowClient(uri).search_runs([experiment.experiment_id])) == 3


# ---- tracking never fails training: a temporary folder where nothing can be staged -----------

SMALL = dict(num_envs=16, horizon=8, sgd_minibatch_size=64, num_sgd_iters=1, seed=0)


def test_a_checkpoint_whose_policy_cannot_be_staged_for_mlflow_ends_the_run_finished(
    tmp_path, migrated_store, monkeypatch
):
    import tempfile

    from mlflow.tracking import MlflowClient

    from rl8 import PPO, Trainer
    from rl8.envs import CartPole
    from rl8.tracking import TrackingWarning
    from rl8.training.conditions import HitsUpperBound

    (tmp_path / "afile").write_text("a file, not a folder")
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "afile" / "tmp"))  # every mkdtemp fails
    trainer = Trainer(
        PPO(CartPole, **SMALL), checkpoint_dir=tmp_path / "ck", progress=False, async_logging=False
    )
    with pytest.warns(TrackingWarning, match=r"not \(all\) logged to MLflow run .*\(staging folder "):
        trainer.run(stop_conditions=HitsUpperBound("env/steps", 128))
    trainer.close()
    assert trainer.last_checkpoint.is_file()
    run = MlflowClient(migrated_store).get_run(trainer.run_id)
    assert run.info.status == "FINISHED"


def test_an_artifact_that_cannot_be_staged_is_a_warning(tmp_path, migrated_store, monkeypatch):
    import tempfile

    from rl8.tracking import Tracker, TrackingWarning

    (tmp_path / "afile").write_text("a file, not a folder")
    (tmp_path / "notes.txt").write_text("notes")
    with Tracker(experiment="staging", asynchronous=True) as tracker:
        monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "afile" / "tmp"))
        with pytest.warns(TrackingWarning, match="staging a copy in the temporary folder .* failed"):
            tracker.log_artifact(tmp_path / "notes.txt")
        assert tracker.pending_artifacts == 0


# ---- one run per checkpoint folder ----------------------------------------------------------

TINY_SET = ["--set", "num_envs=16", "--set", "horizon=8", "--set", "sgd_minibatch_size=64",
            "--set", "num_sgd_iters=1", "--set", "seed=0"]  # fmt: skip


def _runs(uri):
    from mlflow.tracking import MlflowClient

    client = MlflowClient(uri)
    return client.search_runs([e.experiment_id for e in client.search_experiments()])


def _small_trainer(**options):
    from rl8 import PPO, Trainer
    from rl8.envs import CartPole

    return Trainer(PPO(CartPole, **SMALL), progress=False, **options)


@pytest.mark.slow
def test_a_folder_written_by_a_live_process_is_refused_and_taken_over_once_it_died(tmp_path):
    from rl8.io.checkpoint_dir import CHECKPOINT_DIR_LOCK, CheckpointDirError, CheckpointDirLock

    folder = tmp_path / "shared"
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys\nfrom rl8.io.checkpoint_dir import CheckpointDirLock\n"
            f"lock = CheckpointDirLock({str(folder)!r}, run_id='a' * 32)\nprint('held', flush=True)\n"
            "sys.stdin.read()",
        ],
        env=_env(),
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout.readline().strip() == "held"
        with pytest.raises(
            CheckpointDirError, match=rf"{folder} is in use by run a{{32}} \(pid {holder.pid} on "
        ):
            CheckpointDirLock(folder)
    finally:
        holder.kill()  # no release: the lock file stays, naming a dead process
        holder.wait()
    assert (folder / CHECKPOINT_DIR_LOCK).is_file()
    with pytest.warns(
        UserWarning, match=rf"was locked by run a{{32}} \(pid {holder.pid} .*ended without releasing"
    ):
        lock = CheckpointDirLock(folder)
    lock.release()
    assert json.loads((folder / CHECKPOINT_DIR_LOCK).read_text())["released"] is True
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a released folder is taken without a warning
        CheckpointDirLock(folder).release()


def test_two_trainers_never_share_a_checkpoint_folder(tmp_path, migrated_store):
    from rl8 import Trainer
    from rl8.io.checkpoint_dir import CheckpointDirError

    first = _small_trainer(checkpoint_dir=tmp_path / "ck", async_logging=False)
    first.step()
    written = first.save_checkpoint()
    # while the first is open: refused, before a second MLflow run is created
    with pytest.raises(
        CheckpointDirError,
        match=rf"{tmp_path / 'ck'} is in use by run {first.run_id}.*close\(\) it first",
    ):
        _small_trainer(checkpoint_dir=tmp_path / "ck")
    assert len(_runs(migrated_store)) == 1
    first.close()
    # after it ended: a new run would overwrite and prune its checkpoints (the same step names)
    with pytest.raises(
        CheckpointDirError,
        match=rf"already holds 1 checkpoint\(s\) of run {first.run_id} "
        rf"\(pid {os.getpid()} on .*, ended\) \(latest: {written.name}\).*"
        "rl8 train --resume",
    ):
        _small_trainer(checkpoint_dir=tmp_path / "ck")
    assert len(_runs(migrated_store)) == 1
    # resuming that run may: from the folder, the file, or the run id
    for ref in (tmp_path / "ck", written, first.run_id):
        with Trainer.from_checkpoint(ref, progress=False) as resumed:
            assert resumed.checkpoint_dir == tmp_path / "ck" and resumed.run_id == first.run_id
            resumed.step()
            resumed.save_checkpoint()
    # the same without tracking (no run id): resuming from the folder's checkpoint
    untracked = _small_trainer(checkpoint_dir=tmp_path / "quiet", tracking=False)
    untracked.save_checkpoint()
    untracked.close()
    with pytest.raises(
        CheckpointDirError, match="quiet already holds 1 checkpoint.* of a run without MLflow tracking"
    ):
        _small_trainer(checkpoint_dir=tmp_path / "quiet", tracking=False)
    Trainer.from_checkpoint(tmp_path / "quiet", progress=False).close()


def test_default_folders_of_untracked_runs_are_unique(tmp_path):
    first, second = _small_trainer(tracking=False), _small_trainer(tracking=False)
    assert first.checkpoint_dir != second.checkpoint_dir
    assert first.checkpoint_dir.parent == second.checkpoint_dir.parent == tmp_path / "checkpoints"
    first.close()
    second.close()


@pytest.mark.parametrize("where", ["under a file", "a file"])
def test_an_unwritable_checkpoint_dir_is_refused_before_training(tmp_path, migrated_store, where):
    from rl8.io.checkpoint_dir import CheckpointDirError

    (tmp_path / "afile").write_text("a file, not a folder")  # root ignores chmod: a file stops it
    folder = tmp_path / "afile" / "ck" if where == "under a file" else tmp_path / "afile"
    with pytest.raises(
        CheckpointDirError, match=rf"checkpoint_dir {folder} cannot be used for checkpoints"
    ):
        _small_trainer(checkpoint_dir=folder)
    assert _runs(migrated_store) == []


def test_an_unwritable_default_checkpoint_folder_is_refused_before_training(tmp_path, migrated_store):
    from rl8.io.checkpoint_dir import CheckpointDirError

    (tmp_path / "checkpoints").write_text("a file where the default folder goes")
    with pytest.raises(
        CheckpointDirError, match=rf"checkpoint folder {tmp_path / 'checkpoints'} cannot be used"
    ):
        _small_trainer()
    assert _runs(migrated_store) == []


def test_rl8_train_with_an_unwritable_checkpoint_dir_exits_2_before_training(
    tmp_path, migrated_store, capsys
):
    from rl8.cli import main

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
    assert _runs(migrated_store) == []


def test_rl8_train_into_the_folder_of_another_run_exits_2_and_resume_goes_on(
    tmp_path, migrated_store, capsys
):
    from rl8.cli import main

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
    assert len(_runs(migrated_store)) == 1


# ---- an older checkpoint, without a newer hyper-parameter -----------------------------------


def test_an_older_checkpoint_without_a_newer_hparam_resumes_from_the_cli_as_from_python(
    tmp_path, capsys
):
    from rl8 import Trainer
    from rl8.cli import main
    from rl8.io.checkpoint import load_checkpoint, save_checkpoint

    trainer = _small_trainer(checkpoint_dir=tmp_path / "ck", tracking=False)
    trainer.step()
    path = trainer.save_checkpoint()
    trainer.close()
    state = load_checkpoint(path)
    for newer in ("horizons_per_env_reset", "seqs_per_state_reset"):  # defaults -1: "given: -1"
        del state["algo"]["hparams"][newer]
    save_checkpoint(state, path)
    Trainer.from_checkpoint(path, progress=False).close()
    code = main(["train", "--resume", str(path), "--max-steps", "256", "--quiet"])
    assert code == 0, capsys.readouterr().err
    # a value given that differs from the default the checkpoint implies is still an error
    assert main(["train", "--resume", str(path), "--set", "horizons_per_env_reset=2", "--quiet"]) == 2
    assert "horizons_per_env_reset (checkpoint: -1, given: 2)" in capsys.readouterr().err


# ---- configs that would exhaust memory or the stack ------------------------------------------

BILLION_LAUGHS = (
    "env: rl8.envs.CartPole\nhparams:\n  model_config:\n    a: &a [x, x, x, x, x, x, x, x, x]\n"
    + "".join(f"    {c}: &{c} [{', '.join(['*' + p] * 9)}]\n" for p, c in zip("abcdefgh", "bcdefghi"))
)


def test_a_yaml_alias_bomb_is_a_config_error(tmp_path, capsys):
    from rl8.cli import ConfigError, load_config, main

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
    from rl8.cli import ConfigError, load_config

    path = tmp_path / "loop.yaml"
    path.write_text("env: rl8.envs.CartPole\nenv_config: &a {inner: [*a]}\n")
    with pytest.raises(ConfigError, match="contains itself"):
        load_config(path)


def test_a_deeply_nested_or_is_a_config_error(tmp_path, capsys):
    from rl8.cli import main
    from rl8.training.conditions import MAX_CONDITION_DEPTH, from_config

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


# ---- malformed or non-finite policy files and checkpoints -----------------------------------


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """A policy file and a Trainer checkpoint of CartPole, and their content."""
    from rl8 import PPO, Trainer, save_policy
    from rl8.envs import CartPole
    from rl8.io.checkpoint import load_checkpoint

    folder = tmp_path_factory.mktemp("saved")
    algo = PPO(CartPole, **SMALL)
    policy = save_policy(algo.policy, folder / "policy.pt", env={"spec": "rl8.envs.CartPole"})
    with Trainer(algo, tracking=False, checkpoint_dir=folder / "ck", progress=False) as trainer:
        checkpoint = trainer.save_checkpoint()
    return {"policy": load_checkpoint(policy), "checkpoint": load_checkpoint(checkpoint)}


def _first_weight(state):
    return next(iter(state))


def _fill(value):
    return lambda d, weight: d["state_dict"][weight].fill_(value)


def _wrong_shape(d, weight):
    import torch

    d["state_dict"][weight] = torch.zeros(3, 3)


def _set(entry, value):
    return lambda d, weight: d.__setitem__(entry, value)


#: (what, how the policy description is changed (given it and its first weight's name), the error)
BAD_POLICIES = [
    (
        "weights nan",
        _fill(float("nan")),
        r"the policy's weights hold NaN or inf: state_dict\['{weight}'\]",
    ),
    (
        "weights inf",
        _fill(float("inf")),
        r"the policy's weights hold NaN or inf: state_dict\['{weight}'\]",
    ),
    (
        "wrong shape",
        _wrong_shape,
        r"entry 'state_dict' does not match the model .*size mismatch for {weight}",
    ),
    (
        "weights not a dict",
        _set("state_dict", [1, 2]),
        "entry 'state_dict' must be a dict of tensors by name, got list",
    ),
    (
        "model_config not a dict",
        _set("model_config", [64, 64]),
        "entry 'model_config' must be a dict, got list",
    ),
    (
        "model_config bad",
        _set("model_config", {"hiddens": "wide"}),
        "cannot be built .*model_config hiddens: expected a sequence of ints",
    ),
    (
        "observations 2**30",
        lambda d, weight: d["observation_space"].__setitem__("shape", [2**30]),
        r"entry 'observation_space': the space declares 1073741824 elements, more than rl8 loads "
        r"\(MAX_SPACE_ELEMENTS = 16777216\)",
    ),
    (
        "actions 2**30",
        lambda d, weight: d["action_space"].__setitem__("n", 2**30),
        "entry 'action_space': the space declares 1073741824 elements",
    ),
    (
        "space not a dict",
        _set("observation_space", 4),
        "entry 'observation_space': expected a space description",
    ),
    (
        "box without low",
        lambda d, weight: d["observation_space"].pop("low"),
        "entry 'observation_space': 'low' must be a tensor",
    ),
]


@pytest.mark.parametrize("what,change,match", BAD_POLICIES, ids=[case[0] for case in BAD_POLICIES])
def test_a_malformed_policy_file_is_a_checkpoint_error_naming_the_entry(
    tmp_path, saved, what, change, match, capsys
):
    import copy

    from rl8 import load_policy
    from rl8.cli import main
    from rl8.io.checkpoint import CheckpointError, save_checkpoint

    policy = copy.deepcopy(saved["policy"])
    weight = _first_weight(policy["state_dict"])
    change(policy, weight)
    path = save_checkpoint(policy, tmp_path / "policy.pt")
    with pytest.raises(CheckpointError, match=match.format(weight=weight)):
        load_policy(path)
    assert main(["eval", str(path), "--episodes", "1"]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"rl8: error: {path}") and err.count("\n") == 1, err


def test_a_malformed_trainer_checkpoint_is_a_checkpoint_error_naming_the_entry(tmp_path, saved, capsys):
    import copy

    from rl8 import Trainer
    from rl8.cli import main
    from rl8.io.checkpoint import CheckpointError, save_checkpoint

    state = saved["checkpoint"]
    weight = _first_weight(state["algo"]["policy"])
    cases = {
        "hparams not a dict": (
            lambda s: s["algo"].__setitem__("hparams", "wide"),
            "hyper-parameters must be a dict",
            "entry 'algo.hparams' must be a dict",
        ),
        "weights not fitting the hparams": (
            lambda s: s["algo"]["hparams"].__setitem__("model_config", {"hiddens": [8]}),
            r"entry 'algo' does not fit the PPO its hyper-parameters \(entry 'algo.hparams'\) describe",
            "entry 'algo' does not fit",
        ),
        "weights nan": (
            lambda s: s["algo"]["policy"][weight].fill_(float("nan")),
            rf"entry 'algo.policy': the policy's weights hold NaN or inf: state_dict\['{weight}'\]",
            "hold NaN or inf",
        ),
    }
    for what, (change, python_match, cli_match) in cases.items():
        broken = copy.deepcopy(state)
        change(broken)
        (tmp_path / what.replace(" ", "-")).mkdir()
        path = save_checkpoint(broken, tmp_path / what.replace(" ", "-") / "checkpoint-000000000128.pt")
        with pytest.raises(CheckpointError, match=python_match):
            Trainer.from_checkpoint(path, progress=False)
        assert main(["train", "--resume", str(path), "--max-steps", "256", "--quiet"]) == 2, what
        err = capsys.readouterr().err
        assert cli_match in err and err.count("\n") == 1, (what, err)


# ---- env_config mistakes: before the run starts ---------------------------------------------


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
    from rl8.cli import main

    path = tmp_path / "config.yaml"
    path.write_text("env: rl8.envs.CartPole\nmax_steps: 128\n" + config)
    assert main(["train", str(path), *TINY_SET, *argv, "--quiet"]) == 2
    err = capsys.readouterr().err
    assert err == (
        f"rl8: error: {where}: CartPole.reset: unknown config key 'nope'; allowed keys: "
        "['force_mag', 'gravity', 'length', 'masscart', 'masspole', 'max_episode_steps', 'tau']\n"
    )
    assert _runs(migrated_store) == []  # no MLflow run was created
