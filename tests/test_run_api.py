"""Trainer.run as SB3 and CleanRL users look for it: a step budget in one call, presets from
Python, callbacks; a condition on eval stats without evaluations; where the results went; a
progress line that tells the truth."""

from __future__ import annotations

import io
import math
import re
import types
import warnings
from pathlib import Path

import numpy as np
import pytest
from hparams import SMALL, STEP
from mlflow.entities import ViewType
from mlflow.tracking import MlflowClient

import rl8
import rl8.presets
from rl8 import PPO, Trainer
from rl8.envs import CartPole
from rl8.training.callbacks import Callback
from rl8.training.conditions import And, HitsUpperBound, MissingStatError, Or, TimeLimit
from rl8.training.progress import Progress

pytestmark = pytest.mark.usefixtures("migrated_store", "one_torch_thread")

REPO = Path(__file__).resolve().parents[1]


def make_trainer(**options) -> Trainer:
    return Trainer(PPO(CartPole, **SMALL), **{"progress": False, **options})


# --------------------------------------------------------------------------------------------
# a stop condition on an eval/ stat needs evaluations


@pytest.mark.parametrize(
    "condition",
    [
        HitsUpperBound("eval/episodes/return_mean", 475),
        Or(
            [
                HitsUpperBound("env/steps", 10**9),
                And([TimeLimit(3600), HitsUpperBound("eval/episodes/return_mean", 475)]),
            ]
        ),
    ],
    ids=["plain", "nested"],
)
def test_an_eval_condition_without_evaluations_fails_before_the_first_step(condition):
    with make_trainer(tracking=False) as trainer:
        with pytest.raises(
            MissingStatError,
            match=r"'eval/episodes/return_mean'.*steps_per_eval=None.*"
            r"steps_per_eval=N",
        ):
            trainer.run(stop_conditions=condition)
        assert trainer.algo.steps == 0
        # with evaluations the same condition is fine
        trainer.run(stop_conditions=[condition, HitsUpperBound("env/steps", STEP)], steps_per_eval=1)
        assert trainer.algo.steps == 1


def test_rl8_train_refuses_an_eval_condition_without_evaluations(tmp_path, capsys):
    from rl8.cli import main

    config = tmp_path / "run.yaml"
    config.write_text(
        "env: rl8.envs.CartPole\nhparams: {num_envs: 16, horizon: 8, sgd_minibatch_size: 64}\n"
        "stop_conditions:\n  - hits_upper_bound: {key: eval/episodes/return_mean, bound: 475}\n"
    )
    assert main(["train", str(config), "--quiet"]) == 2
    assert "--steps-per-eval N" in capsys.readouterr().err


# --------------------------------------------------------------------------------------------
# a step budget in one call


def test_max_env_steps_max_seconds_and_learn():
    with make_trainer(tracking=False) as trainer:
        stats = trainer.run(max_env_steps=2 * STEP)
        assert stats["env/steps"] == 2 * STEP
        assert repr(trainer.stopped_by) == f"HitsUpperBound('env/steps', {2 * STEP})"
        # with stop_conditions: whichever holds first
        trainer.run(max_env_steps=10 * STEP, stop_conditions=HitsUpperBound("algorithm/steps", 3))
        assert trainer.algo.steps == 3
        trainer.run(max_env_steps=4 * STEP, stop_conditions=HitsUpperBound("algorithm/steps", 100))
        assert trainer.algo.env_steps == 4 * STEP
        trainer.run(max_seconds=1e-6)  # one step: the time limit holds after it
        assert trainer.algo.steps == 5 and isinstance(trainer.stopped_by, TimeLimit)
        trainer.learn(STEP)  # SB3's name and meaning: this many more env steps
        assert trainer.algo.env_steps == 6 * STEP


