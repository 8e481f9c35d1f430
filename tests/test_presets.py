"""Presets (rl8.presets, ``rl8 train NAME``), the learning benchmark's summary and report, and
``benchmarks/compare.py --solve``.

Every preset loads, validates and runs one collect and one update. To keep this fast the
batch is cut to at most 8 envs x 64 steps where the preset splits its batch into
``num_minibatches`` (the MuJoCo horizon of 2048 and LunarLander's 16 x 1024 would take seconds
each); presets with a fixed ``sgd_minibatch_size`` (the built-in envs, fast) keep their batch.
Everything else is the preset's own.
"""

from __future__ import annotations

import importlib.util
import math
from pathlib import Path

import gymnasium
import pytest

import rl8
import rl8.presets
from rl8.cli import main
from rl8.training.conditions import HitsUpperBound

NEEDS = {  # preset -> the module its env needs, and the extra that installs it
    "LunarLander-v3": ("Box2D", ".[box2d]"),
    **{
        name: ("mujoco", ".[mujoco]")
        for name in ("HalfCheetah-v5", "Hopper-v5", "Walker2d-v5", "Ant-v5", "Humanoid-v5")
    },
}
ISSUE_TASKS = [
    "CartPole-v1",
    "Acrobot-v1",
    "MountainCarContinuous-v0",
    "Pendulum-v1",
    "LunarLander-v3",
    "HalfCheetah-v5",
    "Hopper-v5",
    "Walker2d-v5",
    "Ant-v5",
    "Humanoid-v5",
    "CartPole",
    "Pendulum",
    "Memory",
]


def _skip_without_extra(name: str) -> None:
    if name in NEEDS:
        module, extra = NEEDS[name]
        if importlib.util.find_spec(module) is None:
            pytest.skip(f'preset {name} needs {module}: pip install -e "{extra}"')


def test_names_are_the_issue_tasks():
    assert sorted(rl8.presets.names()) == sorted(ISSUE_TASKS)


@pytest.mark.parametrize("name", rl8.presets.names())
def test_preset_loads_validates_and_trains_one_step(name, one_torch_thread):
    _skip_without_extra(name)
    config = rl8.presets.load(name)
    assert config["env"] and config["max_steps"] >= 1
    assert config["hparams"]["seed"] == 0
    hparams = rl8.presets.hparams(config)
    assert isinstance(hparams, rl8.HParams)
    small = hparams.replace(device="cpu")
    if hparams.sgd_minibatch_size == "auto":  # a fixed minibatch size needs the preset's batch
        small = small.replace(num_envs=min(hparams.num_envs, 8), horizon=min(hparams.horizon, 64))
    algo = rl8.PPO(config["env"], **small.to_dict())
    try:
        collect = algo.collect()
        update = algo.update()
        assert algo.env_steps == small.num_envs * small.horizon
        assert all(math.isfinite(v) for k, v in collect.items() if k.startswith("rewards/")), collect
        assert all(math.isfinite(v) for k, v in update.items() if k.startswith("losses/")), update
    finally:
        algo.close()


def test_preset_files_cite_their_source():
    for name in rl8.presets.names():
        text = rl8.presets.path(name).read_text()
        assert text.startswith("#") and "rl8 train" in text, name


def test_unknown_name_names_close_matches():
    with pytest.raises(ValueError, match=r"unknown preset 'Hoper-v5'; did you mean 'Hopper-v5'"):
        rl8.presets.load("Hoper-v5")
    with pytest.raises(ValueError, match="preset name: expected a string"):
        rl8.presets.path(3)


def test_close_names_are_the_preset_named_up_to_case_else_the_close_ones():
    assert rl8.presets.close_names("cartpole") == ["CartPole"]
    assert rl8.presets.close_names("CARTPOLE-V1") == ["CartPole-v1"]
    assert rl8.presets.close_names("CartPol-v1") == ["CartPole-v1", "CartPole"]
    assert rl8.presets.close_names("walker2d") == ["Walker2d-v5"]
    assert rl8.presets.close_names("xyz") == []
    with pytest.raises(ValueError, match=r"unknown preset 'cartpole'; did you mean 'CartPole'\?"):
        rl8.presets.path("cartpole")


def test_prefix_is_accepted_by_load():
    assert rl8.presets.load("preset:Memory") == rl8.presets.load("Memory")


