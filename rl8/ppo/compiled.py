"""``compile=True``: :func:`torch.compile` of PPO's rollout step and minibatch step, beside their
plain versions (docs/hparams.md, Speed); the update steps that run them (:class:`CompiledLossStep`,
:class:`FusedStep`, update steps as the plain :class:`~rl8.ppo.update_step.EagerStep` is)."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from rl8.ppo.losses import MONITORS, PPOLoss, adaptive_lr
from rl8.ppo.update_step import EagerStep

__all__ = [
    "CPU_COMPILED_ROLLOUT_MIN_ENVS",
    "CompiledLossStep",
    "CompiledSteps",
    "FusedStep",
    "FusedTrainStep",
    "fused_step_problem",
]

logger = logging.getLogger(__name__)

#: On CPU, the fewest envs (rows of a rollout step's batch) for which the rollout step runs
#: compiled; with fewer, its per-call cost is larger than what it saves and it runs plain.
CPU_COMPILED_ROLLOUT_MIN_ENVS = 64


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
    """The compiled rollout step of a policy and the compiled minibatch step of a PPO; each
    compiles at its first call, timed (:attr:`compile_s`).

    Args:
        rollout_step: The plain rollout step, :meth:`policy.rollout_step <rl8.Policy.rollout_step>`.
        minibatch_loss: The plain minibatch loss, ``(minibatch, entropy_coeff) -> PPOLoss``.
        device: Where the policy runs. On CUDA the rollout step is compiled with
            ``mode="reduce-overhead"`` (CUDA graphs); elsewhere with the default mode.
        fused_step: The :class:`FusedTrainStep` to run where it is exact, or ``None``: the
            compiled minibatch loss with an eager backward pass and optimizer step.
        fused_problem: With ``fused_step`` ``None``: why it is not used (logged once).

    Attributes:
        minibatch_loss: Called like the plain minibatch loss.
        cpu_rollout_min_envs: On CPU, the fewest envs for which :meth:`rollout_step` runs the
            compiled step (default :data:`CPU_COMPILED_ROLLOUT_MIN_ENVS`; read at its first call).
        rollout_step_kind: Which rollout step runs, set at the first call of
            :meth:`rollout_step`: ``"cuda-graphs"``, ``"compiled"`` or ``"plain"`` (``None``
            before).
        train_step_kind: Which minibatch step runs: ``"fused"`` (:class:`FusedTrainStep`) or
            ``"loss"`` (the compiled loss, then an eager backward pass, clip and optimizer step).
        train_step_fallback: Why the fused step is not used (``train_step_kind="loss"``), else ``None``.
    """

    def __init__(
        self,
        rollout_step: Callable[..., Any],
        minibatch_loss: Callable[..., Any],
        device: torch.device,
        *,
        fused_step: FusedTrainStep | None = None,
        fused_problem: str | None = None,
    ) -> None:
        self.cuda_graphs = device.type == "cuda"
        self._plain_rollout_step = rollout_step
        mode = "reduce-overhead" if self.cuda_graphs else None
        self._rollout_step = _FirstCallTimer(torch.compile(rollout_step, mode=mode))
        self.cpu_rollout_min_envs = CPU_COMPILED_ROLLOUT_MIN_ENVS
        self.rollout_step_kind: str | None = None
        self.minibatch_loss = _FirstCallTimer(torch.compile(minibatch_loss))
        self._fused_step = None if fused_step is None else _FirstCallTimer(fused_step)
        self.train_step_kind = "loss" if fused_step is None else "fused"
        self.train_step_fallback = fused_problem if fused_step is None else None
        self._reported = False

    def rollout_step(
        self, obs: Any, carry: Any, starts: torch.Tensor | None = None
    ) -> tuple[Any, torch.Tensor, Any]:
        """:meth:`rl8.Policy.rollout_step`, compiled. With CUDA graphs the outputs live in the
        graph's memory, which the next replay overwrites: the value and carry that the rollout
        keeps are copied out (the distribution is sampled before the next step). On CPU, with
        fewer than :attr:`cpu_rollout_min_envs` envs, the plain step instead."""
        if self.rollout_step_kind is None:
            few = not self.cuda_graphs and len(obs) < self.cpu_rollout_min_envs
            self.rollout_step_kind = (
                "cuda-graphs" if self.cuda_graphs else "plain" if few else "compiled"
            )
            if few:
                logger.info(
                    "rl8: compile=True: the rollout step runs plain: %d envs, fewer than the %d for which "
                    "compiling it pays on CPU",
                    len(obs),
                    self.cpu_rollout_min_envs,
                )
        if self.rollout_step_kind == "plain":
            return self._plain_rollout_step(obs, carry, starts)
        if not self.cuda_graphs:
            return self._rollout_step(obs, carry, starts)
        torch.compiler.cudagraph_mark_step_begin()
        dist, value, carry = self._rollout_step(obs, carry, starts)
        return dist, value.clone(), None if carry is None else carry.clone()

    def train_step(self, minibatch: Any, entropy_coeff: float) -> tuple[PPOLoss, torch.Tensor] | None:
        """The fused step (:class:`FusedTrainStep`) on ``minibatch``: its loss and the gradient
        norm before clipping; ``None`` where the fused step is not used, or torch refused to
        compile it at this first call (nothing changed then): the caller runs the compiled
        :attr:`minibatch_loss` with an eager backward pass and optimizer step."""
        if self._fused_step is None:
            return None
        try:
            return self._fused_step(minibatch, entropy_coeff)
        except Exception as err:  # at the first call: torch.func or torch.compile refused the model
            if self._fused_step.seconds is not None:
                raise
            self._fused_step, self.train_step_kind = None, "loss"
            self.train_step_fallback = f"torch refused it: {type(err).__name__}: {err}"
            logger.warning(
                "rl8: compile=True runs the compiled loss with an eager optimizer step: %s",
                self.train_step_fallback,
            )
            return None

    @property
    def compile_s(self) -> float:
        """Seconds of the first call of each compiled step so far (compilation and one run)."""
        return sum(
            step.seconds or 0.0
            for step in (self._rollout_step, self.minibatch_loss, self._fused_step)
            if step is not None
        )

    def report_once(self) -> dict[str, float]:
        """``{"profiling/compile_ms": ...}`` and one log line (the compile time and the minibatch
        step that runs) the first time the update's step has compiled, else ``{}``."""
        update_s = [
            step.seconds
            for step in (self.minibatch_loss, self._fused_step)
            if step is not None and step.seconds is not None
        ]
        if self._reported or not update_s:
            return {}
        self._reported = True
        if self._fused_step is not None:
            kind = "fused: loss, gradients, clip and Adam step in one compiled function"
        else:
            kind = (
                f"compiled loss, eager backward and optimizer step, because {self.train_step_fallback}"
            )
        logger.info(
            "rl8: torch.compile took %.1f s (rollout step %.1f s, update step %.1f s; first calls, cached in "
            "TORCHINDUCTOR_CACHE_DIR for later processes); update step: %s",
            self.compile_s,
            self._rollout_step.seconds or 0.0,
            sum(update_s),
            kind,
        )
        return {"profiling/compile_ms": 1000.0 * self.compile_s}