def test_learn_takes_stable_baselines3s_total_timesteps():
    with make_trainer(tracking=False) as trainer:
        trainer.learn(total_timesteps=STEP)  # SB3's name, the same meaning as env_steps
        trainer.learn(total_timesteps=STEP)
        assert trainer.algo.env_steps == 2 * STEP
        both = "got both (env_steps=128, total_timesteps=128)"
        for kwargs, given in [({}, "got neither"), ({"env_steps": STEP, "total_timesteps": STEP}, both)]:
            with pytest.raises(
                TypeError,
                match=re.escape(
                    "Trainer.learn: give the env steps to train for from now as env_steps "
                    f"(learn(100_000)) or as Stable-Baselines3's total_timesteps=..., one of the two; {given}"
                ),
            ):
                trainer.learn(**kwargs)
        with pytest.raises(
            ValueError, match=r"^Trainer.learn: total_timesteps must be an int >= 1, got 0$"
        ):
            trainer.learn(total_timesteps=0)
        assert trainer.algo.env_steps == 2 * STEP


def test_learn_checks_every_argument_before_anything_runs(mlflow_uri):
    """Stable-Baselines3's arguments of learn, all named in one error with rl8's way, before a step
    or a run param; the Trainer then learns as asked."""
    with make_trainer() as trainer:
        with pytest.raises(TypeError) as error:
            trainer.learn(
                total_timesteps=STEP,
                callback=print,
                progress_bar=True,
                tb_log_name="PPO",
                stop_condition=None,
            )
        message = str(error.value)
        assert message.startswith(
            "Trainer.learn: 4 unknown arguments (valid: env_steps, total_timesteps, env_config, "
        )
        for line in [
            "'callback': Stable-Baselines3's callback is callbacks=[...]: callables callback(trainer, stats)",
            "'progress_bar': Stable-Baselines3's progress_bar is Trainer(algo, progress=True)",
            "'tb_log_name': Stable-Baselines3's tb_log_name is Trainer(algo, experiment=..., run_name=...)",
            "'stop_condition': did you mean 'stop_conditions'?",
        ]:
            assert f"\n  {line}" in message
        with pytest.raises(
            TypeError,
            match=r"unknown argument 'max_env_steps'; learn sets it .*trainer.run\(max_env_steps=N\) is a total budget",
        ):
            trainer.learn(STEP, max_env_steps=STEP)
        assert trainer.algo.steps == 0
        assert runs_in(mlflow_uri) == []  # no run was started
        trainer.learn(total_timesteps=STEP)
        assert trainer.algo.env_steps == STEP


def runs_in(uri: str) -> list:
    """Every run of the store at ``uri``, deleted ones included."""
    client = MlflowClient(uri)
    experiments = [e.experiment_id for e in client.search_experiments(view_type=ViewType.ALL)]
    return client.search_runs(experiments, run_view_type=ViewType.ALL)


@pytest.mark.parametrize(
    "call, error, message",
    [
        (
            lambda t: t.run(bogus=1),
            TypeError,
            "Trainer.run: unknown argument 'bogus' (valid: env_config, ",
        ),
        (
            lambda t: t.run(total_timesteps=STEP),
            TypeError,
            "Trainer.run: unknown argument 'total_timesteps'; Stable-Baselines3's total_timesteps is "
            "max_env_steps=N here, a total budget (a resumed run's env steps included), or "
            "trainer.learn(N) to train N more env steps",
        ),
        (
            lambda t: t.run(max_stepz=STEP),
            TypeError,
            "Trainer.run: unknown argument 'max_stepz'; did you mean 'max_env_steps' or 'max_seconds'?",
        ),
        (
            lambda t: t.run(max_env_steps=-1),
            ValueError,
            "max_env_steps must be an int >= 1 or None, got -1",
        ),
        (lambda t: t.learn(0), ValueError, "Trainer.learn: env_steps must be an int >= 1, got 0"),
        (lambda t: t.learn(STEP, bogus=1), TypeError, "Trainer.learn: unknown argument 'bogus'"),
        (  # the run plan's check
            lambda t: t.run(
                max_env_steps=STEP, stop_conditions=HitsUpperBound("eval/episodes/return_mean", 1)
            ),
            MissingStatError,
            "but this run never evaluates (steps_per_eval=None)",
        ),
        (
            lambda t: t.run(env_config={"nope": 1}, max_env_steps=STEP),
            ValueError,
            "Trainer.run: env_config: CartPole.reset: unknown config key 'nope'",
        ),
    ],
)
def test_a_call_that_fails_its_argument_checks_leaves_no_mlflow_run(mlflow_uri, call, error, message):
    trainer = make_trainer()
    with pytest.raises(error, match=re.escape(message)):
        call(trainer)
    trainer.close()
    assert trainer.algo.steps == 0 and trainer.run_id is None
    assert runs_in(mlflow_uri) == []