def test_bad_hparams_are_an_error_naming_the_preset_and_the_field(tmp_path):
    with pytest.raises(ValueError, match="preset 'CartPole-v1': hparams: .*horizon"):
        rl8.presets.hparams({"env": "CartPole-v1", "hparams": {"horizon": 0}})
    with pytest.raises(
        ValueError,
        match="preset 'CartPole-v1': hparams: unknown hyper-parameter 'horizn'; did you mean 'horizon'",
    ):
        rl8.presets.hparams({"env": "CartPole-v1", "hparams": {"horizn": 8}})


#: The presets of tasks solved at a return: gymnasium's reward_threshold (the built-in CartPole:
#: CartPole-v1's).
SOLVED_AT = {
    "CartPole-v1": 475,
    "CartPole": 475,
    "Acrobot-v1": -100,
    "LunarLander-v3": 200,
    "MountainCarContinuous-v0": 90,
}


@pytest.mark.parametrize("name", sorted(SOLVED_AT))
def test_a_solved_tasks_preset_stops_at_the_solved_return(name):
    config = rl8.presets.load(name)
    gym_id = "CartPole-v1" if name == "CartPole" else config["env"]
    assert gymnasium.spec(gym_id).reward_threshold == SOLVED_AT[name]
    run_args = rl8.presets.run_args(name)
    solved = HitsUpperBound("eval/episodes/return_mean", SOLVED_AT[name])
    assert [c.to_config() for c in run_args["stop_conditions"]] == [solved.to_config()]
    assert run_args["max_env_steps"] == config["max_steps"] and run_args["steps_per_eval"] >= 1


def test_the_other_presets_train_their_whole_budget():
    # MuJoCo's thresholds are no "solved" level (the presets are measured over their budget);
    # Pendulum and Memory have none
    for name in set(rl8.presets.names()) - set(SOLVED_AT):
        assert "stop_conditions" not in rl8.presets.load(name), name


@pytest.mark.slow
def test_rl8_train_cartpole_stops_when_solved(capsys, migrated_store, one_torch_thread):
    budget = 800_000  # the built-in CartPole solves in about 20 steps of 8192 env steps
    assert main(["train", "CartPole", "--max-steps", str(budget), "--steps-per-eval", "5"]) == 0
    out, err = capsys.readouterr()
    assert "rl8: stopped by HitsUpperBound('eval/episodes/return_mean', 475) after " in err
    from mlflow import MlflowClient

    metrics = MlflowClient(migrated_store).get_run(_run_id(out)).data.metrics
    assert metrics["eval/episodes/return_mean"] >= 475 and metrics["env/steps"] < budget


def _run_id(out: str) -> str:
    return next(line.split()[-1] for line in out.splitlines() if line.startswith("run id:"))


@pytest.mark.parametrize("arg", ["preset:CartPole-v1", "CartPole-v1"])
def test_rl8_train_preset(arg, capsys, migrated_store, one_torch_thread):
    assert main(["train", arg, "--max-steps", "1", "--quiet"]) == 0
    out = capsys.readouterr().out
    assert "rl8: 256 env steps, 1 training steps" in out  # the preset's 8 envs x 32 steps
    from mlflow import MlflowClient

    run = MlflowClient(migrated_store).get_run(_run_id(out))
    assert run.data.params["hparams/num_sgd_iters"] == "20"


def test_an_existing_file_wins_over_a_preset_name(tmp_path, capsys, migrated_store, one_torch_thread):
    (tmp_path / "CartPole-v1").write_text("env: rl8.envs.CartPole\nhparams: {num_envs: 4, horizon: 8}\n")
    assert main(["train", "CartPole-v1", "--max-steps", "1", "--quiet"]) == 0
    assert "rl8: 32 env steps" in capsys.readouterr().out
    assert main(["train", "preset:CartPole-v1", "--max-steps", "1", "--quiet"]) == 0
    assert "rl8: 256 env steps" in capsys.readouterr().out


def test_a_preset_name_in_another_case_says_did_you_mean_and_lists_the_presets(capsys):
    assert main(["train", "cartpole", "--register", "cartpole-ppo"]) == 2
    err = capsys.readouterr().err
    assert f"'cartpole'; did you mean 'CartPole'? Presets: {', '.join(rl8.presets.names())}." in err


