"""Videos of a policy acting in an env, H.264 MP4s written with imageio (the ``video`` extra);
MuJoCo envs render without a display through EGL or OSMesa. See ``docs/videos.md``."""

from __future__ import annotations

import atexit
import contextlib
import ctypes.util
import os
import shutil
import sys
import tempfile
import traceback
import uuid
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import numpy as np
import torch

from rl8.envs.base import Env
from rl8.envs.gymnasium import GymnasiumEnv, GymnasiumEnvFactory
from rl8.fields import check_int
from rl8.policies.runner import run_policy
from rl8.ppo.algorithm import make_env
from rl8.ppo.resolve import env_target

__all__ = [
    "DEFAULT_MAX_STEPS",
    "RenderError",
    "check_can_render",
    "episode_limit",
    "fork_rng",
    "import_imageio",
    "make_recording_env",
    "pad_frame",
    "prepare_headless_rendering",
    "record_video",
]

#: Steps recorded at most when ``max_steps`` is not given and the env names no episode limit.
DEFAULT_MAX_STEPS = 1000
#: Frame rate (frames per second) when the env's ``metadata`` has no ``render_fps``.
_FALLBACK_FPS = 30
_INSTALL = 'pip install imageio imageio-ffmpeg "gymnasium[classic-control]"'
#: Packages whose code raises when OpenGL cannot draw (no display, no EGL or OSMesa library).
_GL_PACKAGES = ("mujoco", "OpenGL", "glfw")
#: The libraries (and their Debian/Ubuntu packages) of MuJoCo's headless backends.
_HEADLESS_BACKENDS = (("egl", "EGL", "libegl1"), ("osmesa", "OSMesa", "libosmesa6"))
#: The MUJOCO_GL backend that :func:`prepare_headless_rendering` chose (``None``: it set none).
_chosen_backend: str | None = None


class RenderError(RuntimeError):
    """An env could not draw a frame for lack of an OpenGL backend (a MuJoCo env without a
    display and without EGL or OSMesa); the message says what to install or set."""


def fork_rng(device: torch.device) -> contextlib.AbstractContextManager:
    """Run a block without changing torch's RNG streams (CPU, and the CUDA device in use)."""
    return torch.random.fork_rng(devices=[device] if device.type == "cuda" else [])


def prepare_headless_rendering() -> dict[str, str]:
    """Set this process's environment variables so that envs render without a display: on
    Linux without ``DISPLAY``/``WAYLAND_DISPLAY`` and ``MUJOCO_GL``, ``MUJOCO_GL=egl`` (or
    ``osmesa``) when its library is installed; a private ``XDG_RUNTIME_DIR`` when it is unset
    or not a folder. Variables the user set are never changed (see ``docs/videos.md``).
    Returns the variables set, ``{name: value}``."""
    changed: dict[str, str] = {}
    headless = not os.environ.get("DISPLAY") and not os.environ.get("WAYLAND_DISPLAY")
    if sys.platform.startswith("linux") and headless and not os.environ.get("MUJOCO_GL"):
        for backend, library, _ in _HEADLESS_BACKENDS:
            if ctypes.util.find_library(library):
                global _chosen_backend
                changed["MUJOCO_GL"] = _chosen_backend = backend
                break
    runtime_dir = os.environ.get("XDG_RUNTIME_DIR")
    if os.name == "posix" and (
        not runtime_dir or not os.path.isabs(runtime_dir) or not os.path.isdir(runtime_dir)
    ):
        changed["XDG_RUNTIME_DIR"] = tempfile.mkdtemp(prefix="rl8-runtime-")  # mode 0700
        atexit.register(shutil.rmtree, changed["XDG_RUNTIME_DIR"], ignore_errors=True)
    os.environ.update(changed)
    return changed


