"""Throughput of variants measured in turns, and their ratios printed (shared by the
benchmarks that compare collection modes)."""

from __future__ import annotations

import time


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
    ratios = {f"{name}/{reference}": rate / rates[reference] for name, rate in rates.items() if name != reference}
    print(f"\n{title}")
    for name, rate in rates.items():
        print(f"  {name:>24}: {rate:10.0f} env steps/s")
    for name, ratio in ratios.items():
        print(f"  {name:>24}: {ratio:.2f}x")
    return ratios
