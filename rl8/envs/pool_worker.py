"""The worker processes of :class:`~rl8.envs.pool.PoolEnv` and what they share with the learner."""

from __future__ import annotations

import ast
import inspect
import multiprocessing as mp
import os
import pickle
import signal
import sys
import traceback
from multiprocessing.connection import Connection
from typing import Any

import gymnasium
import numpy as np
from gymnasium import spaces
from gymnasium.vector.utils import create_shared_memory, read_from_shared_memory

from rl8.envs.converter import rows, set_rows
from rl8.envs.workers import EPISODE_RECORDS_KEY, ReportEpisodeRecords

__all__: list[str] = []  # PoolEnv's internals

#: The name of pool worker ``w`` is this prefix and ``w``.
WORKER_NAME = "rl8-pool-"

GUARD_ADVICE = (
    'build the pool under an `if __name__ == "__main__":` guard in a script file, or use '
    "vectorization_mode='async', which works from anywhere"
)


def _unguarded_line(main: Any) -> int | None:
    """The line of the main script building the pool when it is outside an ``if __name__ ==
    "__main__":`` body (every worker would run it again), else (or when unknown) ``None``."""
    found = next(
        (
            (f.filename, f.lineno)
            for f in inspect.stack(0)
            if f.frame.f_globals is vars(main) and f.function == "<module>"
        ),
        None,
    )
    if found is None or found[0] != main.__file__:
        return None
    line = found[1]
    try:
        with open(main.__file__, "rb") as f:
            tree = ast.parse(f.read())
    except (OSError, SyntaxError, ValueError):
        return None
    guards = ("__name__ == '__main__'", "'__main__' == __name__")
    guarded = any(
        isinstance(node, ast.If)
        and any(ast.unparse(n) in guards for n in ast.walk(node.test))
        and node.body[0].lineno <= line <= node.body[-1].end_lineno
        for node in ast.walk(tree)
    )
    return None if guarded else line


def check_main_module(label: str) -> None:
    """Refuse, naming the env ``label`` and saying what to do, to start pool workers from a main
    program that each worker would run again (``forkserver``) and could not: one read from
    stdin, or a script that builds the pool at its top level (``docs/collection.md``)."""
    if mp.current_process().name.startswith(WORKER_NAME):  # (a daemon: it cannot start a pool anyway)
        raise RuntimeError(
            f"{label}: a pool worker process is running the main script again (as multiprocessing's "
            "forkserver does on start) and the script builds a pool at its top level; " + GUARD_ADVICE
        )
    main = sys.modules.get("__main__")
    spec_name = getattr(getattr(main, "__spec__", None), "name", None)
    path = getattr(main, "__file__", None)
    if (
        main is None
        or path is None
        or spec_name == "__main__"
        or (spec_name or "").endswith(".__main__")
    ):
        return
    if spec_name is None and not os.path.isfile(path):
        raise RuntimeError(
            f"{label}: the pool's worker processes start by running the main program again, but its "
            f"{path!r} is not a file they can read (a program read from stdin); {GUARD_ADVICE}"
        )
    line = _unguarded_line(main)
    if line is not None:
        raise RuntimeError(
            f"{label}: the pool is built at the top level of the script {path} (line {line}) without an "
            '`if __name__ == "__main__":` guard; its worker processes start by running the script again, '
            f"so each would build a pool of its own: {GUARD_ADVICE}"
        )


def split(num_envs: int, num_workers: int) -> list[range]:
    """Consecutive blocks of sub-envs, one per worker; the first ``num_envs % num_workers``
    workers own one more."""
    size, extra = divmod(num_envs, num_workers)
    starts = [w * size + min(w, extra) for w in range(num_workers + 1)]
    return [range(start, stop) for start, stop in zip(starts, starts[1:])]