def _gl_failure(exc: BaseException) -> bool:
    """Whether ``exc`` (or its cause) came out of MuJoCo, PyOpenGL, GLFW or gymnasium's MuJoCo
    renderer (not a gymnasium MuJoCo env, whose own mistakes are not OpenGL's): an OpenGL set-up
    problem rather than a bug of the env."""

    def gl_file(filename: str) -> bool:
        parts = Path(filename).parts
        return parts[-1:] == ("mujoco_rendering.py",) or any(
            part in ("OpenGL", "glfw") or (part == "mujoco" and (i == 0 or parts[i - 1] != "envs"))
            for i, part in enumerate(parts)
        )

    seen: set[int] = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        if type(exc).__module__.split(".")[0] in _GL_PACKAGES:
            return True
        if any(gl_file(frame.f_code.co_filename) for frame, _ in traceback.walk_tb(exc.__traceback__)):
            return True
        exc = exc.__cause__ or exc.__context__
    return False


def _gl_message(env: Any, exc: BaseException) -> str:
    """What to install or set when ``env`` (or its spec) could not render for lack of OpenGL."""
    name = env.name if isinstance(env, Env) else repr(env)
    backend = os.environ.get("MUJOCO_GL")
    first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    installs = " or ".join(f"{package} (MUJOCO_GL={b})" for b, _, package in _HEADLESS_BACKENDS)
    if backend:
        by = " (set by rl8: there is no display)" if backend == _chosen_backend else ""
        return (
            f"cannot render {name} with MUJOCO_GL={backend}{by} ({type(exc).__name__}: {first}): "
            f"install {installs} and set MUJOCO_GL to it, or run with a display"
        )
    return (
        f"cannot render {name} without an OpenGL backend ({type(exc).__name__}: {first}): on a "
        f"machine without a display install {installs} with apt-get, or set MUJOCO_GL to a backend "
        "that works here"
    )


def import_imageio() -> Any:
    """The imageio module, with its ffmpeg backend; a clear ImportError when missing."""
    try:
        import imageio
        import imageio_ffmpeg  # noqa: F401  (the ffmpeg binary imageio writes MP4s with)
    except ImportError as exc:
        raise ImportError(
            f"recording videos needs imageio and imageio-ffmpeg ({exc}); install them with: {_INSTALL}"
        ) from exc
    return imageio


def make_recording_env(
    spec: Any,
    *,
    env_kwargs: Mapping[str, Any] | None = None,
    horizon: int | None = None,
    device: torch.device | str = "cpu",
) -> Env:
    """A one-env copy of ``spec`` that can render (the caller closes it), for
    :func:`record_video`; a gymnasium env gets ``render_mode="rgb_array"`` unless another is given.

    Args:
        spec: What :func:`rl8.ppo.algorithm.make_env` takes (an env class or dotted path, a
            gymnasium id or maker, a ``GymnasiumEnv.make_factory`` factory).
        env_kwargs: The env's constructor arguments (PPO's ``env_kwargs`` hparam).
        horizon: Handed to the env's constructor (some envs size their state with it).
        device: Device of the env's tensors.

    Raises:
        RenderError: Building the env failed for want of OpenGL.
    """
    prepare_headless_rendering()
    factory = isinstance(spec, GymnasiumEnvFactory)
    kwargs = {**(spec.kwargs if factory else {}), **(env_kwargs or {})}
    if (factory or env_target(spec).gymnasium) and kwargs.get("render_mode") is None:
        kwargs["render_mode"] = "rgb_array"
    if factory:  # it takes no extra arguments: make one
        return GymnasiumEnvFactory(spec.cls, spec.env, kwargs)(1, horizon, device=device)
    try:
        return make_env(spec, 1, horizon, device=device, env_kwargs=kwargs)
    except Exception as exc:  # MUJOCO_GL naming a backend whose library is missing fails here
        if _gl_failure(exc):
            raise RenderError(_gl_message(spec, exc)) from exc
        raise


def check_can_render(env: Env) -> None:
    """Raise ``NotImplementedError`` naming ``env``'s class when it cannot render frames (no
    ``render``, or a gymnasium env not built with ``render_mode="rgb_array"``)."""
    name = type(env).__name__
    if type(env).render is Env.render:
        raise NotImplementedError(
            f"{name} cannot be recorded: it does not implement render() (an Env subclass "
            "must return a uint8 [height, width, 3] RGB frame of one sub-env from "
            "render(index))"
        )
    if isinstance(env, GymnasiumEnv) and env.render_mode != "rgb_array":
        raise ValueError(
            f"{env.name} cannot be recorded: it was made with render_mode="
            f"{env.render_mode!r}, recording needs render_mode='rgb_array'. Pass "
            "env_kwargs={'render_mode': 'rgb_array'} to PPO (or make_env), or "
            "GymnasiumEnv(..., render_mode='rgb_array')"
        )