def test_the_run_starts_at_the_first_call_that_needs_it(mlflow_uri):
    with make_trainer() as trainer:
        assert runs_in(mlflow_uri) == []  # creating the Trainer starts no run
        with pytest.raises(TypeError):
            trainer.run(bogus=1)
        run_id = trainer.run_id  # read: the run starts (and this waits for it)
        trainer.flush()  # the configuration, queued
        [run] = runs_in(mlflow_uri)
        assert run.info.run_id == run_id and run.data.params["hparams/horizon"] == "8"
        trainer.run(max_env_steps=STEP)  # the same run
    assert [r.info.run_id for r in runs_in(mlflow_uri)] == [run_id]
    with make_trainer() as unused:
        pass
    assert unused.run_id is None and len(runs_in(mlflow_uri)) == 1  # closed unused: no run


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"max_env_steps": 0}, "max_env_steps must be an int >= 1 or None, got 0"),
        ({"max_env_steps": 1.5}, "max_env_steps must be an int >= 1 or None, got 1.5"),
        ({"max_seconds": -1}, "max_seconds must be a number of seconds > 0 or None, got -1"),
        ({"max_seconds": math.inf}, "max_seconds must be a number of seconds > 0 or None, got inf"),
    ],
)
def test_a_bad_budget_is_an_error_naming_it(kwargs, message):
    with make_trainer(tracking=False) as trainer, pytest.raises(ValueError, match=re.escape(message)):
        trainer.run(**kwargs)


def test_rl8_train_takes_max_env_steps(capsys, mlflow_uri):
    from rl8.cli import main

    argv = [
        "train",
        "--env",
        "rl8.envs.CartPole",
        "--set",
        "num_envs=16",
        "--set",
        "horizon=8",
        "--set",
        "sgd_minibatch_size=64",
        "--max-env-steps",
        str(STEP),
        "--quiet",
    ]
    assert main(argv) == 0
    assert f"rl8: {STEP} env steps, 1 training steps" in capsys.readouterr().out


# --------------------------------------------------------------------------------------------
# callbacks


def test_a_callback_sees_every_step_adds_stats_and_stops_the_run(mlflow_uri):
    seen = []

    def callback(trainer, stats):
        seen.append((trainer, stats["algorithm/steps"]))
        stats["my/double_steps"] = 2.0 * stats["algorithm/steps"]
        return "stop" if stats["algorithm/steps"] >= 3 else None

    trainer = make_trainer(log_every=1)
    # the added stat is seen by the stop conditions (which would stop at 4) and logged
    stats = trainer.run(callbacks=callback, stop_conditions=HitsUpperBound("my/double_steps", 8))
    trainer.close()
    assert seen == [(trainer, 1), (trainer, 2), (trainer, 3)] and trainer.stopped_by is None
    assert stats["my/double_steps"] == 6.0
    history = MlflowClient(mlflow_uri).get_metric_history(trainer.run_id, "my/double_steps")
    assert [m.value for m in history] == [2.0, 4.0, 6.0]


