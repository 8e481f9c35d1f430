"""Throughput of variants measured in turns, and their ratios printed; the ``Sleepy`` env
(shared by the benchmarks that compare collection modes)."""

from __future__ import annotations

import time

import gymnasium
import numpy as np

SLEEP_S = 4e-3  # the longest sleep of a Sleepy step


class Sleepy(gymnasium.Wrapper):
    """gymnasium's CartPole-v1 whose every step first sleeps 0-``SLEEP_S`` s at random
    (uniform, from the wrapper's own generator, seeded at the first seeded reset): latency
    without CPU."""

    def __init__(self, env: gymnasium.Env | None = None):
        super().__init__(env or gymnasium.make("CartPole-v1"))
        self.sleep_rng = np.random.default_rng()

    def reset(self, *, seed=None, options=None):
        if seed is not None:
            self.sleep_rng = np.random.default_rng(seed)
        return self.env.reset(seed=seed, options=options)

    def step(self, action):
        time.sleep(self.sleep_rng.uniform(0.0, SLEEP_S))
        return self.env.step(action)


def measure(variants: dict, step, rounds: int) -> dict[str, float]:
    """Env steps per second of each variant: ``step(variant)`` runs one timed unit and returns
    its env steps; the variants take turns, round after round."""
    for variant in variants.values():
        step(variant)  # warm-up
    seconds = dict.fromkeys(variants, 0.0)
    steps = dict.fromkeys(variants, 0)
    for _ in range(rounds):
        for name, variant in variants.items():
            start = time.perf_counter()
            steps[name] += step(variant)
            seconds[name] += time.perf_counter() - start
    return {name: steps[name] / seconds[name] for name in variants}


def report(title: str, rates: dict[str, float], reference: str) -> dict[str, float]:
    """Print ``rates`` (env steps/s by variant) under ``title`` and each variant's ratio to
    variant ``reference``; return the ratios by ``"variant/reference"``."""
    ratios = {
        f"{name}/{reference}": rate / rates[reference]
        for name, rate in rates.items()
        if name != reference
    }
    print(f"\n{title}")
    for name, rate in rates.items():
        print(f"  {name:>24}: {rate:10.0f} env steps/s")
    for name, ratio in ratios.items():
        print(f"  {name:>24}: {ratio:.2f}x")
    return ratios


def sb3_collect(model, num_envs: int, horizon: int):
    """A function that collects one rollout of ``horizon`` steps with SB3's PPO ``model``
    (``collect_rollouts``, the collection half of its ``learn``) and returns its env steps."""
    _, callback = model._setup_learn(10**9)  # SB3 has no public way to collect without learning
    callback.on_training_start(locals(), globals())

    def step(_: object) -> int:
        model.collect_rollouts(model.env, callback, model.rollout_buffer, n_rollout_steps=horizon)
        return num_envs * horizon

    return step
