"""Launching processes from tests: the environment that imports this rl8, and torchrun jobs with a
free port, a bounded wait, and the job's processes killed on the way out whatever happens."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

import rl8

ROOT = Path(rl8.__file__).resolve().parent.parent


def rl8_env() -> dict[str, str]:
    """The environment of a subprocess that imports this rl8 (the checkout's, not an installed one)."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")])
    return env


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Launch:
    """A finished torchrun job: exit status, combined output and wall time (s)."""

    def __init__(self, returncode: int, output: str, seconds: float) -> None:
        self.returncode, self.output, self.seconds = returncode, output, seconds


def torchrun(
    args: list[str], *, nproc: int = 2, timeout: float = 150, env: dict[str, str] | None = None
) -> Launch:
    """Run ``torchrun --nproc_per_node=NPROC ARGS`` on this machine and wait at most ``timeout``
    seconds (a longer job fails the test as a hang, with the end of its output).

    The job gets its own process group, killed on the way out whatever happens; its processes
    run one intra-op thread each, unbuffered, with ``env`` added to this process's environment.
    """
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nnodes=1",
        f"--nproc_per_node={nproc}",
        "--master_addr=127.0.0.1",
        f"--master_port={free_port()}",
        *args,
    ]
    full_env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1", **(env or {})}
    t0 = time.monotonic()
    proc = subprocess.Popen(
        cmd,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=full_env,
        start_new_session=True,
    )
    try:
        output, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        output, _ = proc.communicate()
        pytest.fail(f"torchrun did not end within {timeout} s (a hang):\n{output[-5000:]}")
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)  # leftovers of the job, if any
    return Launch(proc.returncode, output, time.monotonic() - t0)