class Shared:
    """The shared memory of a pool, ``num_envs`` rows each: observations, last observations
    before an auto-reset, actions, rewards, flags and the episode records of the last step
    (``[return_sum, length_sum, count]``, zeros when none)."""

    def __init__(
        self, observation_space: spaces.Space, action_space: spaces.Space, num_envs: int, ctx: Any
    ) -> None:
        def floats(*shape):
            return spaces.Box(-np.inf, np.inf, shape, np.float64)

        flag = spaces.Box(0, 1, (), np.bool_)
        self.spaces = {
            "obs": observation_space,
            "final_obs": observation_space,
            "actions": action_space,
            "rewards": floats(),
            "terminated": flag,
            "truncated": flag,
            "episode_records": floats(3),
        }
        self.num_envs = num_envs
        self.memory = {
            key: create_shared_memory(space, num_envs, ctx) for key, space in self.spaces.items()
        }

    def views(self) -> dict[str, Any]:
        """numpy views of every array (trees for Dict observation or action spaces)."""
        return {
            key: read_from_shared_memory(space, self.memory[key], self.num_envs)
            for key, space in self.spaces.items()
        }


def _step_env(env: gymnasium.Env, current: int, views: dict[str, Any]) -> None:
    """Step sub-env ``current`` (``env``) with its action, auto-resetting it, in shared memory."""
    records = views["episode_records"]
    obs, reward, terminated, truncated, info = env.step(rows(views["actions"], current))
    reports = isinstance(env, ReportEpisodeRecords)
    if reports:
        records[current] = info.get(EPISODE_RECORDS_KEY, 0.0)
    if terminated or truncated:
        set_rows(views["final_obs"], current, obs)
        obs, info = env.reset()
        if reports and EPISODE_RECORDS_KEY in info:
            records[current] += info[EPISODE_RECORDS_KEY]
    set_rows(views["obs"], current, obs)
    views["rewards"][current] = reward
    views["terminated"][current] = terminated
    views["truncated"][current] = truncated


def worker(
    worker: int, env_ids: range, make_env_pickle: bytes, shared: Shared, pipe: Connection
) -> None:
    """A worker process: builds the sub-envs ``env_ids`` with ``make_env_pickle`` (a pickled
    ``CloudpickleWrapper``, unpickled here so that its failure is reported like any error) and
    serves the learner's commands on ``pipe`` until ``("close", None)``: ``("step", ids)``
    (each sub-env reported by ``("stepped", i)`` when done), ``("reset", [(i, seed), ...])``
    and ``("render", i)``; an exception is reported as ``("error", (i, exc, traceback))``.
    SIGINT is ignored: the learner closes the workers on Ctrl-C. ``worker`` is its index,
    ``shared`` the pool's shared memory."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    views = shared.views()
    envs: dict[int, gymnasium.Env] = {}
    current = env_ids.start

    try:
        make_env = pickle.loads(make_env_pickle)
        for current in env_ids:
            envs[current] = make_env()
        pipe.send(("ready", None))
        while True:
            command, arg = pipe.recv()
            if command == "step":
                for current in arg:
                    _step_env(envs[current], current, views)
                    pipe.send(("stepped", current))
            elif command == "reset":
                for current, seed in arg:
                    obs, _ = envs[current].reset(seed=seed)
                    set_rows(views["obs"], current, obs)
                pipe.send(("reset", None))
            elif command == "render":
                current = arg
                pipe.send(("frame", envs[current].render()))
            elif command == "close":
                break
    except (KeyboardInterrupt, EOFError, BrokenPipeError):
        pass  # the learner is gone or going: nothing to report to
    except Exception as exc:
        trace = traceback.format_exc()
        try:
            pipe.send(("error", (current, exc, trace)))
        except Exception:  # an exception that does not pickle: its text and type name
            unpicklable = RuntimeError(f"{type(exc).__name__}: {exc}")
            pipe.send(("error", (current, unpicklable, trace)))
        # the learner closes the pool on an error: wait for it (or for the pipe to close)
        try:
            while pipe.recv()[0] != "close":
                pass
        except (EOFError, OSError, KeyboardInterrupt):
            pass
    finally:
        for env in envs.values():
            try:
                env.close()
            except Exception:
                pass
        pipe.close()