def test_unknown_preset_and_missing_file_exit_2(capsys):
    assert main(["train", "preset:Hoper-v5"]) == 2
    assert "unknown preset 'Hoper-v5'; did you mean 'Hopper-v5'" in capsys.readouterr().err
    assert main(["train", "no-such-config.yaml"]) == 2
    assert "cannot read config file no-such-config.yaml" in capsys.readouterr().err


# --------------------------------------------------------------------------------------------
# the learning benchmark's bookkeeping (no training)


@pytest.fixture
def benchmarks_importable(monkeypatch):
    """``benchmarks`` is a folder of the repository, not an installed package."""
    monkeypatch.syspath_prepend(str(Path(__file__).resolve().parent.parent))


def _rows(points, wall_per_step=1.0):
    return [
        {
            "env_steps": s,
            "wall_s": s * wall_per_step,
            "train_return": math.nan,
            "eval_return": v,
            "resumed": 0.0,
        }
        for s, v in points
    ]


def test_summarize_final_return_and_time_to_threshold(benchmarks_importable):
    from benchmarks.learning.run import summarize

    a = _rows([(100, 10.0), (200, 50.0), (300, 60.0)])
    b = _rows([(100, 55.0), (200, 40.0), (300, 40.0)], wall_per_step=2.0)
    row = summarize([a, b], threshold=50.0)
    assert row["seeds"] == 2 and row["env_steps"] == 300
    assert row["final_mean"] == pytest.approx(50.0) and row["final_std"] == pytest.approx(10.0)
    assert row["reached"] == 2
    assert row["steps_to_threshold"] == pytest.approx(150.0)  # 200 and 100
    assert row["wall_s_to_threshold"] == pytest.approx(200.0)  # 200 s and 200 s
    never = summarize([a], threshold=1000.0)
    assert never["reached"] == 0 and math.isnan(never["steps_to_threshold"])


def test_report_writes_tables_and_plots(tmp_path, benchmarks_importable):
    from benchmarks.learning.run import BEGIN, END, read_curve, report, write_curve

    (tmp_path / "index.md").write_text(f"# Results\n\n{BEGIN}\nold table\n{END}\n\nmore text\n")

    rows = _rows([(100, 300.0), (200, 480.0)])
    write_curve(tmp_path / "curves" / "CartPole-v1" / "seed-0.csv", rows)
    write_curve(
        tmp_path / "curves" / "sb3" / "CartPole-v1" / "seed-0.csv",
        _rows([(100, 100.0), (200, 490.0)], 4.0),
    )
    assert read_curve(tmp_path / "curves" / "CartPole-v1" / "seed-0.csv") == rows
    (result,) = report(tmp_path)
    assert result["preset"] == "CartPole-v1" and result["threshold"] == 475
    assert result["wall_ratio"] == pytest.approx(200.0 / 800.0)
    table = (tmp_path / "results.md").read_text()
    assert "| CartPole-v1 | 475 | 1 |" in table and "0.25" in table
    assert (tmp_path / "results.csv").read_text().startswith("preset,threshold")
    page = (tmp_path / "index.md").read_text()
    assert table in page and "old table" not in page and page.endswith(f"{END}\n\nmore text\n")
    assert (tmp_path / "plots" / "CartPole-v1.png").read_bytes()[:4] == b"\x89PNG"


def test_report_bounds_the_ratio_when_sb3_never_reached_the_threshold(tmp_path, benchmarks_importable):
    """An SB3 run that trained 1,200 s without reaching the threshold, where rl8 took 200 s: the
    table says so and gives the ratio as an upper bound."""
    from benchmarks.learning.run import report, write_curve

    write_curve(tmp_path / "curves" / "CartPole-v1" / "seed-0.csv", _rows([(100, 300.0), (200, 480.0)]))
    write_curve(
        tmp_path / "curves" / "sb3" / "CartPole-v1" / "seed-0.csv",
        _rows([(100, 100.0), (200, 200.0), (300, 300.0)], 4.0),
    )
    (result,) = report(tmp_path)
    assert result["sb3_reached"] == 0 and math.isnan(result["wall_ratio"])
    assert result["wall_ratio_below"] == pytest.approx(200.0 / 1200.0)
    assert "| not in 1,200.0 | < 0.17 |" in (tmp_path / "results.md").read_text()