def _render(env: Env, index: int) -> np.ndarray:
    """The frame of sub-env ``index``: an ImportError for a renderer that is not installed
    (pygame), a :class:`RenderError` for an OpenGL context that cannot be made."""
    import gymnasium

    try:
        frame = env.render(index)
    except gymnasium.error.DependencyNotInstalled as exc:
        missing = getattr(exc.__cause__, "name", None) or "the package it draws with"
        raise ImportError(
            f"cannot render {type(env).__name__}: {missing} is not installed; install what "
            f"gymnasium's renderers need with: {_INSTALL}"
        ) from None
    except Exception as exc:
        if _gl_failure(exc):
            raise RenderError(_gl_message(env, exc)) from exc
        raise
    return _as_rgb(frame, env)


def episode_limit(env: Env, config: Mapping[str, Any] | None) -> int | None:
    """Steps after which the env truncates an episode, when it says so (else ``None``)."""
    for source in (config, getattr(env, "params", None)):
        if isinstance(source, Mapping) and "max_episode_steps" in source:
            with contextlib.suppress(TypeError, ValueError):
                limit = int(source["max_episode_steps"])
                if limit > 0:
                    return limit
    vector_env = getattr(env, "vector_env", None)
    candidates = [env, getattr(vector_env, "spec", None)]  # env: rl8.envs.jax's envs
    with contextlib.suppress(Exception):
        candidates.append(vector_env.envs[0].spec)  # type: ignore[union-attr]
    for source in candidates:
        limit = getattr(source, "max_episode_steps", None)
        if isinstance(limit, int) and limit > 0:
            return limit
    return None


def pad_frame(frame: np.ndarray, multiple: int = 2) -> np.ndarray:
    """Pad an RGB ``frame`` (``uint8 [height, width, 3]``) at the bottom and right, repeating
    the edge pixels, to a height and width that are multiples of ``multiple`` pixels (H.264 in
    ``yuv420p`` needs even sizes)."""
    h, w = frame.shape[:2]
    pad_h, pad_w = -h % multiple, -w % multiple
    if not pad_h and not pad_w:
        return frame
    return np.pad(frame, ((0, pad_h), (0, pad_w), (0, 0)), mode="edge")


def _as_rgb(frame: Any, env: Env) -> np.ndarray:
    frame = np.asarray(frame)
    if frame.dtype == np.uint8 and frame.ndim == 2:
        frame = np.repeat(frame[:, :, None], 3, axis=2)
    elif frame.dtype == np.uint8 and frame.ndim == 3 and frame.shape[2] == 4:
        frame = frame[:, :, :3]
    if frame.dtype != np.uint8 or frame.ndim != 3 or frame.shape[2] != 3 or 0 in frame.shape:
        raise ValueError(
            f"{type(env).__name__}.render returned an array of shape {frame.shape} and dtype "
            f"{frame.dtype}, expected uint8 [height, width, 3]"
        )
    return np.ascontiguousarray(frame)


