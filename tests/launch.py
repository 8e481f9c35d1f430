"""Launching processes from tests: the environment that imports this rl8, a port for a server
that no other test worker is given, and torchrun jobs with a bounded wait and the job's
processes killed on the way out whatever happens. The benchmarks import it too."""

from __future__ import annotations

import contextlib
import itertools
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


# The ports free_port hands out: a block of PORTS_PER_WORKER for each pytest-xdist worker, all
# below Linux's ephemeral range (32768-60999), from which the kernel picks the port of every
# socket bound to port 0 (every client connection too). A port asked of the kernel (bind port 0,
# close, hand the number on) can be given to another worker before the server that gets it binds
# it; a port of this worker's own block cannot.
FIRST_PORT = 20000
PORTS_PER_WORKER = 500
_offsets = itertools.count(os.getpid())  # a start that differs between test sessions


def free_port() -> int:
    """A TCP port on 127.0.0.1 for a server a test starts (an MLflow server, torchrun's
    rendezvous): nothing listens on it now, and no other worker of this test session, nor the
    kernel for a port-0 socket, hands it out. Each call gives the next free port of this worker's
    block (see ``FIRST_PORT``); raises ``RuntimeError`` when the whole block is in use."""
    worker = os.environ.get("PYTEST_XDIST_WORKER", "gw0")
    first = FIRST_PORT + PORTS_PER_WORKER * int(worker.removeprefix("gw") or 0)
    if first + PORTS_PER_WORKER > 32768:
        raise RuntimeError(f"free_port: worker {worker} has no block below the ephemeral range")
    for _ in range(PORTS_PER_WORKER):
        port = first + next(_offsets) % PORTS_PER_WORKER
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:  # in use (another session's test, or a socket in TIME_WAIT)
                continue
            return port
    raise RuntimeError(f"free_port: every port of {first}-{first + PORTS_PER_WORKER - 1} is in use")


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
