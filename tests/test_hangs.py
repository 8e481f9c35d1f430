"""Nothing hangs: env workers that get stuck in a step or die are named and reaped, in the async
and pool modes, and the pool says what to do where its workers cannot start (a program read
from stdin, a script without a ``__main__`` guard) instead of dying with ``exit code 1``."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest
import torch
from toy_envs import Stall, alive

from rl8 import PPO
from rl8.envs import EnvStepTimeout, EnvWorkerDied, GymnasiumEnv


def run(args: list[str], stdin: str | None = None, timeout: float = 60) -> subprocess.CompletedProcess:
    """Run ``args`` with this rl8 first on the path, bounded in time."""
    return subprocess.run(
        args,
        input=stdin,
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)},
    )


def zeros(n: int) -> torch.Tensor:
    return torch.zeros(n, dtype=torch.long)


# --- async mode ---------------------------------------------------------------------------------


@pytest.mark.timeout(30)
def test_closing_an_async_env_stuck_in_a_step_reaps_every_worker_in_bounded_time():
    """A step in flight that never ends (what Ctrl-C during a step leaves) no longer makes
    close() wait forever; a worker that ignores SIGTERM is killed."""
    env = GymnasiumEnv(
        3,
        env=Stall,
        env_kwargs={"token": 1, "how": "sleep_ignoring_term", "at": 1},
        vectorization_mode="async",
    )
    pids = [p.pid for p in env.vector_env.processes]
    env.reset(seed=0)
    env.vector_env.step_async(env.converter.to_actions(zeros(3)))
    time.sleep(0.3)  # sub-env 1 is now asleep in its step
    start = time.monotonic()
    env.close()
    assert time.monotonic() - start < 10
    assert not any(alive(pid) for pid in pids)
    env.close()  # twice is fine


@pytest.mark.slow
@pytest.mark.timeout(60)
def test_an_async_env_stuck_in_a_step_does_not_keep_the_interpreter_from_exiting():
    """Never closed by the script: the workers are ended at exit, even one ignoring SIGTERM."""
    script = textwrap.dedent("""
        import os, signal, time
        import gymnasium, numpy as np, torch
        from gymnasium import spaces
        from rl8.envs import GymnasiumEnv

        class Stuck(gymnasium.Env):
            observation_space = spaces.Box(0, 1, (1,), np.float32)
            action_space = spaces.Discrete(2)
            def reset(self, *, seed=None, options=None):
                return np.zeros(1, np.float32), {}
            def step(self, action):
                signal.signal(signal.SIGTERM, signal.SIG_IGN)
                while True:
                    time.sleep(1)

        env = GymnasiumEnv(2, env=Stuck, vectorization_mode="async")
        print(*[p.pid for p in env.vector_env.processes], flush=True)
        env.reset(seed=0)
        env.vector_env.step_async(env.converter.to_actions(torch.zeros(2, dtype=torch.long)))
        time.sleep(0.3)
    """)
    result = run([sys.executable, "-c", script], timeout=45)
    pids = [int(pid) for pid in result.stdout.split()]
    assert result.returncode == 0 and len(pids) == 2, result.stderr
    assert not any(alive(pid) for pid in pids)


@pytest.mark.timeout(30)
@pytest.mark.parametrize(
    "how, code", [("exit", r"exit code 3"), ("kill", r"exit code -9 \(killed by signal SIGKILL\)")]
)
def test_a_dead_async_worker_is_named_with_its_exit_code_not_a_bare_eoferror(how, code):
    at = 2 if how == "exit" else 100
    env = GymnasiumEnv(
        3, env=Stall, env_kwargs={"token": 1, "how": "exit", "at": at}, vectorization_mode="async"
    )
    processes = list(env.vector_env.processes)
    env.reset(seed=0)
    env.step(zeros(3))
    if how == "kill":
        os.kill(processes[1].pid, signal.SIGKILL)
    with pytest.raises(
        EnvWorkerDied,
        match=rf"GymnasiumEnv\(Stall\): the async worker process of sub-env 1 "
        rf"\(pid {processes[1].pid}\) ended unexpectedly with {code}",
    ):
        env.step(zeros(3))
    assert not any(alive(p.pid) for p in processes)
    with pytest.raises(RuntimeError, match="is closed"):
        env.step(zeros(3))


@pytest.mark.timeout(30)
def test_an_async_worker_that_dies_building_its_env_is_named():
    with pytest.raises(EnvWorkerDied, match="an async worker process ended while building its env"):
        GymnasiumEnv(2, env=Stall, env_kwargs={"die_in_worker": True}, vectorization_mode="async")


@pytest.mark.timeout(30)
def test_async_step_timeout_names_the_stuck_sub_env_and_reaps_the_workers():
    env = GymnasiumEnv(
        3, env=Stall, env_kwargs={"token": 1}, vectorization_mode="async", step_timeout_s=0.5
    )
    pids = [p.pid for p in env.vector_env.processes]
    env.reset(seed=0)
    for _ in range(2):  # steps within the limit go through
        assert env.step(zeros(3))["obs"].shape == (3, 2)
    start = time.monotonic()
    with pytest.raises(
        EnvStepTimeout,
        match=r"sub-env 1 did not finish a step within step_timeout_s=0.5 s.*"
        r"Raise step_timeout_s",
    ) as info:
        env.step(zeros(3))
    assert isinstance(info.value, TimeoutError)
    assert time.monotonic() - start < 10
    assert not any(alive(pid) for pid in pids)


# --- pool mode ----------------------------------------------------------------------------------


@pytest.mark.timeout(60)
def test_pool_step_timeout_names_the_stuck_sub_env_and_its_worker():
    env = GymnasiumEnv(
        4,
        env=Stall,
        env_kwargs={"token": 3},
        vectorization_mode="pool",
        num_workers=2,
        step_timeout_s=0.5,
    )
    pids = list(env.worker_pids)
    env.reset(seed=0)
    for _ in range(2):
        assert env.step(zeros(4))["obs"].shape == (4, 2)
    with pytest.raises(
        EnvStepTimeout,
        match=r"sub-env 3 \(pool worker 1\) did not finish a step within "
        r"step_timeout_s=0.5 s",
    ):
        env.step(zeros(4))
    assert not any(alive(pid) for pid in pids)


@pytest.mark.timeout(60)
def test_pool_step_timeout_in_a_collect_acting_on_ready_envs():
    algo = PPO(
        Stall,
        num_envs=4,
        horizon=8,
        seed=0,
        env_kwargs={
            "vectorization_mode": "pool",
            "num_workers": 2,
            "min_batch_size": 1,
            "step_timeout_s": 0.5,
            "env_kwargs": {"at": 5},
        },
    )
    pids = list(algo.env.worker_pids)
    # caught as any TimeoutError
    with pytest.raises(
        TimeoutError, match=r"sub-env \d \(pool worker \d\) did not finish a step"
    ) as info:
        algo.collect()
    assert type(info.value) is EnvStepTimeout
    assert not any(alive(pid) for pid in pids)


@pytest.mark.parametrize(
    "mode, value, message",
    [
        ("async", 0, "GymnasiumEnv: step_timeout_s must be a number of seconds > 0 or None, got 0"),
        (
            "async",
            -1.0,
            "GymnasiumEnv: step_timeout_s must be a number of seconds > 0 or None, got -1.0",
        ),
        ("async", "5", "GymnasiumEnv: step_timeout_s must be a number of seconds > 0 or None, got '5'"),
        (
            "async",
            True,
            "GymnasiumEnv: step_timeout_s must be a number of seconds > 0 or None, got True",
        ),
        (
            "async",
            float("nan"),
            "GymnasiumEnv: step_timeout_s must be a number of seconds > 0 or None, got nan",
        ),
        ("pool", 0, "PoolEnv: step_timeout_s must be a number of seconds > 0 or None, got 0"),
        (
            "sync",
            1.0,
            "GymnasiumEnv: step_timeout_s needs vectorization_mode 'async' or 'pool' .* got "
            "step_timeout_s=1.0 with vectorization_mode='sync'",
        ),
    ],
)
def test_bad_step_timeouts_are_refused_naming_the_field_and_value(mode, value, message):
    with pytest.raises(ValueError, match=message):
        GymnasiumEnv(2, env="CartPole-v1", vectorization_mode=mode, step_timeout_s=value)


def test_a_pool_env_that_does_not_pickle_is_refused_before_any_worker_starts():
    import threading

    with pytest.raises(
        TypeError,
        match=r"PoolEnv: the env <class '.*Stall'>, its env_kwargs and wrappers must "
        r"pickle \(with cloudpickle\) to reach the worker processes: "
        r"TypeError: .*lock",
    ):
        GymnasiumEnv(2, env=Stall, env_kwargs={"token": threading.Lock()}, vectorization_mode="pool")


# --- where pool workers cannot start ------------------------------------------------------------

PROGRAM = textwrap.dedent("""
    import gymnasium, numpy as np
    from gymnasium import spaces
    from rl8 import PPO

    class Corridor(gymnasium.Env):
        observation_space = spaces.Box(0, 10, (1,), np.float32)
        action_space = spaces.Discrete(2)
        def reset(self, *, seed=None, options=None):
            super().reset(seed=seed)
            return np.zeros(1, np.float32), {{}}
        def step(self, action):
            return np.zeros(1, np.float32), 1.0, False, False, {{}}

    def main():
        mode = "{mode}"
        env_kwargs = {{"vectorization_mode": mode, **({{"num_workers": 1}} if mode == "pool" else {{}})}}
        algo = PPO(Corridor, num_envs=2, horizon=4, seed=0, env_kwargs=env_kwargs)
        algo.collect()
        print("collected", algo.env_steps, type(algo.env).__name__)
        algo.env.close()