def test_the_summary_names_the_callback_that_stopped_the_run(capsys):
    def enough(trainer, stats):
        return rl8.STOP

    with make_trainer(progress=None) as trainer:
        trainer.run(callbacks=[enough])
    assert "rl8: stopped by the callback enough after 128 env steps" in capsys.readouterr().err


def test_a_callback_class_gets_on_eval_on_evaluation_steps_only():
    class Record(Callback):
        def __init__(self):
            self.steps, self.evals = [], []

        def on_step(self, trainer, stats):
            self.steps.append(stats["algorithm/steps"])

        def on_eval(self, trainer, stats):
            self.evals.append((stats["algorithm/steps"], "eval/episodes/return_mean" in stats))
            return rl8.STOP if len(self.evals) == 2 else None

    record = Record()
    with Trainer(PPO(CartPole, **SMALL), progress=False, tracking=False, eval_num_envs=2) as trainer:
        trainer.run(steps_per_eval=2, callbacks=[record], max_env_steps=100 * STEP)
    assert record.steps == [1, 2, 3, 4] and record.evals == [(2, True), (4, True)]


def test_an_exception_in_a_callback_fails_the_run(mlflow_uri):
    def crash(trainer, stats):
        if stats["algorithm/steps"] == 2:
            raise RuntimeError("the user's bug")

    trainer = make_trainer()
    with pytest.raises(RuntimeError, match="the user's bug"):
        trainer.run(callbacks=[crash], max_env_steps=10 * STEP)
    assert trainer.closed and trainer.algo.steps == 2
    assert MlflowClient(mlflow_uri).get_run(trainer.run_id).info.status == "FAILED"


def test_a_nan_that_a_callback_injects_is_not_logged_and_fires_no_condition(mlflow_uri):
    def nan_return(trainer, stats):
        stats["episodes/return_mean"] = math.nan

    trainer = make_trainer()
    trainer.run(
        callbacks=[nan_return],
        stop_conditions=[
            HitsUpperBound("episodes/return_mean", -1e9),
            HitsUpperBound("env/steps", 2 * STEP),
        ],
    )
    trainer.close()
    assert repr(trainer.stopped_by) == f"HitsUpperBound('env/steps', {2 * STEP})"
    assert MlflowClient(mlflow_uri).get_metric_history(trainer.run_id, "episodes/return_mean") == []


def test_a_callback_that_is_not_callable_is_a_type_error():
    with (
        make_trainer(tracking=False) as trainer,
        pytest.raises(TypeError, match=r"callbacks\[1\] must be a callable"),
    ):
        trainer.run(callbacks=[lambda t, s: None, "stop"], max_env_steps=STEP)
    assert trainer.algo.steps == 0


# --------------------------------------------------------------------------------------------
# where the results went


def test_run_says_where_the_results_go_at_the_start_and_the_end(capsys, tmp_path):
    trainer = make_trainer(progress=None, checkpoint_dir=tmp_path / "ck")
    run_id = trainer.run_id  # started: the start lines come before the first step
    trainer.run(max_env_steps=STEP)
    trainer.close()
    captured = capsys.readouterr()
    uri = trainer.tracker.tracking_uri
    # where the run goes: first, on stderr with the progress lines
    start = captured.err.splitlines()[:2]
    assert start[0].startswith(f"rl8: MLflow run {run_id} in {uri} (to see it: mlflow ui")
    assert start[1] == f"rl8: checkpoints in {tmp_path / 'ck'}"
    # where the results went: on stdout (what rl8 train --quiet prints for scripts)
    assert "MLflow run" not in captured.out
    end = captured.out.split(f"rl8: {STEP} env steps, 1 training steps\n")[1]
    checkpoint = tmp_path / "ck" / f"checkpoint-{STEP:012d}.pt"
    assert f"run id:     {run_id}\ntracking:   {uri}\ncheckpoint: {checkpoint}\n" in end
    assert f"resume:     Trainer.from_checkpoint('{checkpoint}')" in end
    assert "mlflow ui:  mlflow ui" in end
    # quiet: nothing
    quiet = make_trainer(progress=False)
    quiet.run(max_env_steps=STEP)
    quiet.close()
    assert capsys.readouterr() == ("", "")


