"""What a newcomer meets first, part 2: the messages of a mistyped preset, model option or
hyper-parameter, of broken YAML, of ``rl8 record`` without a display, and the install lines
that CI runs from the README."""

from __future__ import annotations

import contextlib
import os
import re
import stat
import subprocess
import sys
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient

from rl8 import PPO
from rl8.cli import main
from rl8.envs import CartPole

pytestmark = pytest.mark.usefixtures("one_torch_thread")

REPO = Path(__file__).resolve().parents[1]
SMALL = dict(num_envs=4, horizon=8, sgd_minibatch_size=16, num_sgd_iters=1, seed=0)


def one_error_line(err: str) -> str:
    """The single ``rl8: error:`` line of ``err`` (what the command printed on stderr)."""
    lines = [line for line in err.splitlines() if line.startswith("rl8: error:")]
    assert len(lines) == 1, err
    assert "Traceback" not in err, err
    return lines[0]


def no_runs(uri: str) -> bool:
    client = MlflowClient(uri)
    return all(not client.search_runs([e.experiment_id]) for e in client.search_experiments())


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
# model_config keys, hyper-parameter names, YAML errors


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
    assert no_runs(migrated_store)  # checked before the run starts
    with pytest.raises(
        ValueError,
        match=r"model_config\.hiden: MLPModel has no option 'hiden'; did you mean 'hiddens'\?",
    ):
        PPO(CartPole, model_config={"hiden": [32, 32]}, **SMALL)


def test_model_config_keys_follow_the_model_class():
    from rl8.policies.models import Model, check_model_config
    from rl8.policies.recurrent import GRUModel

    with pytest.raises(
        ValueError, match=r"model_config\.hiddens: GRUModel has no option 'hiddens'.*'hidden_size'"
    ):
        check_model_config(GRUModel, {"hiddens": [8]})
    check_model_config(GRUModel, {"hidden_size": 8})

    class Anything(Model):  # takes **config: every key is its business
        pass

    check_model_config(Anything, {"whatever": 1})


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


# --------------------------------------------------------------------------------------------
# rl8 record: MuJoCo without a display, XDG_RUNTIME_DIR, the file's mode


@pytest.fixture(scope="module")
def cheetah_policy(tmp_path_factory):
    """An untrained HalfCheetah-v5 policy file naming its env."""
    pytest.importorskip("imageio_ffmpeg")
    pytest.importorskip("mujoco")
    from rl8 import Policy
    from rl8.io.export import save_policy
    from rl8.ppo.algorithm import make_env

    folder = tmp_path_factory.mktemp("cheetah")
    with contextlib.chdir(folder):  # MuJoCo writes MUJOCO_LOG.TXT into the working folder
        env = make_env("HalfCheetah-v5", 1, None, device="cpu")
    try:
        policy = Policy(env.observation_space, env.action_space, model_config={"hiddens": [8]})
    finally:
        env.close()
    return save_policy(policy, folder / "cheetah.pt", env={"spec": "HalfCheetah-v5"})


def headless_env(**extra):
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("DISPLAY", "WAYLAND_DISPLAY", "MUJOCO_GL", "PYOPENGL_PLATFORM", "XDG_RUNTIME_DIR")
    }
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])
    return {**env, **extra}