@pytest.mark.slow
def test_a_stopped_learning_run_resumes_from_its_checkpoint(tmp_path, benchmarks_importable, capsys):
    """The learning benchmark's runs resume: a seed stopped short of its budget continues from
    its latest checkpoint in the same MLflow run; a finished one is skipped; other
    hyper-parameters are refused."""
    from benchmarks.learning.run import read_curve, report, train

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    common = dict(out=tmp_path, tracking_uri=uri, eval_every=2048)
    path = train("CartPole-v1", 0, max_steps=4096, **common)  # the first sitting stops at 4096
    first = read_curve(path)
    checkpoints = sorted((tmp_path / ".checkpoints" / "CartPole-v1" / "seed-0").glob("checkpoint-*.pt"))
    assert [int(p.stem.split("-")[1]) for p in checkpoints] == [2048, 4096]  # the last two kept

    train("CartPole-v1", 0, max_steps=8192, **common)  # the next sitting continues it
    rows = read_curve(path)
    assert "resuming at 4096 env steps" in capsys.readouterr().out
    assert rows[: len(first)] == first
    resumed = [r for r in rows if r["resumed"] == 1.0]
    assert [r["env_steps"] for r in resumed] == [
        first[-1]["env_steps"] + 256
    ]  # CartPole-v1: 8 envs x 32 steps
    assert rows[-1]["env_steps"] == 8192 and not math.isnan(rows[-1]["eval_return"])
    assert all(b["wall_s"] > a["wall_s"] for a, b in zip(rows, rows[1:]))  # the wall time adds up
    from mlflow import MlflowClient

    (run,) = MlflowClient(uri).search_runs(
        MlflowClient(uri).get_experiment_by_name("CartPole-v1").experiment_id
    )
    assert run.data.metrics["env/steps"] == 8192  # one MLflow run across both sittings

    mtime = path.stat().st_mtime_ns
    train("CartPole-v1", 0, max_steps=8192, **common)
    assert "done (8192 env steps" in capsys.readouterr().out and path.stat().st_mtime_ns == mtime
    with pytest.raises(SystemExit, match=r"other hyper-parameters \(lr: checkpoint 0.002, now 0.0005\)"):
        train("CartPole-v1", 0, max_steps=16384, overrides={"lr": 5e-4}, **common)
    (row,) = report(tmp_path)
    assert row["resumed"] == 1 and row["resumed_at"] == [[4352]]
    assert "| 1/1 |" in (tmp_path / "results.md").read_text()


def test_sb3_runner_stops_at_max_wall_s(tmp_path, benchmarks_importable):
    """``sb3.py --max-wall-s``: the run ends at its first evaluation past the wall time (here 0 s:
    the first one), so its curve stops short of the env-step budget. SB3 is a reference, not
    an rl8 dependency: skipped where it is not installed (as in CI)."""
    pytest.importorskip("stable_baselines3")
    from benchmarks.learning.run import read_curve
    from benchmarks.learning.sb3 import train

    capped = read_curve(train("CartPole-v1", 0, out=tmp_path / "capped", max_steps=8192, max_wall_s=0.0))
    assert len(capped) == 1 and capped[0]["env_steps"] < 8192
    full = read_curve(train("CartPole-v1", 0, out=tmp_path / "full", max_steps=8192))
    assert full[-1]["env_steps"] >= 8192 and len(full) > 1


def test_compare_solve_gives_each_tree_and_seed_its_env_steps(benchmarks_importable, capsys):
    """``benchmarks/compare.py --solve``: one row per workload, seed and tree with the env steps
    at the end; a run that stops at ``--max-env-steps`` short of the success rate is not solved."""
    from benchmarks import compare

    repo = str(Path(__file__).resolve().parent.parent)
    argv = ["--src", repo, "--src", repo, "--solve", "--workload", "memory-gru", "--seed", "3"]
    assert compare.main([*argv, "--rounds", "1", "--threads", "1", "--max-env-steps", "2048"]) == 0
    rows = [
        line.split() for line in capsys.readouterr().out.splitlines() if line.startswith("memory-gru")
    ]
    assert [row[:5] for row in rows] == [["memory-gru", "3", str(i), "2048", "NO"] for i in (0, 1)]


def test_compare_solve_refuses_a_throughput_workload(benchmarks_importable, capsys):
    from benchmarks import compare

    repo = str(Path(__file__).resolve().parent.parent)
    with pytest.raises(SystemExit):
        compare.main(["--src", repo, "--src", repo, "--solve", "--workload", "small"])
    assert "--solve trains only memory-lstm, memory-gru, memory-docs; got --workload small" in (
        capsys.readouterr().err
    )