# ----------------------------------------------------------------- the update steps
class CompiledLossStep(EagerStep):
    """The eager update step on the compiled minibatch loss (``compiled.minibatch_loss``), where
    the fused step is not exact (:func:`fused_step_problem`) or torch refused it.

    Args:
        compiled: The PPO's :class:`CompiledSteps`.
        **options: :class:`~rl8.ppo.update_step.EagerStep`'s, but ``minibatch_loss``.
    """

    def __init__(self, compiled: CompiledSteps, **options: Any) -> None:
        super().__init__(compiled.minibatch_loss, **options)
        self.compiled = compiled

    def stats(self) -> dict[str, float]:
        """``profiling/compile_ms`` after the first update (:meth:`CompiledSteps.report_once`)."""
        return self.compiled.report_once()


class FusedStep:
    """The update step as :class:`FusedTrainStep`'s one compiled function; the
    :class:`CompiledLossStep` ``fallback`` once torch refused to compile it (at its first call).

    Args:
        compiled: The PPO's :class:`CompiledSteps`, with a fused step.
        fallback: The step that runs instead when torch refuses the fused one.
    """

    def __init__(self, compiled: CompiledSteps, fallback: CompiledLossStep) -> None:
        self.compiled, self.fallback = compiled, fallback

    def __call__(
        self,
        minibatch: Any,
        entropy_coeff: float,
        extra_loss: torch.Tensor | None,
        index: int,
    ) -> tuple[PPOLoss, torch.Tensor | None]:
        """:meth:`rl8.ppo.update_step.UpdateStep.__call__`; one optimizer step per minibatch."""
        if extra_loss is not None:
            raise ValueError(
                "FusedStep: the fused step computes PPO's loss alone, but an extension added a "
                "loss term (fused_step_problem refuses such a PPO)"
            )
        fused = self.compiled.train_step(minibatch, entropy_coeff)
        if fused is None:
            return self.fallback(minibatch, entropy_coeff, extra_loss, index)
        return fused

    def stats(self) -> dict[str, float]:
        """``profiling/compile_ms`` after the first update (:meth:`CompiledSteps.report_once`)."""
        return self.compiled.report_once()


# ----------------------------------------------------------------- the fused train step
_ADAM_OPTIONS = {"amsgrad": False, "maximize": False, "differentiable": False}


