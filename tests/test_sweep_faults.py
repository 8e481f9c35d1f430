"""rl8 sweep under faults: Ctrl-C, kill -9 of the sweep or of a trial (stale trials found by
their heartbeat), two sweeps of one study at once, each followed by a rerun whose counts and best
agree with the study (docs/sweeps.md, "When a sweep dies"). Real ``python -m rl8 sweep``
processes; every store is in tmp_path."""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

optuna = pytest.importorskip("optuna")
pytest_plugins = ["sweep_support"]  # the fixture files

from mlflow.tracking import MlflowClient  # noqa: E402
from sweep_support import HEARTBEAT_ENV, sweep_runs  # noqa: E402

import rl8  # noqa: E402
from rl8.cli.main import main  # noqa: E402
from rl8.sweeps import study as sweep_study  # noqa: E402
from rl8.tracking.runs import running_runs  # noqa: E402


def _sweep_process(files, tmp_path, *args, config=None, out="", env=()):
    """``python -m rl8 sweep`` of the study "s" in its own session (as a terminal's foreground
    job, which Ctrl-C signals as a group), with the options ``args`` (default: 2 trials that train
    until stopped), of ``config`` (default: the test's config checkpointing every step), the
    environment variables ``env`` added, its output in ``<out>out.txt`` and ``<out>err.txt``."""
    if config is None:
        config = tmp_path / "long.yaml"
        config.write_text(Path(files["config"]).read_text() + "checkpoint_every: 1\n")
    root = str(Path(rl8.__file__).parents[1])  # this rl8, not an installed one
    env = {
        **os.environ,
        **dict(env),
        "PYTHONPATH": os.pathsep.join([root, os.environ.get("PYTHONPATH", "")]),
    }
    argv = [sys.executable, "-m", "rl8", "sweep", str(config), "--space", files["space"]]
    argv += ["--study", "s", "--storage", files["storage"]]
    argv += args or ["--trials", "2", "--max-env-steps", "10000000"]
    with open(tmp_path / f"{out}out.txt", "w") as stdout, open(tmp_path / f"{out}err.txt", "w") as err:
        return subprocess.Popen(
            argv, cwd=tmp_path, env=env, stdout=stdout, stderr=err, start_new_session=True
        )


def _wait_training(process, tmp_path):
    """Wait until a trial of the sweep ``process`` trains: it has a checkpoint."""
    deadline = time.monotonic() + 120
    while not list(tmp_path.glob("checkpoints/*/checkpoint-*.pt")):
        assert process.poll() is None and time.monotonic() < deadline, (tmp_path / "err.txt").read_text()
        time.sleep(0.1)