def record_video(
    policy: Callable[..., torch.Tensor],
    env: Env | Any,
    path: str | os.PathLike[str],
    *,
    deterministic: bool = True,
    max_steps: int | None = None,
    fps: float | None = None,
    index: int = 0,
    env_config: dict[str, Any] | None = None,
    seed: int | None = None,
    env_kwargs: Mapping[str, Any] | None = None,
) -> Path:
    """Run ``policy`` in ``env`` until sub-env ``index`` ends its episode (or ``max_steps``),
    write a video of it to an MP4 file and return its path (see ``docs/videos.md``).

    Args:
        policy: A :class:`rl8.Policy` or any callable ``policy(obs, deterministic=bool) ->
            env actions``.
        env: An env instance (it is reset), or what :func:`rl8.ppo.algorithm.make_env` takes: a
            one-env copy is then built (:func:`make_recording_env`) and closed afterwards.
        path: The MP4 file to write (written to a temporary file next to it and renamed).
        deterministic: Act with the distributions' modes (``False``: sample actions).
        max_steps: Env steps at most; ``None``: the env's episode limit, else
            :data:`DEFAULT_MAX_STEPS`.
        fps: Frame rate in frames per second; ``None``: ``env.metadata["render_fps"]``, else 30.
        index: Which sub-env to film, ``0 <= index < env.num_envs``.
        env_config: Env parameters for the reset (``env.reset(config=...)``).
        seed: Seed of the env's reset and, with ``deterministic=False``, of the sampling
            (torch's RNG is restored afterwards); ``None``: the current streams.
        env_kwargs: Constructor arguments when ``env`` is not an instance.

    Raises:
        ImportError: imageio, imageio-ffmpeg or the env's renderer is missing.
        RenderError: The env cannot make an OpenGL context.
        NotImplementedError: The env does not implement ``render``.
        ValueError: A gymnasium env not made with ``render_mode="rgb_array"``; a bad argument;
            frames that are not ``uint8`` RGB or change size.
    """
    imageio = import_imageio()
    prepare_headless_rendering()
    if max_steps is not None:
        check_int("record_video: max_steps", max_steps, 1)
    if fps is not None and (isinstance(fps, bool) or not isinstance(fps, (int, float)) or not fps > 0):
        raise ValueError(f"record_video: fps must be a number > 0 (frames per second), got {fps!r}")
    path = Path(path)
    device = getattr(policy, "device", None)
    owned = not isinstance(env, Env)
    if owned:
        env = make_recording_env(env, env_kwargs=env_kwargs, device=device or "cpu")
    try:
        check_can_render(env)
        check_int("record_video: index", index, 0)
        if index >= env.num_envs:
            raise ValueError(f"record_video: index must be < num_envs={env.num_envs}, got {index}")
        if max_steps is None:
            max_steps = episode_limit(env, env_config) or DEFAULT_MAX_STEPS
        if fps is None:
            fps = (getattr(env, "metadata", None) or {}).get("render_fps") or _FALLBACK_FPS
        seeded = seed is not None and not deterministic
        with fork_rng(torch.device(device or "cpu")) if seeded else contextlib.nullcontext():
            if seeded:
                torch.manual_seed(seed)
            frames = _run(policy, env, deterministic, max_steps, index, env_config, seed)
            with contextlib.closing(frames):
                _write(imageio, frames, path, float(fps), env)
    finally:
        if owned:
            env.close()
    return path


def _run(
    policy: Callable[..., torch.Tensor],
    env: Env,
    deterministic: bool,
    max_steps: int,
    index: int,
    env_config: dict[str, Any] | None,
    seed: int | None,
) -> Any:
    """Yield the frames of one recorded episode (a generator: frames are written as they come)."""
    obs = env.reset(config=env_config or None, seed=seed)
    yield _render(env, index)
    steps = run_policy(policy, env, obs, num_steps=max_steps, deterministic=deterministic)
    with contextlib.closing(steps):
        for step in steps:
            if step.done is not None and bool(step.done[index]):
                return
            yield _render(env, index)


def _write(imageio: Any, frames: Any, path: Path, fps: float, env: Env) -> None:
    """Stream ``frames`` into an H.264 MP4 at ``path``, through a temporary file (mode ``0o666``
    less the umask, as checkpoints) and a rename."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.parent / f".{path.name}.{uuid.uuid4().hex[:12]}.tmp.mp4"
    os.close(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_BINARY", 0), 0o666))
    try:
        writer = imageio.get_writer(  # macro_block_size=1: frames are padded here, never resized
            tmp,
            format="FFMPEG",
            mode="I",
            fps=fps,
            codec="libx264",
            pixelformat="yuv420p",
            macro_block_size=1,
            ffmpeg_log_level="error",
        )
        try:
            shape = None
            for frame in frames:
                frame = pad_frame(frame)
                shape = shape or frame.shape
                if frame.shape != shape:
                    raise ValueError(
                        f"{type(env).__name__}.render: frames changed size during the recording "
                        f"(first {shape[:2]}, now {frame.shape[:2]} after padding to even sizes)"
                    )
                writer.append_data(frame)
        finally:
            writer.close()
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