@pytest.mark.parametrize("quiet", [True, False])
def test_rl8_train_prints_where_the_results_went_once(quiet, capsys):
    from rl8.cli import main

    argv = [
        "train",
        "--env",
        "rl8.envs.CartPole",
        "--set",
        "num_envs=16",
        "--set",
        "horizon=8",
        "--set",
        "sgd_minibatch_size=64",
        "--max-steps",
        str(STEP),
        *(["--quiet"] if quiet else []),
    ]
    assert main(argv) == 0
    out, err = capsys.readouterr()
    assert out.count("run id:") == 1 and out.count("mlflow ui:") == 1
    assert re.search(r"^resume:     rl8 train --resume \S+checkpoint-000000000128\.pt$", out, re.M)
    if quiet:
        assert err == ""
        return
    # where the run goes: on stderr, first, then the progress line and the summary
    assert "rl8: MLflow run" not in out and "rl8: checkpoints in" not in out
    run_line, folder_line, progress, summary = err.splitlines()
    assert run_line.startswith("rl8: MLflow run ") and folder_line.startswith("rl8: checkpoints in ")
    assert progress.startswith(f"rl8 {STEP} env steps | ") and summary.startswith("rl8: stopped by")


# --------------------------------------------------------------------------------------------
# the progress line


class Clock:
    """time.monotonic for rl8.training.progress, advanced by hand."""

    def __init__(self):
        self.now = 1000.0

    def __call__(self):
        return self.now


@pytest.fixture
def clock(monkeypatch):
    """The clock of the progress line and of time limits."""
    import rl8.training.conditions.clock
    import rl8.training.progress

    clock = Clock()
    for module in (rl8.training.progress, rl8.training.conditions.clock):
        monkeypatch.setattr(module, "time", types.SimpleNamespace(monotonic=clock))
    return clock


def lines(stream: io.StringIO) -> list[str]:
    return stream.getvalue().splitlines()


def test_a_percentage_reaches_100_only_when_the_bound_holds(clock):
    stream = io.StringIO()
    progress = Progress(None, stream, interval_s=0)
    target = [HitsUpperBound("episodes/return_mean", 475)]
    progress.update({"env/steps": 100, "episodes/return_mean": 10.0}, target)
    progress.update({"env/steps": 200, "episodes/return_mean": 474.5}, target, held=[False])
    assert "return 474.5 | 99% to episodes/return_mean >= 475" in lines(stream)[-1]
    progress.update({"env/steps": 300, "episodes/return_mean": 475.0}, target, held=[True])
    assert "100% to episodes/return_mean >= 475" in lines(stream)[-1]
    # rounded down: 99.6% of an env-step budget is 99%
    stream = io.StringIO()
    progress = Progress(None, stream, interval_s=0)
    counter = [HitsUpperBound("env/steps", 1000)]
    progress.update({"env/steps": 996}, counter, held=[False])
    assert "99% to env/steps >= 1000" in lines(stream)[-1]


def test_the_target_does_not_flicker_between_conditions(clock):
    stream = io.StringIO()
    progress = Progress(None, stream, interval_s=0)
    conditions = [
        HitsUpperBound("episodes/return_mean", 100),
        HitsUpperBound("eval/episodes/return_mean", 100),
    ]
    progress.update({"episodes/return_mean": 0.0, "eval/episodes/return_mean": 0.0}, conditions)
    for i in range(10):  # the two alternate as the closer one by a few points
        train, evaluate = (50.0, 47.0) if i % 2 else (47.0, 50.0)
        progress.update(
            {"episodes/return_mean": train, "eval/episodes/return_mean": evaluate}, conditions
        )
    targets = {re.search(r"% to (\S+)", line).group(1) for line in lines(stream)}
    assert len(targets) == 1
    # a condition clearly closer becomes the target
    progress.update({"episodes/return_mean": 40.0, "eval/episodes/return_mean": 90.0}, conditions)
    assert "90% to eval/episodes/return_mean >= 100" in lines(stream)[-1]


