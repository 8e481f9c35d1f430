"""Markers shared by test modules."""

from __future__ import annotations

import warnings

import pytest
import torch

from rl8.ppo.precision import choose_amp_dtype


def _cpu_runs_bfloat16() -> bool:
    with warnings.catch_warnings():  # the float32 fallback warns
        warnings.simplefilter("ignore")
        return choose_amp_dtype(torch.device("cpu"), True) == torch.bfloat16


#: A test of ``enable_amp`` on the CPU: skipped where it would train in float32 (and so pass
#: without testing bfloat16 at all).
needs_cpu_bfloat16 = pytest.mark.skipif(
    not _cpu_runs_bfloat16(), reason="this CPU has no fast bfloat16: enable_amp trains in float32 here"
)
