"""Videos: record_video on built-in and gymnasium envs, Trainer.record / record_every, rl8 record."""

from __future__ import annotations

import contextlib
import ctypes.util
import os
import stat
import subprocess
import sys
from pathlib import Path

import gymnasium
import numpy as np
import pytest
import torch
from gymnasium import spaces

from rl8 import Policy
from rl8.cli import main
from rl8.envs import CartPole
from rl8.io.export import save_policy

imageio = pytest.importorskip("imageio")
pytest.importorskip("imageio_ffmpeg")

import hparams
from cli_errors import one_error_line

from rl8 import PPO, Trainer
from rl8.envs import GymnasiumEnv, Memory, Pendulum
from rl8.policies.recurrent import GRUModel
from rl8.ppo.algorithm import make_env
from rl8.training.conditions import HitsUpperBound
from rl8.training.video import RenderError, pad_frame, prepare_headless_rendering, record_video

SMALL = {**hparams.SMALL, "num_envs": 4, "sgd_minibatch_size": 16}
REPO = Path(__file__).resolve().parents[1]


def read_video(path):
    """(frames [T, H, W, 3], fps) of an MP4 file."""
    reader = imageio.get_reader(path, "ffmpeg")
    try:
        frames = np.stack([frame for frame in reader.iter_data()])
        fps = reader.get_meta_data()["fps"]
    finally:
        reader.close()
    return frames, fps


def episode_steps(policy, env, seed, max_steps=1000):
    """Steps until sub-env 0's episode ends (or max_steps), acting deterministically."""
    policy.reset_state()
    obs = env.reset(seed=seed)
    for t in range(1, max_steps + 1):
        out = env.step(policy(obs))
        if bool(out["terminated"][0, 0] | out["truncated"][0, 0]):
            policy.reset_state()
            return t, True
        obs = out["obs"]
    policy.reset_state()
    return max_steps, False


class Blocks(gymnasium.Env):
    """A gymnasium env that draws its step count as a grey level in an odd-sized frame
    (numpy only, no pygame); episodes end (terminated) after ``length`` steps."""

    metadata = {"render_modes": ["rgb_array"], "render_fps": 12}
    observation_space = spaces.Box(-1.0, 1.0, (2,), np.float32)
    action_space = spaces.Discrete(2)

    def __init__(self, length: int = 6, render_mode: str | None = None):
        self.length = length
        self.render_mode = render_mode
        self.t = 0

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.t = 0
        return np.zeros(2, np.float32), {}

    def step(self, action):
        self.t += 1
        return np.zeros(2, np.float32), 1.0, self.t >= self.length, False, {}

    def render(self):
        return np.full((33, 45, 3), 30 * self.t, dtype=np.uint8)


# ------------------------------------------------------------------------ record_video


def test_cartpole_one_episode(tmp_path):
    algo = PPO(CartPole, **SMALL)
    path = record_video(algo.policy, CartPole, tmp_path / "out" / "cartpole.mp4", seed=3)
    assert path == tmp_path / "out" / "cartpole.mp4"
    steps, ended = episode_steps(algo.policy, CartPole(1), seed=3)
    assert ended
    frames, fps = read_video(path)
    # the reset frame plus one per step, except the step that ends the episode (the env has
    # auto-reset by then): one frame per state the policy acted in
    assert frames.shape == (steps, 400, 600, 3)
    assert fps == CartPole.metadata["render_fps"] == 50
    assert sorted(p.name for p in path.parent.iterdir()) == ["cartpole.mp4"]  # no temp file left
    # frames are the env's drawing: mostly white background, a dark cart
    assert frames[0].mean() > 200 and frames[0].min() < 50


def test_pendulum_max_steps_and_fps(tmp_path):
    algo = PPO(Pendulum, **SMALL)
    frames, fps = read_video(record_video(algo.policy, Pendulum, tmp_path / "p.mp4", max_steps=30))
    assert frames.shape == (31, 500, 500, 3)
    assert fps == 30
    frames, fps = read_video(
        record_video(algo.policy, Pendulum, tmp_path / "p.mp4", max_steps=3, fps=10)
    )
    assert frames.shape[0] == 4 and fps == 10  # overwritten in place


