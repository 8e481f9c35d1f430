"""How a run ends when ending it goes wrong: a bad status, a second signal during a signal exit,
a checkpoint that fails on a signal, a background start that failed while an exception
propagates."""

from __future__ import annotations

import signal
import threading
from pathlib import Path

import pytest
from hparams import SMALL
from mlflow.tracking import MlflowClient

from rl8 import PPO, Trainer
from rl8.envs import CartPole
from rl8.tracking import Tracker, TrackingWarning
from rl8.training.conditions import HitsUpperBound

pytestmark = [
    pytest.mark.usefixtures("migrated_store", "one_torch_thread"),
    pytest.mark.skipif(
        threading.current_thread() is not threading.main_thread(),
        reason="signal handlers are set in the main thread only",
    ),
]


def make_trainer(**kwargs) -> Trainer:
    return Trainer(PPO(CartPole, **SMALL), progress=False, **kwargs)


def status(mlflow_uri: str, trainer: Trainer) -> str:
    return MlflowClient(mlflow_uri).get_run(trainer.tracker.run_id).info.status


def signal_at_first_step(signum: int):
    """A callback of Trainer.run: the first training step sends ``signum`` to this process."""

    def step(trainer, stats):
        if stats["algorithm/steps"] == 1:
            signal.raise_signal(signum)

    return step


def test_close_with_a_bad_status_leaves_the_run_open_for_a_later_close(mlflow_uri):
    trainer = make_trainer()
    trainer.run_id  # starts the run
    with pytest.raises(ValueError, match="status must be one of .*'DONE'"):
        trainer.close("DONE")
    assert not trainer.closed
    trainer.close()
    assert status(mlflow_uri, trainer) == "FINISHED"


def test_a_second_signal_during_a_signal_exit_does_not_stop_the_run_being_marked(
    monkeypatch, mlflow_uri, tmp_path
):
    trainer = make_trainer(checkpoint_dir=tmp_path / "ck")
    trainer.run_id  # the run exists before the signals
    end = Tracker.end

    def end_interrupted(self, *args, **kwargs):  # Ctrl-C while the run is being marked KILLED
        signal.raise_signal(signal.SIGINT)
        return end(self, *args, **kwargs)

    monkeypatch.setattr(Tracker, "end", end_interrupted)
    with pytest.raises((SystemExit, KeyboardInterrupt)) as info:  # not the second signal's
        trainer.run(
            stop_conditions=HitsUpperBound("algorithm/steps", 100),
            callbacks=[signal_at_first_step(signal.SIGTERM)],
        )
    assert isinstance(info.value, SystemExit) and info.value.code == 143
    assert status(mlflow_uri, trainer) == "KILLED"


def test_a_failed_checkpoint_on_a_signal_still_exits_as_the_signal_within_its_limit(
    monkeypatch, mlflow_uri, tmp_path, capsys
):
    trainer = make_trainer(checkpoint_dir=tmp_path / "ck")
    trainer.run_id

    def save_checkpoint(path=None, *, wait_for_run=True):
        raise OSError("disk full")

    monkeypatch.setattr(trainer, "save_checkpoint", save_checkpoint)
    limits = []
    end = Tracker.end

    def end_recorded(self, status="FINISHED", *, timeout_s=None):
        limits.append(timeout_s)
        return end(self, status, timeout_s=timeout_s)

    monkeypatch.setattr(Tracker, "end", end_recorded)
    with pytest.raises(SystemExit) as info:
        trainer.run(
            stop_conditions=HitsUpperBound("algorithm/steps", 100),
            callbacks=[signal_at_first_step(signal.SIGTERM)],
        )
    assert info.value.code == 143
    assert isinstance(info.value.__cause__, OSError)
    assert status(mlflow_uri, trainer) == "KILLED"
    assert limits and all(t is not None and t <= 6 for t in limits)
    assert "SIGTERM: OSError: disk full while stopping" in capsys.readouterr().err


def unusable_uri(tmp_path: Path) -> str:
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    return f"sqlite:///{blocker / 'mlflow.db'}"  # its folder cannot be created


@pytest.fixture
def failed_start(tmp_path, monkeypatch) -> Trainer:
    """A Trainer whose background start failed, and nothing has raised that yet: its first step
    starts the run, whose start is held until that step is logged."""
    let_go, start = threading.Event(), Tracker.start

    def held(self):
        let_go.wait(10)
        return start(self)

    monkeypatch.setattr(Tracker, "start", held)
    trainer = make_trainer(tracking_uri=unusable_uri(tmp_path))
    trainer.step()
    let_go.set()
    assert trainer.tracker.wait_started(60)
    assert trainer.tracker.start_error is not None
    return trainer


@pytest.mark.parametrize("error", [KeyboardInterrupt, RuntimeError])
def test_an_error_in_run_is_not_replaced_by_a_failed_start(failed_start, error):
    def step(trainer, stats):  # a crash in the first step, before its stats are logged
        raise error("the user's error")

    with pytest.warns(TrackingWarning, match="could not be started"), pytest.raises(error):
        failed_start.run(stop_conditions=HitsUpperBound("algorithm/steps", 1), callbacks=[step])
    assert failed_start.closed


def test_an_error_in_a_with_block_is_not_replaced_by_a_failed_start(failed_start):
    with pytest.warns(TrackingWarning, match="could not be started"), pytest.raises(ValueError):
        with failed_start:
            raise ValueError("the user's error")


def test_a_resumed_run_logs_the_run_params_from_the_logging_thread(monkeypatch, mlflow_uri):
    first = make_trainer()
    run_id = first.run_id
    first.close()
    trainer = make_trainer(run_id=run_id)  # resumed: started before Trainer(...) returns
    threads = []
    log_batch = MlflowClient.log_batch

    def recorded(self, run_id, *args, params=(), **kwargs):
        if any(p.key.startswith("run/") for p in params):
            threads.append(threading.current_thread().name)
        return log_batch(self, run_id, *args, params=params, **kwargs)

    monkeypatch.setattr(MlflowClient, "log_batch", recorded)
    trainer.run(stop_conditions=HitsUpperBound("algorithm/steps", 1))
    trainer.close()
    assert threads == ["rl8-mlflow-logger"]  # a hung server does not hold up run()
    assert MlflowClient(mlflow_uri).get_run(run_id).data.params["run/steps_per_eval"] == "None"


def test_a_resumed_run_whose_conditions_held_says_so(tmp_path, capsys):
    one = [HitsUpperBound("algorithm/steps", 1)]
    two = [HitsUpperBound("algorithm/steps", 1), HitsUpperBound("env/steps", 10**6)]
    for conditions, stopped_by, line in [
        (
            one,
            one[0],
            "stopped by HitsUpperBound('algorithm/steps', 1), which already held at the "
            "checkpoint's step",
        ),
        (two, None, "stopped: the stop conditions already held at the checkpoint's step"),
    ]:
        folder = tmp_path / str(len(conditions))
        with make_trainer(checkpoint_dir=folder) as trainer:
            trainer.run(stop_conditions=conditions)
        capsys.readouterr()
        with Trainer.from_checkpoint(folder, progress=True) as resumed:
            resumed.run(stop_conditions=conditions)
        assert resumed.stopped_by is stopped_by
        assert line in capsys.readouterr().err