def _kill_group(process):
    """SIGKILL what is left of the sweep ``process``'s session: it, its trials, its forkserver."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGKILL)
    process.wait()


def _assert_parent_has_the_best(study, parent, finished):
    """The study's run ``parent`` has the best of ``study`` and its ``finished`` trials' counts."""
    counts = {state.lower(): count for state, count in sweep_study.state_counts(study).items()}
    assert sum(counts[state] for state in ("complete", "pruned", "fail")) == finished
    assert {k: parent.data.metrics[f"trials/{k}"] for k in counts} == counts
    assert parent.data.metrics["best/value"] == study.best_value
    assert parent.data.tags["best/trial"] == str(study.best_trial.number)


@pytest.mark.slow
@pytest.mark.timeout(240)
@pytest.mark.parametrize("to", ["group", "sweep"])
def test_ctrl_c_marks_the_trial_fail_its_run_killed_and_a_rerun_continues(
    files, tmp_path, capsys, migrated_store, to
):
    """Ctrl-C signals the sweep and its trials (``group``); ``kill -INT`` the sweep alone."""
    process = _sweep_process(files, tmp_path)
    try:
        _wait_training(process, tmp_path)
        (os.killpg if to == "group" else os.kill)(process.pid, signal.SIGINT)
        assert process.wait(timeout=90) == 130
    finally:
        _kill_group(process)
    err = (tmp_path / "err.txt").read_text()
    assert "Traceback" not in err
    assert err.splitlines()[-1] == (
        "rl8: sweep s: interrupted: trial 0 marked FAIL; rerun the same command to continue the "
        "study (--trials 2 runs the 2 of its 2 trials left)"
    )
    study = optuna.load_study(study_name="s", storage=files["storage"])
    assert [t.state.name for t in study.trials] == ["FAIL"]
    _, (parent,), (run,) = sweep_runs(files["uri"])
    assert run.info.run_id == study.trials[0].user_attrs["mlflow_run_id"]
    assert (run.info.status, run.data.tags["rl8.sweep.state"]) == ("KILLED", "FAIL")
    assert parent.info.status == "KILLED"

    study.ask()  # a trial that another machine is training: RUNNING, counted as such
    args = ["sweep", files["config"], "--space", files["space"], "--storage", files["storage"]]
    assert main([*args, "--study", "s", "--trials", "2"]) == 0  # the 2 trials left
    summary = capsys.readouterr().out.splitlines()[0]
    counts = re.fullmatch(
        r"rl8: study s: 4 trials \((\d+) complete, (\d+) pruned, 1 fail, 1 running\)", summary
    )
    assert counts and int(counts[1]) + int(counts[2]) == 2, summary
    study = optuna.load_study(study_name="s", storage=files["storage"])
    assert [t.state.name for t in study.trials][:2] == ["FAIL", "RUNNING"]
    _, (parent,), children = sweep_runs(files["uri"])
    assert parent.info.status == "FINISHED" and len(children) == 3
    _assert_parent_has_the_best(study, parent, finished=3)


@pytest.mark.slow
@pytest.mark.timeout(240)
@pytest.mark.parametrize("to", ["group", "sweep"])
def test_sigkill_of_the_sweep_then_a_rerun_marks_the_trial_fail_and_runs_the_trials_left(
    files, tmp_path, capsys, migrated_store, monkeypatch, to
):
    """``kill -9`` of the whole sweep (``group``: its trial dies with it, as in a power loss):
    the trial's heartbeat stops, and the rerun marks it ``FAIL`` once the grace period has
    passed and ends its run ``FAILED``. Of the sweep alone (``sweep``): its trial stops itself,
    is ``FAIL`` and its run ``KILLED`` before any rerun."""
    argv = ["--trials", "1", "--max-env-steps", "10000000"]
    process = _sweep_process(files, tmp_path, *argv, env=HEARTBEAT_ENV)
    try:
        _wait_training(process, tmp_path)
        (trial,) = running_runs(files["uri"], experiment="sweep-test")[1:]  # after the study's
        (os.killpg if to == "group" else os.kill)(process.pid, signal.SIGKILL)
        assert process.wait(timeout=30) == -signal.SIGKILL
        if to == "group":
            time.sleep(5)  # the grace period, 3 s, from the last heartbeat (SQLite's clock: whole s)
        else:  # the trial's last act: its run's tags
            deadline = time.monotonic() + 60
            while "rl8.sweep.state" not in MlflowClient(files["uri"]).get_run(trial.run_id).data.tags:
                assert time.monotonic() < deadline, "the trial of a killed sweep trains on"
                time.sleep(0.2)
    finally:
        _kill_group(process)
    study = optuna.load_study(study_name="s", storage=files["storage"])
    assert [t.state.name for t in study.trials] == [{"group": "RUNNING", "sweep": "FAIL"}[to]]
    assert study.trials[0].user_attrs["mlflow_run_id"] == trial.run_id

    for name, value in HEARTBEAT_ENV.items():
        monkeypatch.setenv(name, value)
    args = ["sweep", files["config"], "--space", files["space"], "--storage", files["storage"]]
    assert main([*args, "--study", "s", "--trials", "1"]) == 0  # the trial asked for, again
    study = optuna.load_study(study_name="s", storage=files["storage"])
    states = [t.state.name for t in study.trials]
    assert states[0] == "FAIL" and states[1] in ("COMPLETE", "PRUNED") and len(states) == 2
    _, (parent,), children = sweep_runs(files["uri"])
    assert sorted(int(run.data.tags["rl8.sweep.trial"]) for run in children) == [0, 1]
    (killed,) = [run for run in children if run.info.run_id == trial.run_id]
    assert killed.data.tags["rl8.sweep.state"] == "FAIL"
    assert killed.info.status == {"group": "FAILED", "sweep": "KILLED"}[to]
    assert parent.info.status == "FINISHED"
    _assert_parent_has_the_best(study, parent, finished=2)
    stale_line = (
        f"rl8: sweep s: trial 0 had no heartbeat for over 3 s (its process or machine died): "
        f"marked FAIL, its run {trial.run_id} FAILED"
    )
    assert (stale_line in capsys.readouterr().err) == (to == "group")


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_sigkill_of_a_trial_marks_it_fail_its_run_failed_and_the_sweep_goes_on(
    files, tmp_path, migrated_store
):
    """Each trial is a process of its own: ``kill -9`` of one (the OOM killer's) leaves the sweep."""
    process = _sweep_process(
        files, tmp_path, "--trials", "2", "--max-env-steps", "10000000", "--max-seconds", "8"
    )
    try:
        _wait_training(process, tmp_path)
        (trial,) = running_runs(files["uri"], experiment="sweep-test")[1:]  # after the study's
        os.kill(trial.pid, signal.SIGKILL)
        assert process.wait(timeout=120) == 0, (tmp_path / "err.txt").read_text()
    finally:
        _kill_group(process)
    study = optuna.load_study(study_name="s", storage=files["storage"])
    assert [t.state.name for t in study.trials] == ["FAIL", "COMPLETE"]
    _, (parent,), children = sweep_runs(files["uri"])
    statuses = {run.data.tags["rl8.sweep.trial"]: run.info.status for run in children}
    assert statuses == {"0": "FAILED", "1": "FINISHED"}
    assert study.trials[0].user_attrs["mlflow_run_id"] == trial.run_id
    _assert_parent_has_the_best(study, parent, finished=2)
    assert "rl8: study s: 2 trials (1 complete, 0 pruned, 1 fail)" in (tmp_path / "out.txt").read_text()


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_two_sweeps_of_one_study_at_once_share_its_trials_and_its_run(files, tmp_path, migrated_store):
    processes = [
        _sweep_process(files, tmp_path, "--trials", "2", config=files["config"], out=out)
        for out in ("a-", "b-")
    ]
    try:
        for process, out in zip(processes, ("a-", "b-")):
            assert process.wait(timeout=180) == 0, (tmp_path / f"{out}err.txt").read_text()
    finally:
        for process in processes:
            _kill_group(process)
    study = optuna.load_study(study_name="s", storage=files["storage"])
    assert [t.number for t in study.trials] == [0, 1, 2, 3]
    assert {t.state.name for t in study.trials} <= {"COMPLETE", "PRUNED"}
    _, (parent,), children = sweep_runs(files["uri"])
    assert sorted(int(run.data.tags["rl8.sweep.trial"]) for run in children) == [0, 1, 2, 3]
    assert study.user_attrs["mlflow_run_id"] == parent.info.run_id
    _assert_parent_has_the_best(study, parent, finished=4)