@pytest.mark.slow
@pytest.mark.parametrize("mujoco_gl", [None, "osmesa"])
def test_record_mujoco_without_a_display_writes_a_video_or_says_what_to_set(
    cheetah_policy, tmp_path, mujoco_gl
):
    """MUJOCO_GL unset: rl8 picks EGL or OSMesa when installed. A backend that cannot work here
    (osmesa without libOSMesa) is one error line naming MUJOCO_GL, never a traceback."""
    out = tmp_path / "cheetah.mp4"
    extra = {"MUJOCO_GL": mujoco_gl} if mujoco_gl else {}
    done = subprocess.run(
        [sys.executable, "-m", "rl8", "record", str(cheetah_policy), "-o", str(out), "--max-steps", "3"],
        env=headless_env(**extra),
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert "Traceback" not in done.stderr, done.stderr
    if done.returncode == 0:
        assert out.stat().st_size > 0 and done.stdout.strip() == str(out)
        assert "XDG_RUNTIME_DIR" not in done.stderr, done.stderr  # no noise on success
    else:
        assert done.returncode == 2, done.stderr
        assert "MUJOCO_GL" in one_error_line(done.stderr) and not out.exists()


class FatalError(Exception):
    """Stands for ``mujoco.FatalError``: what a MuJoCo env raises when no OpenGL context exists."""


FatalError.__module__ = "mujoco"


def unset(monkeypatch, *names):
    """Remove the variables ``names`` from the environment for one test; what the code under
    test then sets is undone afterwards too."""
    for name in names:
        monkeypatch.setenv(name, "")  # recorded, so restored (or removed) after the test
        monkeypatch.delenv(name)


def test_an_opengl_failure_is_a_render_error_naming_mujoco_gl(tmp_path, capsys, monkeypatch):
    from rl8.io.export import save_policy
    from rl8.training.video import RenderError, record_video

    def no_context(self, index=0):
        raise FatalError("an OpenGL platform library has not been loaded into this process")

    policy = PPO(CartPole, **SMALL).policy
    monkeypatch.setattr(CartPole, "render", no_context)
    unset(monkeypatch, "MUJOCO_GL", "XDG_RUNTIME_DIR")
    monkeypatch.setenv("DISPLAY", ":99")  # a display: rl8 chooses no backend
    with pytest.raises(
        RenderError,
        match=r"cannot render CartPole without an OpenGL backend \(FatalError: an OpenGL"
        r".*install libegl1 \(MUJOCO_GL=egl\) or libosmesa6 \(MUJOCO_GL=osmesa\)",
    ):
        record_video(policy, CartPole, tmp_path / "a.mp4")
    saved = save_policy(policy, tmp_path / "p.pt", env={"spec": "rl8.envs.CartPole"})
    monkeypatch.setenv("MUJOCO_GL", "egl")
    assert main(["record", str(saved), "-o", str(tmp_path / "b.mp4")]) == 2
    line = one_error_line(capsys.readouterr().err)
    assert "with MUJOCO_GL=egl" in line and "set MUJOCO_GL" in line
    assert list(tmp_path.glob("*.mp4*")) == []


def test_headless_rendering_picks_a_backend_only_when_nothing_is_set(monkeypatch, tmp_path):
    import ctypes.util

    from rl8.training.video import prepare_headless_rendering

    libraries = {"EGL": None, "OSMesa": "libOSMesa.so.8"}
    monkeypatch.setattr(ctypes.util, "find_library", lambda name: libraries.get(name))
    monkeypatch.setattr(sys, "platform", "linux")
    unset(monkeypatch, "DISPLAY", "WAYLAND_DISPLAY", "MUJOCO_GL", "XDG_RUNTIME_DIR")
    changed = prepare_headless_rendering()
    assert changed["MUJOCO_GL"] == os.environ["MUJOCO_GL"] == "osmesa"  # no EGL here
    runtime = Path(changed["XDG_RUNTIME_DIR"])
    assert os.environ["XDG_RUNTIME_DIR"] == str(runtime)
    assert runtime.is_dir() and stat.S_IMODE(runtime.stat().st_mode) == 0o700
    assert prepare_headless_rendering() == {}  # set once: both are valid now

    libraries["EGL"] = "libEGL.so.1"
    monkeypatch.delenv("MUJOCO_GL")
    assert prepare_headless_rendering() == {"MUJOCO_GL": "egl"}
    monkeypatch.setenv("MUJOCO_GL", "glfw")  # the user's choice stays
    monkeypatch.setenv("XDG_RUNTIME_DIR", "relative/dir")  # invalid: replaced
    changed = prepare_headless_rendering()
    assert os.environ["MUJOCO_GL"] == "glfw" and list(changed) == ["XDG_RUNTIME_DIR"]
    monkeypatch.delenv("MUJOCO_GL")
    monkeypatch.setenv("DISPLAY", ":0")  # a display: MuJoCo's default (GLFW) works
    assert prepare_headless_rendering() == {}


@pytest.mark.parametrize("umask", [0o022, 0o027])
def test_videos_get_the_mode_of_the_umask(tmp_path, umask):
    pytest.importorskip("imageio_ffmpeg")
    from rl8.training.video import record_video

    policy = PPO(CartPole, **SMALL).policy
    previous = os.umask(umask)
    try:
        path = record_video(policy, CartPole, tmp_path / "v.mp4", max_steps=2)
    finally:
        os.umask(previous)
    assert stat.S_IMODE(path.stat().st_mode) == 0o666 & ~umask
    assert [p.name for p in tmp_path.iterdir()] == ["v.mp4"]  # no temporary file left


# --------------------------------------------------------------------------------------------
# install lines: from the checkout, and the ones CI runs


def marked_block(text: str, marker: str) -> list[str]:
    """The lines of the first code block after ``<!-- marker -->`` (as .ci/run reads them)."""
    after = text.split(f"<!-- {marker} -->\n", 1)[1]
    assert after.startswith("```"), f"no code block right after <!-- {marker} -->"
    return after.split("\n```", 1)[0].splitlines()[1:]


def test_ci_runs_the_install_lines_that_readers_see():
    readme = (REPO / "README.md").read_text()
    getting_started = (REPO / "docs" / "getting-started.md").read_text()
    assert marked_block(readme, "ci:install-command") == [
        "python -m pip install -e . && python examples/cartpole.py"
    ]
    extras = [line.split("#")[0].strip() for line in marked_block(getting_started, "ci:install-extras")]
    assert extras == [
        f"python -m pip install -e {spec}"
        for spec in [
            ".",
            '".[video]"',
            '".[ui]"',
            '".[docs]"',
            '".[system]"',
            '".[onnx]"',
            '".[sweep]"',
            '".[dev]"',
        ]
    ]
    assert marked_block(readme, "ci:test-command")[0].startswith(
        'python -m pip install -q -e ".[dev]" && '
    )
    ci = (REPO / ".ci" / "run").read_text()
    for marker, page in [
        ("ci:test-command", "README.md"),
        ("ci:install-command", "README.md"),
        ("ci:install-extras", "docs/getting-started.md"),
    ]:
        assert f"block {marker} {page}" in ci