def test_env_instance_sub_env_and_config(tmp_path):
    algo = PPO(CartPole, **SMALL)
    env = CartPole(3)
    config = {"max_episode_steps": 5, "length": 0.25}  # truncated after 5 steps
    frames, _ = read_video(
        record_video(algo.policy, env, tmp_path / "c.mp4", index=2, env_config=config)
    )
    assert frames.shape[0] == 5
    assert env.params["length"] == 0.25  # the given instance was used (and is left open)
    env.step(torch.zeros(3, dtype=torch.int64))
    with pytest.raises(ValueError, match="index must be < num_envs=3"):
        record_video(algo.policy, env, tmp_path / "c.mp4", index=3)


def test_recurrent_policy(tmp_path):
    algo = PPO(CartPole, model_cls=GRUModel, model_config={"hidden_size": 8}, seq_len=4, **SMALL)
    policy = algo.policy
    assert policy.recurrent
    path = record_video(policy, CartPole, tmp_path / "gru.mp4", seed=1)
    assert policy.state is None  # the recording's state does not linger
    steps, _ = episode_steps(policy, CartPole(1), seed=1)
    frames, _ = read_video(path)
    assert frames.shape[0] == steps


class _Preset(CartPole):
    """CartPole whose reset puts sub-env 1's pole past the threshold: it ends at the first step."""

    def reset(self, *, config=None, seed=None):
        super().reset(config=config, seed=seed)
        self.state[1, 2] = 0.5
        return self.state


def test_recurrent_state_reset_when_other_sub_envs_end(tmp_path):
    calls = []

    class Spy:
        """A policy that pushes right and records its reset_state calls."""

        def __call__(self, obs, deterministic=True):
            return torch.ones(obs.shape[0], dtype=torch.int64)

        def reset_state(self, mask=None):
            calls.append(None if mask is None else mask.tolist())

    record_video(Spy(), _Preset(2), tmp_path / "spy.mp4", index=0, max_steps=3)
    # all at the start, sub-env 1 when its episode ends, all at the end
    assert calls == [None, [False, True], None]


def test_gymnasium_env_without_pygame(tmp_path):
    algo = PPO(Blocks, **SMALL)
    # a spec: a 1-env copy is built with render_mode="rgb_array"
    frames, fps = read_video(record_video(algo.policy, Blocks, tmp_path / "b.mp4"))
    assert frames.shape == (6, 34, 46, 3)  # 33 x 45 padded to even sizes
    assert fps == 12
    levels = frames[:, 10, 10, 0].astype(int)
    assert np.all(np.abs(levels - 30 * np.arange(6)) <= 6), levels  # step t drawn at frame t
    # an instance, sub-env 1
    env = GymnasiumEnv(2, env=Blocks, render_mode="rgb_array", env_kwargs={"length": 3})
    try:
        frames, _ = read_video(record_video(algo.policy, env, tmp_path / "b.mp4", index=1))
    finally:
        env.close()
    assert frames.shape[0] == 3


def test_gymnasium_cartpole(tmp_path):
    pytest.importorskip("pygame")  # gymnasium's CartPole draws with pygame
    algo = PPO("CartPole-v1", **SMALL)
    frames, fps = read_video(record_video(algo.policy, "CartPole-v1", tmp_path / "g.mp4", max_steps=5))
    assert frames.shape[1:] == (400, 600, 3) and frames.shape[0] <= 6
    assert fps == 50


def test_pad_frame():
    frame = np.arange(3 * 5 * 3, dtype=np.uint8).reshape(3, 5, 3)
    padded = pad_frame(frame)
    assert padded.shape == (4, 6, 3)
    assert np.array_equal(padded[:3, :5], frame) and np.array_equal(padded[3, :5], frame[2])
    even = np.zeros((4, 6, 3), np.uint8)
    assert pad_frame(even) is even


def test_errors(tmp_path, monkeypatch):
    algo = PPO(CartPole, **SMALL)
    memory = PPO(Memory, **SMALL)
    with pytest.raises(
        NotImplementedError, match="Memory cannot be recorded: it does not implement render"
    ):
        record_video(memory.policy, Memory, tmp_path / "m.mp4")
    env = GymnasiumEnv(1, env=Blocks)
    try:
        with pytest.raises(ValueError, match=r"render_mode.*env_kwargs=\{'render_mode': 'rgb_array'\}"):
            record_video(algo.policy, env, tmp_path / "b.mp4")
    finally:
        env.close()
    with pytest.raises(ValueError, match="fps must be a number > 0"):
        record_video(algo.policy, CartPole, tmp_path / "c.mp4", fps=0)
    with pytest.raises(ValueError, match="max_steps must be an int >= 1"):
        record_video(algo.policy, CartPole, tmp_path / "c.mp4", max_steps=0)
    assert list(tmp_path.glob("*.mp4*")) == []  # nothing written on errors
    monkeypatch.setitem(sys.modules, "imageio", None)
    with pytest.raises(
        ImportError, match=r'pip install imageio imageio-ffmpeg "gymnasium\[classic-control\]"'
    ):
        record_video(algo.policy, CartPole, tmp_path / "c.mp4")