def test_the_eta_of_an_env_step_budget_is_the_remaining_steps_at_the_observed_rate(clock):
    stream = io.StringIO()
    progress = Progress(None, stream, interval_s=0)
    conditions = [HitsUpperBound("env/steps", 10_000)]
    progress.update({"env/steps": 1000}, conditions)
    clock.now += 10  # 100 env steps/s
    progress.update({"env/steps": 2000}, conditions)
    assert lines(stream)[-1].endswith("20% to env/steps >= 1e+04 | ETA 1m20s")


def test_a_return_target_has_an_eta_only_from_its_trend_and_the_budget_is_labelled(clock):
    stream = io.StringIO()
    progress = Progress(None, stream, interval_s=0)
    # the issue: a return target and an hour's time limit; the run ends when the return holds
    conditions = [HitsUpperBound("episodes/return_mean", 475), TimeLimit(3600)]
    conditions[1].start()
    for i, value in enumerate([25.0, 75.0, 125.0, 175.0]):  # +50 every 10 s
        progress.update({"env/steps": 1000 * (i + 1), "episodes/return_mean": value}, conditions)
        clock.now += 10
    line = lines(stream)[-1]
    assert "33% to episodes/return_mean >= 475" in line
    assert "ETA ~1m00s at the recent trend" in line  # (475 - 175) / 5 per s
    assert "| budget " in line and "ETA <=" not in line
    # a return that does not head for the bound (its last 10 values) has no ETA: the time limit,
    # which has one, is then the nearest condition
    for value in range(170, 120, -5):
        progress.update({"env/steps": 5000, "episodes/return_mean": float(value)}, conditions)
        clock.now += 10
    assert lines(stream)[-1].endswith("3% to time limit 1h00m | ETA 57m50s")


def targets(stream: io.StringIO) -> list[str]:
    """The conditions the progress lines name, each time the target changes."""
    named = [re.search(r"% to (.+?)(?: \||$)", line).group(1) for line in lines(stream)]
    return [name for i, name in enumerate(named) if i == 0 or name != named[i - 1]]


def test_the_target_does_not_alternate_between_a_budget_and_an_eval_target(clock):
    # the issue: "2% to env/steps >= 2e+06 | ETA 1h15m", then "81% to
    # eval/episodes/return_mean >= 475 | ETA ~37s", line by line: the eval stat is only in the
    # stats of evaluation steps
    stream = io.StringIO()
    progress = Progress(None, stream, interval_s=0)
    conditions = [
        HitsUpperBound("env/steps", 2_000_000),
        HitsUpperBound("eval/episodes/return_mean", 475),
    ]
    for step in range(1, 31):
        clock.now += 1
        stats = {"env/steps": 1000 * step, "throughput/env_steps_per_s": 1000.0}
        if step % 5 == 0:  # an evaluation: +50 every 5 s
            stats["eval/episodes/return_mean"] = 50.0 + 10 * step
        progress.update(stats, conditions)
    # the budget (ETA 33m) until the eval return has a trend (ETA 28s at its third value), then
    # the eval return on every line, also between evaluations
    assert targets(stream) == ["env/steps >= 2e+06", "eval/episodes/return_mean >= 475"]
    assert lines(stream)[-1].endswith(
        "eval return 350 | 66% to eval/episodes/return_mean >= 475 | ETA ~12s at the recent trend "
        "| budget 32m50s left"
    )