def fused_step_problem(
    optimizer: torch.optim.Optimizer,
    *,
    grad_scaler: bool,
    distributed: bool,
    accumulate_grads: bool,
    recurrent: bool,
    mirror_loss: bool = False,
) -> str | None:
    """Why :class:`FusedTrainStep` would not be exactly PPO's plain minibatch step, or ``None``
    when it would: PPO's ``optimizer`` must be a ``torch.optim.Adam`` or ``AdamW`` of one parameter
    group with ``amsgrad``, ``maximize`` and ``differentiable`` off, and PPO must not scale its losses
    (``grad_scaler``: ``enable_amp`` in float16), average gradients over ranks (``distributed``),
    ``accumulate_grads``, run a ``recurrent`` model (torch.compile does not trace nn.LSTM/nn.GRU),
    or add hparam symmetry's ``mirror_loss`` (a user function inside the loss)."""
    if type(optimizer) not in (torch.optim.Adam, torch.optim.AdamW):
        return f"the optimizer is {type(optimizer).__qualname__}, not torch.optim.Adam or AdamW"
    if len(optimizer.param_groups) != 1:
        return f"the optimizer has {len(optimizer.param_groups)} parameter groups, not 1"
    group = optimizer.param_groups[0]
    for option, value in _ADAM_OPTIONS.items():
        if bool(group.get(option)) != value:
            return f"the optimizer's {option}={group.get(option)!r} (the fused step implements {option}={value})"
    if torch.is_tensor(group["lr"]) or any(torch.is_tensor(beta) for beta in group["betas"]):
        return "the optimizer's lr or betas are tensors"
    if grad_scaler:
        return (
            "a gradient scaler (enable_amp in float16 on CUDA) unscales the gradients between "
            "backward and step"
        )
    if distributed:
        return "data-parallel training averages the gradients over ranks between backward and step"
    if accumulate_grads:
        return "accumulate_grads takes one optimizer step per pass"
    if recurrent:
        return "torch.compile does not trace the recurrent model's nn.LSTM/nn.GRU"
    if mirror_loss:
        return (
            "hparam symmetry's use_mirror_loss adds a loss that calls data_augmentation_func, the "
            "user's own Python, between the forward pass and backward"
        )
    return None


class _LossModule(nn.Module):
    """``minibatch_loss`` as a module's forward pass, for :func:`torch.func.functional_call`."""

    def __init__(self, policy: nn.Module, minibatch_loss: Callable[..., PPOLoss]) -> None:
        super().__init__()
        self.policy = policy
        self.minibatch_loss = minibatch_loss

    def forward(self, minibatch: Any, entropy_coeff: torch.Tensor, entropy_grad: bool) -> PPOLoss:
        return self.minibatch_loss(minibatch, entropy_coeff, entropy_grad=entropy_grad)


