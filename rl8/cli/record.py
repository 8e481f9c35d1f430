"""``rl8 record``: write an MP4 video of one episode of a saved policy."""

from __future__ import annotations

import argparse
from pathlib import Path

from rl8.cli.common import config_errors, policy_and_env
from rl8.training.config_file import ConfigError

__all__ = ["run"]


def run(args: argparse.Namespace) -> int:
    """``rl8 record``: write the video that ``args`` (the parsed command line) ask for; the exit status."""
    from rl8.training.video import (
        RenderError,
        make_recording_env,
        prepare_headless_rendering,
        record_video,
    )

    _check_output(args.output, args.force)
    prepare_headless_rendering()  # before an env imports mujoco
    with config_errors(errors=(RenderError,)):
        policy, env, _, config = policy_and_env(
            args, lambda spec, env_kwargs: make_recording_env(spec, env_kwargs=env_kwargs, device="cpu")
        )
    try:
        with config_errors(
            errors=(NotImplementedError, KeyError, ValueError, TypeError, RenderError)
        ):  # no render
            path = record_video(
                policy,
                env,
                args.output,
                deterministic=not args.stochastic,
                max_steps=args.max_steps,
                fps=args.fps,
                env_config=config or None,
                seed=args.seed,
            )
    finally:
        env.close()
    print(path)
    return 0


def _check_output(output: str, force: bool) -> None:
    """Refuse ``-o ''``, a folder, and (without ``--force``) an existing file that is no MP4 video."""
    path = Path(output)
    if not output or path.is_dir():
        raise ConfigError(
            f"rl8 record: -o/--output must name an MP4 file to write, got "
            f"{output!r}{' (a folder)' if output else ''}"
        )
    if path.exists() and not force:
        video = False
        if path.is_file():
            with open(path, "rb") as file:  # an MP4 (ISO base media file) starts with a 'ftyp' box
                video = file.read(8)[4:] == b"ftyp"
        if not video:
            raise ConfigError(
                f"rl8 record: -o/--output {output} exists and is not an MP4 video; "
                "rl8 refused to write over it (--force to overwrite it)"
            )