def test_the_target_is_the_condition_with_the_nearest_eta(clock):
    # a resumed run half way through its env steps, and a time limit: the env steps are closer
    # to their bound (60% against 25%), the time limit ends the run sooner (30 s against 40 s)
    stream = io.StringIO()
    progress = Progress(None, stream, interval_s=0)
    conditions = [HitsUpperBound("env/steps", 1000), TimeLimit(40)]
    conditions[1].start()
    progress.update({"env/steps": 500}, conditions)
    clock.now += 10
    progress.update({"env/steps": 600}, conditions)
    assert lines(stream)[-1].endswith("25% to time limit 40s | ETA 30s")
    # equal ETAs: the first listed, every time
    for order in ([0, 1], [1, 0]):
        stream = io.StringIO()
        progress = Progress(None, stream, interval_s=0)
        pair = [HitsUpperBound("algorithm/steps", 10), HitsUpperBound("env/steps", 1280)]
        pair = [pair[i] for i in order]
        for step in range(1, 6):
            clock.now += 1
            progress.update({"env/steps": 128 * step, "algorithm/steps": step}, pair)
        assert targets(stream) == [re.search(r"% to (.+?) \|", lines(stream)[-1]).group(1)]
        assert (
            f"to {'algorithm/steps >= 10' if order == [0, 1] else 'env/steps >= 1280'} |"
            in (lines(stream)[-1])
        )


def test_the_speed_is_the_logged_throughput(clock):
    # the issue: 56 steps/s on the line (the average since the start), 69.8 logged
    stream = io.StringIO()
    progress = Progress(None, stream, interval_s=0)
    progress.update({"env/steps": 1000, "throughput/env_steps_per_s": 69.8}, [])
    clock.now += 10
    progress.update({"env/steps": 1560, "throughput/env_steps_per_s": 69.8}, [])
    assert lines(stream)[-1] == "rl8 1.56k env steps | 70 steps/s"


def test_a_run_prints_its_last_line_once_with_the_logged_throughput(capsys):
    speeds = []

    def throughput(trainer, stats):
        value = stats["throughput/env_steps_per_s"]
        speeds.append(f"{value / 1e3:.2f}k" if value >= 1e3 else f"{value:.0f}")

    with make_trainer(progress=None, progress_every_s=1e-9, tracking=False) as trainer:
        trainer.run(max_env_steps=3 * STEP, callbacks=[throughput])
    drawn = re.findall(r"^rl8 (\d+) env steps \| (\S+) steps/s", capsys.readouterr().err, re.M)
    assert drawn == [(str(step * STEP), speed) for step, speed in zip((1, 2, 3), speeds)]


def test_no_progress_line_comes_before_the_lines_saying_where_the_run_goes(clock):
    # an MLflow run that starts in the background has no id for its first steps
    tracker = types.SimpleNamespace(
        enabled=True, run_id=None, start_error=None, tracking_uri="sqlite:///runs.db"
    )
    run = types.SimpleNamespace(tracker=tracker, checkpoint_dir=Path("/ck/abc"))
    stream = io.StringIO()
    progress = Progress(None, stream, interval_s=0, run=run)
    progress.update({"env/steps": 100}, [])
    assert stream.getvalue() == ""
    tracker.run_id = "abc"
    progress.update({"env/steps": 200}, [])
    run_line, *rest = lines(stream)
    assert run_line.startswith(
        "rl8: MLflow run abc in sqlite:///runs.db (to see it: mlflow ui --backend-store-uri "
        "sqlite:///runs.db"
    )
    assert rest == ["rl8: checkpoints in /ck/abc", "rl8 200 env steps"]


# --------------------------------------------------------------------------------------------
# presets from Python


