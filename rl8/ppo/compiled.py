"""``compile=True``: :func:`torch.compile` of PPO's two hot steps, beside their plain versions.

The plain steps stay what :class:`rl8.PPO` runs by default: :meth:`rl8.Policy.rollout_step`
(the policy's forward pass at every env step of a collect) and ``PPO._minibatch_loss`` (the
forward pass and :func:`~rl8.ppo.losses.ppo_loss` of one minibatch). :class:`CompiledSteps`
holds their compiled versions; autograd then runs the backward pass of the compiled loss as
one compiled graph too. Action sampling (it draws from PPO's own ``torch.Generator``, which
compiled code cannot take), the optimizer step (already one fused kernel for Adam) and the
gradient clipping stay eager.

Compilation happens at the first call of each step (the first collect and the first update)
and its time is reported once (:attr:`CompiledSteps.compile_s`, the ``profiling/compile_ms``
stat of the first update, and one log line). Inductor caches what it compiles on disk, in the
folder ``TORCHINDUCTOR_CACHE_DIR`` names (docs/hparams.md), so a later process compiles faster.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

import torch

__all__ = ["CompiledSteps", "check_compile_options"]

logger = logging.getLogger(__name__)


def check_compile_options(collect_mode: str) -> None:
    """Raise a ``ValueError`` for options that ``compile=True`` does not work with.

    Args:
        collect_mode: The ``collect_mode`` hyper-parameter: ``"overlap"`` collects in a
            background thread with a copy of the policy, which compiled steps do not support.
    """
    if collect_mode == "overlap":
        raise ValueError(
            "hparam compile: compile=True does not work with collect_mode='overlap' (the background "
            "rollout runs a copy of the policy in another thread); set compile=False or collect_mode='sync'"
        )


class _FirstCallTimer:
    """``fn``, timing its first call (where torch.compile compiles) into ``seconds``."""

    def __init__(self, fn: Callable[..., Any]) -> None:
        self.fn = fn
        self.seconds: float | None = None

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if self.seconds is not None:
            return self.fn(*args, **kwargs)
        start = time.perf_counter()
        out = self.fn(*args, **kwargs)
        self.seconds = time.perf_counter() - start
        return out


class CompiledSteps:
    """The compiled rollout step of a policy and the compiled minibatch loss of a PPO.

    Args:
        rollout_step: The plain rollout step, ``policy.rollout_step`` (arguments and results of
            :meth:`rl8.Policy.rollout_step`).
        minibatch_loss: The plain minibatch loss, ``(minibatch, entropy_coeff) -> PPOLoss``.
        device: Where the policy runs. On CUDA the rollout step is compiled with
            ``mode="reduce-overhead"`` (CUDA graphs); elsewhere with the default mode.

    Attributes:
        rollout_step: Called like the plain rollout step.
        minibatch_loss: Called like the plain minibatch loss.
    """

    def __init__(self, rollout_step: Callable[..., Any], minibatch_loss: Callable[..., Any], device: torch.device) -> None:
        self.cuda_graphs = device.type == "cuda"
        mode = "reduce-overhead" if self.cuda_graphs else None
        self._rollout_step = _FirstCallTimer(torch.compile(rollout_step, mode=mode))
        self.minibatch_loss = _FirstCallTimer(torch.compile(minibatch_loss))
        self._reported = False

    def rollout_step(self, obs: Any, carry: Any, starts: torch.Tensor | None = None) -> tuple[Any, torch.Tensor, Any]:
        """:meth:`rl8.Policy.rollout_step`, compiled. With CUDA graphs the outputs live in the
        graph's memory, which the next replay overwrites: the value and carry that the rollout
        keeps are copied out (the distribution is sampled before the next step)."""
        if not self.cuda_graphs:
            return self._rollout_step(obs, carry, starts)
        torch.compiler.cudagraph_mark_step_begin()
        dist, value, carry = self._rollout_step(obs, carry, starts)
        return dist, value.clone(), None if carry is None else carry.clone()

    @property
    def compile_s(self) -> float:
        """Seconds of the first call of each compiled step so far (compilation and one run)."""
        return sum(step.seconds or 0.0 for step in (self._rollout_step, self.minibatch_loss))

    def report_once(self) -> dict[str, float]:
        """``{"profiling/compile_ms": ...}`` and one log line the first time both steps have
        compiled (after the first update), else ``{}``."""
        if self._reported or self.minibatch_loss.seconds is None:
            return {}
        self._reported = True
        rollout_s, loss_s = self._rollout_step.seconds or 0.0, self.minibatch_loss.seconds
        logger.info(
            "rl8: torch.compile took %.1f s (rollout step %.1f s, update step %.1f s; first calls, cached in "
            "TORCHINDUCTOR_CACHE_DIR for later processes)", rollout_s + loss_s, rollout_s, loss_s,
        )
        return {"profiling/compile_ms": 1000.0 * (rollout_s + loss_s)}
