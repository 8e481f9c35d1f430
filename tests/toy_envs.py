"""Toy gymnasium envs of the env-worker tests (``test_pool.py``, ``test_hangs.py``) and a check
that a worker process ended. The envs live in this importable module because pool workers start
by forkserver and import an env class by its module path."""

from __future__ import annotations

import multiprocessing
import os
import signal
import time

import gymnasium
import numpy as np
from gymnasium import spaces


class Counter(gymnasium.Env):
    """obs = [token, count]: ``token`` is the seed of the first reset (``seed + i`` for sub-env
    ``i``, so it names the sub-env), ``count`` the steps since the episode began; reward =
    count + action; the episode is truncated after ``4 + token % 3`` steps. A step sleeps
    ``(token % 4)`` ms, so sub-envs step at different speeds.

    Args:
        fail_at: The token of the sub-env whose third step raises ``ValueError``; ``None``: none.
    """

    observation_space = spaces.Box(0, 1e6, (2,), np.float32)
    action_space = spaces.Discrete(2)

    def __init__(self, fail_at: int | None = None) -> None:
        self.token, self.count, self.fail_at = 0, 0, fail_at

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        if seed is not None:
            self.token = seed
        self.count = 0
        return self._obs(), {}

    def step(self, action):
        time.sleep((self.token % 4) * 1e-3)
        if self.fail_at is not None and self.token == self.fail_at and self.count == 2:
            raise ValueError(f"boom in env with token {self.token}")
        reward = float(self.count + int(action))
        self.count += 1
        return self._obs(), reward, False, self.count >= 4 + self.token % 3, {}

    def _obs(self):
        return np.array([self.token, self.count], dtype=np.float32)


class DictCounter(Counter):
    """Counter with a Dict observation: ``{"token": [token], "state": [count, count ** 2, 1]}``."""

    observation_space = spaces.Dict(
        {
            "token": spaces.Box(0, 1e6, (1,), np.float32),
            "state": spaces.Box(0, 1e6, (3,), np.float32),
        }
    )

    def _obs(self):
        return {
            "token": np.array([self.token], dtype=np.float32),
            "state": np.array([self.count, self.count**2, 1.0], dtype=np.float32),
        }


class Stall(Counter):
    """Counter's observations, reward 0 and episodes truncated after 10 steps, without sleeps. At
    step ``at`` of the sub-env whose token is ``token`` (every sub-env when ``None``) it does
    ``how``: ``"sleep"`` (forever), ``"sleep_ignoring_term"`` (forever, with SIGTERM ignored, so
    that only SIGKILL ends it) or ``"exit"`` (``os._exit(3)``).

    Args:
        token: The token of the sub-env that stalls; ``None``: every sub-env.
        how: ``"sleep"``, ``"sleep_ignoring_term"`` or ``"exit"``.
        at: The step (1 = the first) at which it stalls.
        die_in_worker: ``os._exit(4)`` when built in a child process.
    """

    def __init__(
        self, token: int | None = None, how: str = "sleep", at: int = 3, die_in_worker: bool = False
    ):
        if die_in_worker and multiprocessing.parent_process() is not None:
            os._exit(4)
        super().__init__()
        self.stall_token, self.how, self.at = token, how, at

    def step(self, action):
        self.count += 1
        if self.count == self.at and self.stall_token in (None, self.token):
            if self.how == "exit":
                os._exit(3)
            if self.how == "sleep_ignoring_term":
                signal.signal(signal.SIGTERM, signal.SIG_IGN)
            while True:
                time.sleep(1)
        return self._obs(), 0.0, False, self.count >= 10, {}


def alive(pid: int) -> bool:
    """Whether process ``pid`` runs (a zombie counts as ended)."""
    try:
        with open(f"/proc/{pid}/status") as f:
            return not any(line.startswith("State:") and "Z" in line for line in f)
    except FileNotFoundError:
        return False