def test_ppo_from_preset_with_overrides():
    config = rl8.presets.load("Pendulum-v1")
    algo = PPO.from_preset("Pendulum-v1", num_envs=4, seed=3)
    try:
        assert algo.env_spec == "Pendulum-v1"
        assert algo.hparams.num_envs == 4 and algo.hparams.seed == 3
        assert (
            algo.hparams.lr == config["hparams"]["lr"]
            and algo.hparams.gamma == config["hparams"]["gamma"]
        )
    finally:
        algo.close()
    with pytest.raises(TypeError, match="unknown hyper-parameter 'nm_envs'; did you mean 'num_envs'"):
        PPO.from_preset("Pendulum-v1", nm_envs=4)
    with pytest.raises(ValueError, match="unknown preset 'Pendulum-v2'"):
        PPO.from_preset("Pendulum-v2")


def test_a_presets_trainer_options_and_run_args():
    assert rl8.presets.trainer_options("CartPole-v1") == {
        "eval_num_envs": 10,
        "eval_num_steps": 500,
        "experiment": "CartPole-v1",
    }
    run_args = rl8.presets.run_args("CartPole-v1")
    solved = run_args.pop("stop_conditions")  # CartPole-v1's reward_threshold (tests/test_presets.py)
    assert [c.to_config() for c in solved] == [
        HitsUpperBound("eval/episodes/return_mean", 475).to_config()
    ]
    assert run_args == {"max_env_steps": 100_000, "steps_per_eval": 20}


def test_presets_do_not_use_the_commands_private_names():
    text = (REPO / "rl8" / "presets" / "__init__.py").read_text()
    assert "_build_hparams" not in text and "cli import _" not in text


def test_ppo_on_a_gymnasium_id_with_a_preset_hints_at_it_once(monkeypatch):
    import rl8.ppo.algorithm

    monkeypatch.setattr(rl8.ppo.algorithm, "_hinted", set())
    with pytest.warns(
        rl8.ppo.algorithm.PresetHint,
        match=re.escape(
            "rl8: Pendulum-v1 has a tuned preset: PPO.from_preset('Pendulum-v1') / rl8 train Pendulum-v1"
        ),
    ):
        PPO("Pendulum-v1", seed=0).close()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        PPO("Pendulum-v1", seed=0).close()  # once
        monkeypatch.setattr(rl8.ppo.algorithm, "_hinted", set())
        PPO("Pendulum-v1", num_envs=8, horizon=16).close()  # tuned by hand: no hint
        PPO.from_preset("Pendulum-v1", num_envs=8).close()  # the preset itself
        PPO("MountainCar-v0").close()  # no preset


def _trainer():
    return Trainer(
        PPO(CartPole, **{**SMALL, "num_envs": 4, "sgd_minibatch_size": 16}),
        tracking=False,
        progress=False,
    )


def test_learn_trains_that_many_more_env_steps_at_each_call():
    with _trainer() as trainer:
        trainer.learn(64)
        trainer.learn(64)
        assert trainer.algo.env_steps == 128
        with pytest.raises(ValueError, match="Trainer.learn: env_steps must be an int >= 1"):
            trainer.learn(0)


def test_a_callback_stops_the_run_on_rl8_stop_only_and_a_bare_bool_warns():
    class SB3Habit(Callback):
        def on_step(self, trainer, stats):
            return True  # SB3: "go on"

    with _trainer() as trainer:
        with pytest.warns(UserWarning, match=r"returned True, which rl8 ignores: return rl8.STOP"):
            trainer.run(max_env_steps=96, callbacks=[SB3Habit(), lambda trainer, stats: np.bool_(False)])
        assert trainer.algo.env_steps == 96
        assert rl8.STOP == "stop"
        trainer.run(max_env_steps=10**6, callbacks=lambda trainer, stats: rl8.STOP)
        assert trainer.algo.env_steps == 128


def test_sb3s_ppo_signature_gets_a_hint():
    with pytest.raises(
        TypeError,
        match=r"PPO\('MlpPolicy', 'CartPole-v1'\)\. Stable-Baselines3's .* is rl8's PPO\(env\)",
    ):
        PPO("MlpPolicy", "CartPole-v1")