class FusedTrainStep:
    """PPO's whole minibatch step (loss, :func:`torch.func.grad_and_value` gradients, grad-norm clip,
    Adam/AdamW update) as one compiled function, in place on the parameters and on the optimizer's
    own state, so that a run can go on with either step. Only where :func:`fused_step_problem` is ``None``.

    Args:
        policy: The policy whose trainable parameters the optimizer holds.
        optimizer: A ``torch.optim.Adam`` or ``AdamW`` over ``policy``'s parameters (its
            ``lr``, ``betas``, ``eps`` and ``weight_decay`` are read at every call).
        minibatch_loss: The plain minibatch loss, ``(minibatch, entropy_coeff, *, entropy_grad) -> PPOLoss``,
            computing with ``policy``.
        max_grad_norm: Clip the global gradient norm to this; ``None``: only measure it.
        desired_kl: PPO's ``desired_kl``: the step adapts the lr from the minibatch's KL before
            the Adam update (:func:`~rl8.ppo.losses.adaptive_lr`) and writes it back to the
            optimizer (one host read per call); ``None``: the lr is the optimizer's.
    """

    def __init__(
        self,
        policy: nn.Module,
        optimizer: torch.optim.Optimizer,
        minibatch_loss: Callable[..., PPOLoss],
        max_grad_norm: float | None,
        *,
        desired_kl: float | None = None,
    ) -> None:
        self.optimizer = optimizer
        self.max_grad_norm = max_grad_norm
        self.desired_kl = desired_kl
        self.loss_module = _LossModule(policy, minibatch_loss)
        name_of = {p: name for name, p in self.loss_module.named_parameters()}
        self.params = [p for p in optimizer.param_groups[0]["params"] if p.requires_grad]
        self.names = [name_of[p] for p in self.params]
        device = self.params[0].device
        # lr and the entropy coefficient follow schedules: tensors, so that a new value does not recompile
        self.lr = torch.zeros((), device=device)
        self.entropy_coeff = torch.zeros((), device=device)
        self.step = torch.compile(self._step, fullgraph=True)

    def __call__(self, minibatch: Any, entropy_coeff: float) -> tuple[PPOLoss, torch.Tensor]:
        """One optimizer step on ``minibatch``; returns its :class:`~rl8.ppo.losses.PPOLoss`
        (computed before the step, as the plain step's) and the gradient norm before clipping."""
        # read at every call: optimizer.load_state_dict replaces the group and the state tensors
        group = self.optimizer.param_groups[0]
        states = [self._state(p, group) for p in self.params]
        self.lr.fill_(group["lr"])
        self.entropy_coeff.fill_(entropy_coeff)
        decoupled = group.get("decoupled_weight_decay", isinstance(self.optimizer, torch.optim.AdamW))
        adam = dict(
            betas=tuple(group["betas"]),
            eps=group["eps"],
            weight_decay=group["weight_decay"],
            decoupled_weight_decay=bool(decoupled),
        )
        total, monitors, grad_norm = self.step(
            minibatch,
            self.entropy_coeff,
            entropy_coeff != 0,
            self.lr,
            adam,
            [p.detach() for p in self.params],
            [s["exp_avg"] for s in states],
            [s["exp_avg_sq"] for s in states],
            [s["step"] for s in states],
        )
        if self.desired_kl is not None:
            group["lr"] = self.lr.item()
        return PPOLoss(total=total, **monitors), grad_norm

    def _state(self, p: nn.Parameter, group: dict[str, Any]) -> dict[str, torch.Tensor]:
        """``optimizer.state[p]``, created as ``torch.optim.Adam`` creates it at its first step."""
        state = self.optimizer.state[p]
        if not state:
            on_device = group["capturable"] or group["fused"]
            float64 = torch.get_default_dtype() == torch.float64 and not group["fused"]
            scalar_dtype = torch.float64 if float64 else torch.float32
            state["step"] = torch.zeros((), dtype=scalar_dtype, device=p.device if on_device else "cpu")
            state["exp_avg"] = torch.zeros_like(p, memory_format=torch.preserve_format)
            state["exp_avg_sq"] = torch.zeros_like(p, memory_format=torch.preserve_format)
        return state

    def _step(
        self,
        minibatch: Any,
        entropy_coeff: torch.Tensor,
        entropy_grad: bool,
        lr: torch.Tensor,
        adam: dict[str, Any],
        params: list[torch.Tensor],
        exp_avgs: list[torch.Tensor],
        exp_avg_sqs: list[torch.Tensor],
        steps: list[torch.Tensor],
    ) -> tuple[torch.Tensor, dict[str, torch.Tensor], torch.Tensor]:
        """The compiled function, in place on its tensor arguments; returns loss, monitors, grad norm."""

        def total_loss(
            named_params: dict[str, torch.Tensor],
        ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
            loss = torch.func.functional_call(
                self.loss_module, named_params, (minibatch, entropy_coeff, entropy_grad)
            )
            return loss.total, {name: getattr(loss, name) for name in MONITORS}

        loss_grads = torch.func.grad_and_value(total_loss, has_aux=True)
        grads, (total, monitors) = loss_grads(dict(zip(self.names, params)))
        grads = [grads[name] for name in self.names]
        if self.desired_kl is not None:
            lr.copy_(adaptive_lr(lr, monitors["approx_kl"], self.desired_kl))

        # as torch.nn.utils.clip_grad_norm_
        grad_norm = torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(g) for g in grads]))
        if self.max_grad_norm is not None:
            clip_coeff = (self.max_grad_norm / (grad_norm + 1e-6)).clamp(max=1.0)
            grads = [g * clip_coeff for g in grads]

        # as torch.optim.Adam / AdamW (amsgrad and maximize off)
        beta1, beta2 = adam["betas"]
        eps, weight_decay = adam["eps"], adam["weight_decay"]
        for param, grad, exp_avg, exp_avg_sq, step in zip(
            params, grads, exp_avgs, exp_avg_sqs, steps, strict=True
        ):
            step.add_(1)
            if weight_decay != 0:
                if adam["decoupled_weight_decay"]:
                    param.mul_(1 - lr * weight_decay)
                else:
                    grad = grad + weight_decay * param
            exp_avg.lerp_(grad, 1 - beta1)
            exp_avg_sq.mul_(beta2).addcmul_(grad, grad, value=1 - beta2)
            bias_correction1 = 1 - beta1 ** step.to(param.device)
            bias_correction2 = 1 - beta2 ** step.to(param.device)
            denom = exp_avg_sq.sqrt() / bias_correction2.sqrt() + eps
            param.sub_(lr / bias_correction1 * exp_avg / denom)
        return total.detach(), monitors, grad_norm.detach().float()