# ------------------------------------------------------------------------ Trainer


def test_trainer_record_and_record_every(tmp_path):
    from mlflow.tracking import MlflowClient

    algo = PPO(Pendulum, env_config={"max_episode_steps": 7}, **SMALL)
    trainer = Trainer(
        algo,
        progress=False,
        eval_num_envs=2,
        eval_num_steps=4,
        record_every=2,
        checkpoint_dir=tmp_path / "ck",
    )
    try:
        rng, gen = torch.get_rng_state(), algo.generator.get_state()
        path = trainer.record(max_steps=3, deterministic=False)
        assert torch.equal(rng, torch.get_rng_state()) and torch.equal(gen, algo.generator.get_state())
        assert path == tmp_path / "ck" / "videos" / "video-0.mp4"
        assert read_video(path)[0].shape == (4, 500, 500, 3)
        custom = trainer.record(tmp_path / "mine.mp4", env_config={"max_episode_steps": 2})
        assert read_video(custom)[0].shape[0] == 2  # truncated after 2 steps
        assert read_video(trainer.record(tmp_path / "again.mp4"))[0].shape[0] == 7  # config not kept

        trainer.run(steps_per_eval=1, stop_conditions=HitsUpperBound("algorithm/steps", 4))
        step = SMALL["num_envs"] * SMALL["horizon"]
        names = [f"eval-{2 * step}.mp4", f"eval-{4 * step}.mp4"]  # every 2nd of 4 evals
        assert {p.name for p in (tmp_path / "ck" / "videos").glob("eval-*")} == set(names)
        assert read_video(tmp_path / "ck" / "videos" / names[0])[0].shape[0] == 7
        trainer.flush()
        history = MlflowClient().get_metric_history(trainer.run_id, "profiling/record_ms")
        assert [m.step for m in history] == [2 * step, 4 * step]
        artifacts = {a.path for a in MlflowClient().list_artifacts(trainer.run_id, "videos")}
        assert artifacts == {
            "videos/video-0.mp4",
            "videos/mine.mp4",
            "videos/again.mp4",
            *(f"videos/{n}" for n in names),
        }
        checkpoint = trainer.save_checkpoint(tmp_path / "ck.pt")
    finally:
        trainer.close()
    assert trainer.eval_envs.record_env is None  # closed with the trainer

    # rl8 record on a Trainer checkpoint: the env and its config come from the file
    out = tmp_path / "cli.mp4"
    assert main(["record", str(checkpoint), "-o", str(out), "--fps", "5"]) == 0
    frames, fps = read_video(out)
    assert frames.shape == (7, 500, 500, 3) and fps == 5


def test_record_every_needs_evaluations(tmp_path):
    trainer = Trainer(
        PPO(CartPole, **SMALL),
        tracking=False,
        progress=False,
        record_every=1,
        checkpoint_dir=tmp_path / "ck",
    )
    try:
        with pytest.raises(ValueError, match="record_every=1 .* steps_per_eval is None"):
            trainer.run(stop_conditions=HitsUpperBound("algorithm/steps", 1))
        assert trainer.algo.collects == 0
    finally:
        trainer.close()
    with pytest.raises(ValueError, match="record_every must be an int >= 1"):
        Trainer(PPO(CartPole, **SMALL), tracking=False, record_every=0)
    memory = Trainer(
        PPO(Memory, **SMALL), tracking=False, progress=False, record_every=1, eval_num_envs=2
    )
    try:  # an env that cannot render fails before training
        with pytest.raises(NotImplementedError, match="Memory cannot be recorded"):
            memory.run(steps_per_eval=1, stop_conditions=HitsUpperBound("algorithm/steps", 1))
        assert memory.algo.collects == 0
    finally:
        memory.close()


# ------------------------------------------------------------------------ rl8 record


