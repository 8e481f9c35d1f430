"""The prepared GPU check (benchmarks/gpu/), exercised on CPU so that it cannot rot unseen:
``check.sh --cpu-dry-run`` end to end, the wheel folder's check, the table of ``bench.py``
and the sides' ``--device``/``--num-envs``/``--warmup``/``--iters`` options::

    python -m pytest benchmarks/test_gpu_check.py -q
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

GPU = Path(__file__).parent / "gpu"
ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(GPU))
sys.path.insert(0, str(Path(__file__).parent / "peers"))

import bench  # noqa: E402
import wheels  # noqa: E402
import workloads  # noqa: E402


def test_check_sh_cpu_dry_run_prints_and_writes_one_table(tmp_path):
    env = {
        **os.environ,
        "OUT": str(tmp_path / "out"),
        "RL8_GPU_TESTS": "tests/envs/test_pendulum.py",
        "RL8_GPU_DRY_ENVS": "16",
        "RL8_WHEELS": str(tmp_path / "no-wheels"),
        "OMP_NUM_THREADS": "1",
    }
    env.pop("PYTHONPATH", None)
    env["PYTHON"] = sys.executable
    out = subprocess.run(
        ["bash", str(GPU / "check.sh"), "--cpu-dry-run"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=420,
        check=False,
    )
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    text = out.stdout
    for step in (
        "== 1/5 the wheels",
        "== 2/5 the machine",
        "== 3/5 the CUDA tests",
        "== 4/5 rl8 against rsl_rl",
        "== 5/5 rl8 against rsl_rl on MuJoCo Playground's CartpoleBalance",
    ):
        assert step in text
    assert "nvidia-smi" not in text and "dry run: no GPU used" in text
    assert f"from {ROOT / 'rl8' / '__init__.py'}" in text  # this checkout's rl8
    assert "pytest exit status: 0" in text  # the CUDA test of test_pendulum.py collected, skipped on CPU
    table = (tmp_path / "out" / "gpu_table.md").read_text()
    bench_table, _, playground_table = table.partition("\nCartpoleBalance (MuJoCo")
    assert bench_table.strip() in text
    if playground_table:
        assert ("CartpoleBalance (MuJoCo" + playground_table).strip() in text
    assert "| workload | side | setting | env steps/s | rl8 / this | per-round range |" in table
    rows = {
        tuple(c.strip() for c in line.split("|")[1:4]): line
        for line in table.splitlines()
        if line.startswith("| pendulum x16 |")
    }
    assert set(rows) == {
        ("pendulum x16", "rl8", "fp32"),
        ("pendulum x16", "rl8", "bf16"),
        ("pendulum x16", "rsl_rl", "fp32"),
        ("pendulum x16", "rsl_rl", "bf16"),
    }
    rate = rows[("pendulum x16", "rl8", "fp32")].split("|")[4].strip()
    assert float(rate.replace(",", "")) > 0
    assert "rl8 compile=True (CUDA graphs): not available (--no-compile)" in table
    assert (tmp_path / "out" / "gpu_check.log").read_text().count("== 4/5") == 1
    if importlib.util.find_spec("mujoco_playground") is None:
        assert "skipped: mujoco_playground does not import" in text
    else:  # 16 envs on CPU, one iteration timed, 5 s to the return 900: not reached
        assert playground_table and "16 envs x 24 steps, cpu" in playground_table
        rl8_row = next(line for line in table.splitlines() if line.startswith("| rl8 |"))
        assert float(rl8_row.split("|")[2].replace(",", "")) > 0, rl8_row
        assert "not reached in 1 run(s)" in rl8_row
        assert "| rsl_rl |" in table


def test_bench_table_ratios_compile_line_and_time_budget(monkeypatch, capsys, tmp_path):
    rates = {
        ("rl8", "fp32"): 200.0,
        ("rl8", "bf16"): 300.0,
        ("rl8", "compile"): 800.0,
        ("rl8", "compile-bf16"): 700.0,
        ("rsl_rl", "fp32"): 100.0,
        ("rsl_rl", "bf16"): 400.0,
    }
    calls = []

    def fake_measure(side, num_envs, setting, args, timeout):
        calls.append((num_envs, side, setting))
        return {"steps_per_s": rates[(side, setting)] * num_envs, "rsl-rl-lib": "5.5.1"}

    monkeypatch.setattr(bench, "measure", fake_measure)
    monkeypatch.setattr(bench, "why_no_compile", lambda: None)
    monkeypatch.setenv("RL8_COMMIT", "abc1234")
    out = tmp_path / "table.md"
    assert (
        bench.main(["--device", "cpu", "--envs", "1", "--envs", "2", "--rounds", "2", "--out", str(out)])
        == 0
    )
    table = out.read_text()
    assert "rl8 commit abc1234;" in table and "rsl-rl-lib 5.5.1;" in table
    assert "| pendulum x1 | rsl_rl | fp32 | 100 | 2.00x | 2.00-2.00 |" in table
    assert "| pendulum x2 | rsl_rl | bf16 | 800 | 0.75x | 0.75-0.75 |" in table
    assert "- pendulum x2, rl8 compile (CUDA graphs) / rsl_rl at its best: 2.00x" in table
    assert table.strip() in capsys.readouterr().out
    # rounds over every env count in turn, each round starting with another measurement
    assert calls[:6] == [
        (1, "rl8", "fp32"),
        (1, "rl8", "bf16"),
        (1, "rl8", "compile"),
        (1, "rl8", "compile-bf16"),
        (1, "rsl_rl", "fp32"),
        (1, "rsl_rl", "bf16"),
    ]
    assert calls[12] == (1, "rl8", "bf16")
    assert len(calls) == 24

    calls.clear()
    assert (
        bench.main(
            ["--device", "cpu", "--envs", "1", "--budget", "0", "--no-compile", "--out", str(out)]
        )
        == 0
    )
    assert calls == []
    assert (
        "| pendulum x1 | rl8 | fp32 | failed: not measured: the time budget of 0 s was spent | | |"
        in out.read_text()
    )


def test_bench_refuses_counts_below_one():
    with pytest.raises(SystemExit):
        bench.main(["--envs", "0"])


def test_side_options_replace_the_workloads_values_in_this_process(monkeypatch):
    monkeypatch.setitem(workloads.WORKLOADS, "pendulum-4096", dict(workloads.WORKLOADS["pendulum-4096"]))
    args = workloads.parse_side_args(
        [
            "pendulum-4096",
            "--device",
            "cuda",
            "--num-envs",
            "16384",
            "--warmup",
            "3",
            "--iters",
            "10",
            "--threads",
            "1",
        ]
    )
    w = workloads.WORKLOADS["pendulum-4096"]
    assert args.device == "cuda" and w["num_envs"] == 16384
    assert workloads.iterations(w, quick=False) == (3, 10) == workloads.iterations(w, quick=True)
    assert workloads.batch_size(w) == 16384 * 24


def test_side_options_name_a_bad_count(capsys):
    with pytest.raises(SystemExit):
        workloads.parse_side_args(["pendulum-4096", "--iters", "0"])
    assert "--iters must be >= 1, got 0" in capsys.readouterr().err


def make_wheel(
    folder: Path, name: str, version: str, requires: tuple[str, ...] = (), tag: str = "py3-none-any"
) -> Path:
    path = folder / f"{name}-{version}-{tag}.whl"
    meta = f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n" + "".join(
        f"Requires-Dist: {r}\n" for r in requires
    )
    with zipfile.ZipFile(path, "w") as zf:
        zf.writestr(f"{name}-{version}.dist-info/METADATA", meta)
    return path


def test_wheel_folder_check_finds_what_the_gpu_machine_would_miss(tmp_path):
    make_wheel(
        tmp_path,
        "gymnasium",
        "1.4.0",
        ("numpy>=1.22", "farama-notifications>=0.0.1", 'pygame>=2; extra == "classic-control"'),
    )
    make_wheel(
        tmp_path,
        "cryptography",
        "48.0.0",
        ('cffi>=2; platform_python_implementation != "PyPy"',),
        tag="cp311-abi3-manylinux_2_28_x86_64",
    )
    make_wheel(tmp_path, "cffi", "2.0.0", tag="cp312-cp312-manylinux2014_x86_64")
    make_wheel(tmp_path, "playground", "0.2.0", ("warp-lang>=1.11", "jax"))
    pins = {"gymnasium": "1.4.0", "cryptography": "48.0.0", "cffi": "2.0.0", "playground": "0.2.0"}
    # numpy and jax are on the machine; warp-lang is left out on purpose (NOT_CARRIED); the
    # extra's pygame is not asked for; farama-notifications is missing
    assert wheels.check(tmp_path, pins) == [
        "gymnasium-1.4.0-py3-none-any.whl needs farama-notifications>=0.0.1: neither in the folder nor on the GPU machine"
    ]

    make_wheel(tmp_path, "farama_notifications", "0.0.6")
    make_wheel(tmp_path, "cffi", "1.17.0", tag="cp311-cp311-manylinux2014_x86_64")
    make_wheel(tmp_path, "torch", "2.13.0", tag="cp312-cp312-manylinux_2_28_x86_64")
    problems = wheels.check(tmp_path, {**pins, "farama-notifications": "0.0.6"})
    assert problems == [
        "cffi-1.17.0-cp311-cp311-manylinux2014_x86_64.whl: not built for CPython 3.12 on manylinux x86-64",
        "cffi: 2 versions (1.17.0, 2.0.0); pip installs one",
        "torch: the GPU machine has its own; remove the wheel",
    ]


def test_wheels_txt_pins_one_version_of_each_and_never_torch():
    pins = wheels.read_pins()
    assert "torch" not in pins
    assert pins["rsl-rl-lib"] == "5.5.1"
    for dep in (
        "tensordict",
        "gymnasium",
        "mlflow-skinny",
        "sqlalchemy",
        "alembic",
        "playground",
        "mujoco-mjx",
    ):
        assert dep in pins
    lines = [ln.split("#")[0].strip() for ln in (GPU / "wheels.txt").read_text().splitlines()]
    assert len([ln for ln in lines if ln]) == len(pins)  # no name twice
    assert "warp-lang" not in pins and "warp-lang" in wheels.NOT_CARRIED