""")
GUARD_HINT = 'if __name__ == "__main__":'


def run_program(
    args: list[str], mode: str, tail: str, stdin: bool = False
) -> subprocess.CompletedProcess:
    """Run :data:`PROGRAM` in ``mode`` followed by ``tail``, on stdin or as the last argument."""
    source = PROGRAM.format(mode=mode) + tail
    return run(args if stdin else [*args, source], stdin=source if stdin else None)


@pytest.mark.slow
@pytest.mark.timeout(90)
def test_pool_from_stdin_says_what_to_do_instead_of_a_worker_exit_code():
    result = run_program([sys.executable, "-"], "pool", "main()\n", stdin=True)
    assert result.returncode != 0
    last = result.stderr.strip().splitlines()[-1]
    assert last.startswith(
        "RuntimeError: GymnasiumEnv(Corridor): the pool's worker processes start by running"
    ), result.stderr
    assert (
        "'<stdin>' is not a file" in last and GUARD_HINT in last and "vectorization_mode='async'" in last
    )
    assert "PoolWorkerDied" not in result.stderr


@pytest.mark.slow
@pytest.mark.timeout(90)
def test_async_from_stdin_works():
    result = run_program([sys.executable, "-"], "async", "main()\n", stdin=True)
    assert result.returncode == 0, result.stderr
    assert "collected 8 GymnasiumEnv" in result.stdout


@pytest.mark.slow
@pytest.mark.timeout(90)
def test_pool_in_a_script_without_a_main_guard_says_what_to_do(tmp_path):
    script = tmp_path / "unguarded.py"
    script.write_text(PROGRAM.format(mode="pool") + "main()\n")
    result = run([sys.executable, str(script)])
    assert result.returncode != 0
    last = result.stderr.strip().splitlines()[-1]
    line = PROGRAM.count("\n") + 1  # the main() call
    assert last.startswith(
        f"RuntimeError: GymnasiumEnv(Corridor): the pool is built at the top level of the script "
        f"{script} (line {line}) without an `{GUARD_HINT}` guard"
    ), result.stderr
    assert "PoolWorkerDied" not in result.stderr


@pytest.mark.slow
@pytest.mark.timeout(90)
def test_pool_in_a_guarded_script_and_from_python_c_runs_an_env_class_of_the_main_program(tmp_path):
    """The env class of the main program reaches the workers by value (cloudpickle), which also
    covers ``python -c`` where the workers could not import it by name."""
    script = tmp_path / "guarded.py"
    script.write_text(PROGRAM.format(mode="pool") + f"{GUARD_HINT}\n    main()\n")
    for result in (
        run([sys.executable, str(script)]),
        run_program([sys.executable, "-c"], "pool", "main()\n"),
    ):
        assert result.returncode == 0, result.stderr
        assert "collected 8 PoolEnv" in result.stdout


@pytest.mark.slow
@pytest.mark.timeout(90)
def test_pool_from_an_ipython_session_runs_an_env_class_defined_in_it():
    pytest.importorskip("IPython", reason="IPython is not installed")
    result = run_program(
        [
            sys.executable,
            "-m",
            "IPython",
            "--quick",
            "--no-banner",
            "--colors=NoColor",
            "--no-confirm-exit",
        ],
        "pool",
        "\nmain()\n",
        stdin=True,
    )
    assert "collected 8 PoolEnv" in result.stdout, result.stdout + result.stderr


@pytest.mark.slow
@pytest.mark.timeout(60)
def test_a_pool_worker_that_dies_on_start_points_at_its_own_error(tmp_path):
    """The backstop where the script cannot be told unguarded (its pool is built by exec'd
    code): the worker that runs it again stops with the advice, and the learner's
    PoolWorkerDied says where to look."""
    script = tmp_path / "hidden.py"
    script.write_text(
        f"exec(compile({PROGRAM.format(mode='pool') + 'main()'!r}, 'elsewhere.py', 'exec'))\n"
    )
    result = run([sys.executable, str(script)], timeout=45)
    assert result.returncode != 0
    assert (
        "RuntimeError: GymnasiumEnv(Corridor): a pool worker process is running the main script again"
        in result.stderr
    )
    last = result.stderr.strip().splitlines()[-1]
    assert last.startswith("rl8.envs.pool.PoolWorkerDied:") and "exit code 1 while starting" in last
    assert GUARD_HINT in last