def test_cli_record(tmp_path, capsys):
    algo = PPO(CartPole, **SMALL)
    with_env = save_policy(
        algo.policy,
        tmp_path / "policy.pt",
        env={"spec": "rl8.envs.cartpole.CartPole", "env_kwargs": {}, "env_config": {}},
    )
    out = tmp_path / "videos" / "cli.mp4"
    code = main(
        [
            "record",
            str(with_env),
            "-o",
            str(out),
            "--max-steps",
            "4",
            "--env-config",
            "length=0.25",
            "--stochastic",
            "--seed",
            "1",
        ]
    )
    assert code == 0
    assert capsys.readouterr().out.strip() == str(out)
    frames, fps = read_video(out)
    assert frames.shape[1:] == (400, 600, 3) and frames.shape[0] <= 5 and fps == 50

    bare = save_policy(algo.policy, tmp_path / "bare.pt")
    assert main(["record", str(bare), "-o", str(out)]) == 2
    assert "pass --env" in capsys.readouterr().err
    assert (
        main(["record", str(bare), "-o", str(out), "--env", "rl8.envs.CartPole", "--max-steps", "2"])
        == 0
    )
    assert read_video(out)[0].shape[0] <= 3
    assert main(["record", str(with_env), "--env-config", "nope=1", "-o", str(out)]) == 2
    assert "unknown config key 'nope'" in capsys.readouterr().err


def test_cli_record_without_pygame_names_the_extra_in_one_line(tmp_path, capsys, monkeypatch):
    env = gymnasium.make("CartPole-v1")
    policy = save_policy(
        Policy(env.observation_space, env.action_space),
        tmp_path / "policy.pt",
        env={"spec": "CartPole-v1", "env_kwargs": {}, "env_config": {}},
    )
    monkeypatch.setitem(sys.modules, "pygame", None)  # `import pygame` now fails as if absent
    assert main(["record", str(policy), "-o", str(tmp_path / "v.mp4"), "--max-steps", "2"]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err, err
    assert err == (
        "rl8: error: cannot render GymnasiumEnv: pygame is not installed; install what "
        'gymnasium\'s renderers need with: pip install imageio imageio-ffmpeg "gymnasium[classic-control]"\n'
    )
    assert not (tmp_path / "v.mp4").exists()


# --------------------------------------------------------------------------------------------
# rl8 record: MuJoCo without a display, XDG_RUNTIME_DIR, the file's mode


@pytest.fixture(scope="module")
def cheetah_policy(tmp_path_factory):
    """An untrained HalfCheetah-v5 policy file naming its env."""
    pytest.importorskip("imageio_ffmpeg")
    pytest.importorskip("mujoco")
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
    policy = PPO(CartPole, **SMALL).policy
    previous = os.umask(umask)
    try:
        path = record_video(policy, CartPole, tmp_path / "v.mp4", max_steps=2)
    finally:
        os.umask(previous)
    assert stat.S_IMODE(path.stat().st_mode) == 0o666 & ~umask
    assert [p.name for p in tmp_path.iterdir()] == ["v.mp4"]  # no temporary file left


def test_rl8_record_never_writes_over_a_file_that_is_not_a_video(tmp_path, capsys):
    env = CartPole(1)
    policy = save_policy(
        Policy(env.observation_space, env.action_space),
        tmp_path / "policy.pt",
        env={"spec": "rl8.envs.cartpole.CartPole", "env_kwargs": {}, "env_config": {}},
    )
    before = policy.read_bytes()
    (tmp_path / "ckpt.pt").write_bytes(b"PK\x03\x04 a checkpoint")
    for output in (str(policy), str(tmp_path / "ckpt.pt")):
        assert main(["record", str(policy), "-o", output]) == 2
        assert (
            f"{output} exists and is not an MP4 video; rl8 refused to write over it (--force"
            in capsys.readouterr().err
        )
    assert (
        policy.read_bytes() == before
        and (tmp_path / "ckpt.pt").read_bytes() == b"PK\x03\x04 a checkpoint"
    )
    for output, words in (("", "got ''"), (str(tmp_path), "(a folder)")):
        assert main(["record", str(policy), "-o", output]) == 2
        err = capsys.readouterr().err
        assert (
            "-o/--output must name an MP4 file to write" in err and words in err and err.count("\n") == 1
        )
    pytest.importorskip("imageio_ffmpeg")
    assert (
        main(["record", str(policy), "-o", str(tmp_path / "ckpt.pt"), "--force", "--max-steps", "2"])
        == 0
    )
    assert (tmp_path / "ckpt.pt").read_bytes()[4:8] == b"ftyp"
    assert (
        main(["record", str(policy), "-o", str(tmp_path / "ckpt.pt"), "--max-steps", "2"]) == 0
    )  # ours now
