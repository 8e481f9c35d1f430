"""What both sides of the ``mjlab`` workloads share: the env built from mjlab's task registry, the
runner config mjlab ships for the task, and one definition of "the return reached".

Runs in the mjlab virtualenv (``run.py`` makes it: ``torch==2.13.0`` first, then ``mjlab``, which
pins mujoco 3.11 and rsl-rl-lib 5.4.2, and rl8's own dependencies), on warp's CPU device
(``CUDA_VISIBLE_DEVICES=""``, set by :func:`cpu_only` before mujoco_warp is imported).

The return is rsl_rl's "Mean reward": the mean return of the last 100 episodes that ended
(truncated or terminated), with the rewards as the env gives them (mjlab scales them by the step
duration, so the cartpole's returns lie in [0, 50]). Both sides start with the episodes at
random lengths (rsl_rl's ``init_at_random_ep_len=True``, what mjlab's ``train.py`` passes), so
that the early returns count partial episodes alike.
"""

from __future__ import annotations

import os
import time
from collections import deque
from dataclasses import asdict


def cpu_only() -> None:
    """Hide CUDA devices from warp and torch (warp then simulates on its CPU device)."""
    os.environ["CUDA_VISIBLE_DEVICES"] = ""


def runner_cfg(task: str, seed: int) -> dict:
    """mjlab's tuned rsl_rl runner config of ``task`` as a dict (``train.py``'s ``asdict``), seeded."""
    import mjlab.tasks  # noqa: F401  (registers the tasks)
    from mjlab.tasks.registry import load_rl_cfg

    cfg = load_rl_cfg(task)
    cfg.seed = seed
    return asdict(cfg)


def env_cfg(task: str, num_envs: int, seed: int, auto_reset: bool = True):
    """mjlab's env config of ``task`` for ``num_envs`` envs, seeded; ``auto_reset=False``: ``step``
    returns the true final observation and waits for ``reset(env_ids)``."""
    import mjlab.tasks  # noqa: F401
    from mjlab.tasks.registry import load_env_cfg

    cfg = load_env_cfg(task)
    cfg.scene.num_envs = num_envs
    cfg.seed = seed
    cfg.auto_reset = auto_reset
    return cfg


class ReturnTracker:
    """Returns of ended episodes, from per-step ``rewards`` and ``dones`` of all envs.

    Args:
        num_envs: Envs stepped together.
        window: Episodes averaged (rsl_rl's 100).
    """

    def __init__(self, num_envs: int, window: int = 100) -> None:
        import torch

        self.sums = torch.zeros(num_envs, dtype=torch.float64)
        self.returns: deque[float] = deque(maxlen=window)

    def add(self, rewards, dones) -> None:
        """One step: ``rewards`` and ``dones`` (bool, 1 where an episode ended) of shape ``[num_envs]``."""
        self.sums += rewards.reshape(-1).double().cpu()
        done = dones.reshape(-1).bool().cpu()
        if done.any():
            self.returns.extend(self.sums[done].tolist())
            self.sums[done] = 0.0

    def mean(self) -> float:
        """Mean return of the last ``window`` ended episodes (NaN before the first)."""
        return sum(self.returns) / len(self.returns) if self.returns else float("nan")


def rl8_iteration(algo, tracker: ReturnTracker) -> float:
    """One training iteration of rl8's ``algo`` (a ``PPO``): ``collect()``, its steps' rewards
    and dones fed to ``tracker`` (a :class:`ReturnTracker`), then ``update()``; the seconds of
    collect + update (``time.perf_counter``; the tracker's feeding is not counted), what
    :meth:`Progress.iteration` takes."""
    start = time.perf_counter()
    algo.collect()
    seconds = time.perf_counter() - start
    data = algo.buffer.data  # this collect's steps: columns 0..horizon-1
    done = data["terminated"] | data["truncated"]
    for t in range(algo.hparams.horizon):
        tracker.add(data["rewards"][:, t], done[:, t])
    start = time.perf_counter()
    algo.update()
    return seconds + time.perf_counter() - start


class Progress:
    """Env steps, wall time and collect + update time of a training run, iteration by iteration,
    and where the return first reached ``target``.

    Args:
        batch: Env steps per iteration (``num_envs * num_steps_per_env``).
        target: The return to reach.
        warmup: Iterations left out of the env steps per second (compilation, first touches).
    """

    def __init__(self, batch: int, target: float, warmup: int) -> None:
        self.batch, self.target, self.warmup = batch, target, warmup
        self.start = time.perf_counter()
        self.iterations = 0
        self.timed_seconds = 0.0
        self.reached: dict | None = None
        self.curve: list[float] = []

    def iteration(self, seconds: float, mean_return: float) -> bool:
        """Record one iteration that took ``seconds`` of collect + update; ``True`` once the
        target is reached."""
        self.iterations += 1
        self.curve.append(round(mean_return, 2))
        if self.iterations > self.warmup:
            self.timed_seconds += seconds
        if self.reached is None and mean_return >= self.target:
            self.reached = {
                "env_steps_to_target": self.iterations * self.batch,
                "seconds_to_target": time.perf_counter() - self.start,
            }
        return self.reached is not None

    def result(self, mean_return: float) -> dict:
        """The run's figures: env steps/s of collect + update after the warm-up, the final return,
        and the env steps and wall seconds to the target (``None`` if never reached)."""
        timed = max(self.iterations - self.warmup, 0) * self.batch
        return {
            "env_steps": timed,
            "seconds": self.timed_seconds,
            "steps_per_s": timed / self.timed_seconds if self.timed_seconds else float("nan"),
            "iterations": self.iterations,
            "final_return": mean_return,
            "target": self.target,
            "env_steps_to_target": None,
            "seconds_to_target": None,
            **(self.reached or {}),
            "returns": self.curve,
        }
