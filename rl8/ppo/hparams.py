"""PPO's hyper-parameters: one frozen, validated dataclass.

Defaults follow "The 37 Implementation Details of PPO" (Huang et al., 2022) and SB3's
rl-zoo, tuned so that ``PPO(CartPole)`` solves CartPole in seconds on a laptop CPU; see
``docs/hparams.md`` for each field and where rl8 differs from SB3 and CleanRL.
"""

from __future__ import annotations

import dataclasses
import difflib
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

import torch

from rl8.numbers import read_numbers
from rl8.ppo.resolve import HPARAM_KINDS, resolve
from rl8.ppo.schedules import Schedule

__all__ = ["HParams"]

# Seeds are stored as int64 (tensors, checkpoints) and handed to torch.manual_seed.
_MAX_SEED = 2**63 - 1

# Minibatches per pass by default (CleanRL's ``num_minibatches``); at the default batch shape
# (256 envs x 32 steps) minibatches of 2048 transitions.
_DEFAULT_NUM_MINIBATCHES = 4

#: The names other PPO libraries (SB3, CleanRL) give some hyper-parameters, and rl8's names.
_OTHER_NAMES = {
    "learning_rate": "lr", "n_steps": "horizon", "num_steps": "horizon", "n_envs": "num_envs",
    "batch_size": "sgd_minibatch_size", "minibatch_size": "sgd_minibatch_size",
    "n_epochs": "num_sgd_iters", "update_epochs": "num_sgd_iters", "clip_range": "clip_param",
    "clip_coef": "clip_param", "clip_range_vf": "vf_clip_param", "ent_coef": "entropy_coeff",
    "vf_coef": "vf_coeff", "target_kl": "target_kl_div", "norm_adv": "normalize_advantages",
    "policy_kwargs": "model_config",
}


def missing_cuda_device(device: torch.device) -> str | None:
    """Why the CUDA ``device`` cannot be used on this machine (``"CUDA is not available on this
    machine"``, or the devices it has when the index is out of range), or ``None`` when it can
    (and for every device that is not CUDA)."""
    if device.type != "cuda":
        return None
    if not torch.cuda.is_available():
        return "CUDA is not available on this machine"
    count = torch.cuda.device_count()
    if device.index is not None and device.index >= count:
        return f"this machine has {count} CUDA device(s), cuda:0 to cuda:{count - 1}"
    return None


def _divisors(n: int) -> list[int]:
    """The divisors of ``n >= 1``, ascending."""
    small = [d for d in range(1, math.isqrt(n) + 1) if n % d == 0]
    return small + [n // d for d in reversed(small) if d * d != n]


def _nearest_divisors(n: int, value: float) -> list[int]:
    """The divisors of ``n`` closest to ``value`` from below and from above (one or two)."""
    divisors = _divisors(n)
    below = [d for d in divisors if d < value]
    above = [d for d in divisors if d > value]
    return [*below[-1:], *above[:1]]


def _or(values: Any) -> str:
    return " or ".join(str(v) for v in values)


@dataclass(frozen=True, kw_only=True)
class HParams:
    """Hyper-parameters of :class:`rl8.PPO` (all keyword-only; see ``docs/hparams.md``).

    Attributes:
        num_envs: Number of environments simulated in parallel.
        horizon: Env steps collected per env between updates; the buffer holds
            ``num_envs * horizon`` transitions.
        horizons_per_env_reset: ``k > 0``: PPO resets every env every ``k`` collects;
            ``k < 0``: only once, before the first collect. ``0`` is invalid. Episodic envs
            also reset finished sub-envs themselves.
        collect_mode: ``"sync"``: :meth:`PPO.collect <rl8.PPO.collect>` steps the envs, then
            :meth:`PPO.update <rl8.PPO.update>` trains on what it collected. ``"overlap"``: the
            next collect runs in a background thread while the update runs, with a copy of
            the policy synced after every update, so each batch is collected with weights one
            update old (``monitors/policy_lag``; the PPO ratio uses the stored behaviour
            log-probs). See ``docs/collection.md`` ("Overlapped collection").
        gamma: Discount factor in [0, 1].
        gae_lambda: GAE's lambda in [0, 1].
        num_sgd_iters: Passes (epochs) over the buffer per update.
        sgd_minibatch_size: Transitions per minibatch; must divide ``num_envs * horizon``
            (and, for recurrent models, be a multiple of the sequence length). ``None``: the
            whole buffer as one minibatch. ``"auto"`` (default): the buffer split into
            ``num_minibatches`` equal minibatches.
        num_minibatches: With ``sgd_minibatch_size="auto"``: minibatches per pass; must
            divide the number of samples (transitions, or sequences for recurrent models).
            ``None`` (default): 4, as in CleanRL's ``ppo.py``, or the largest count below 4
            that divides the samples (1: the whole buffer), so that every batch shape works.
        shuffle_minibatches: Draw minibatches from a fresh random permutation every pass.
        clip_param: PPO's ratio clip epsilon (> 0).
        dual_clip_param: Dual-clip constant c > 1 (Ye et al., 2020) bounding the loss of
            negative-advantage samples, or ``None`` to disable.
        vf_clip_param: Clip the value update to ``old_value +- vf_clip_param`` (PPO2-style
            value clipping), or ``None`` to disable.
        vf_coeff: Weight of the value loss in the total loss.
        entropy_coeff: Weight of the entropy bonus (constant unless a schedule is given).
        entropy_coeff_schedule: ``[(env_steps, coeff), ...]`` overriding ``entropy_coeff``.
        lr: Learning rate of the optimizer, finite and > 0 (constant unless a schedule is given).
        lr_schedule: ``[(env_steps, lr), ...]`` overriding ``lr``.
        schedule_kind: ``"step"`` or ``"linear"`` interpolation of both schedules.
        target_kl_div: Stop the update's remaining minibatches once the approximate KL
            divergence of a minibatch exceeds this, or ``None``.
        max_grad_norm: Clip the global gradient norm to this, or ``None``.
        normalize_advantages: Normalise advantages per minibatch (zero mean, unit std).
        normalize_rewards: Scale rewards by the running std of the discounted return.
        normalize_observations: Normalise float observations with running mean/variance.
        accumulate_grads: Accumulate gradients over all minibatches of a pass and take one
            optimizer step per pass (instead of one per minibatch).
        enable_amp: Mixed precision: bfloat16 autocast on CPU, float16 with a gradient
            scaler on CUDA.
        optimizer_cls: A ``torch.optim.Optimizer`` subclass or its dotted path
            (``"torch.optim.Adam"``).
        optimizer_kwargs: Extra keyword arguments of the optimizer (``lr`` is set from
            ``lr``). Default: Adam's ``eps=1e-5`` as in the 37 details.
        model_cls: A :class:`rl8.Model` subclass (see :mod:`rl8.policies.models`), its dotted path, or
            ``None`` for the default.
        model_config: Keyword arguments of the model class.
        distribution_cls: A :class:`rl8.Distribution` subclass, its dotted path, or ``None``
            for the one the action space implies.
        device: ``"auto"`` (CUDA when available, else CPU) or an explicit torch device.
        seed: Seed of torch's RNG and the envs, an int in [0, 2**63 - 1]; ``None`` draws one
            from the OS.
        env_config: Env parameters applied at every env reset (see ``Env.reset``).
        env_kwargs: Extra keyword arguments for the env's constructor.
        check_finite_collects: Check observations and rewards for NaN/inf during this many
            first collects (``-1``: always, ``0``: never).
        seq_len: Steps per training sequence for recurrent models (must divide ``horizon``);
            ``None``: the horizon.
        seqs_per_state_reset: Recurrent models: reset the hidden state every ``k`` sequences
            (``k > 0``) or only at episode ends and env resets (``k < 0``).
    """

    num_envs: int = 256
    horizon: int = 32
    horizons_per_env_reset: int = -1
    collect_mode: Literal["sync", "overlap"] = "sync"
    gamma: float = 0.99
    gae_lambda: float = 0.95
    num_sgd_iters: int = 8
    sgd_minibatch_size: int | Literal["auto"] | None = "auto"
    num_minibatches: int | None = None
    shuffle_minibatches: bool = True
    clip_param: float = 0.2
    dual_clip_param: float | None = None
    vf_clip_param: float | None = None
    vf_coeff: float = 0.5
    entropy_coeff: float = 0.0
    entropy_coeff_schedule: tuple[tuple[int, float], ...] | None = None
    lr: float = 1e-3
    lr_schedule: tuple[tuple[int, float], ...] | None = None
    schedule_kind: Literal["step", "linear"] = "step"
    target_kl_div: float | None = None
    max_grad_norm: float | None = 0.5
    normalize_advantages: bool = True
    normalize_rewards: bool = True
    normalize_observations: bool = False
    accumulate_grads: bool = False
    enable_amp: bool = False
    optimizer_cls: Any = "torch.optim.Adam"
    optimizer_kwargs: dict[str, Any] = field(default_factory=lambda: {"eps": 1e-5})
    model_cls: Any = None
    model_config: dict[str, Any] = field(default_factory=dict)
    distribution_cls: Any = None
    device: str = "auto"
    seed: int | None = None
    env_config: dict[str, Any] = field(default_factory=dict)
    env_kwargs: dict[str, Any] = field(default_factory=dict)
    check_finite_collects: int = 2
    seq_len: int | None = None
    seqs_per_state_reset: int = -1

    @classmethod
    def from_kwargs(cls, **kwargs: Any) -> "HParams":
        """Build from keyword arguments; an unknown name is an error listing close matches."""
        names = [f.name for f in dataclasses.fields(cls)]
        for key in kwargs:
            if key not in names:
                close = close_hparam_names(key)
                hint = f"; did you mean {', '.join(close)}?" if close else ""
                raise TypeError(f"unknown hyper-parameter {key!r}{hint} (valid: {', '.join(names)})")
        return cls(**kwargs)

    @classmethod
    def read_config(cls, hparams: Mapping[str, Any], where: str = "hparams") -> dict[str, Any]:
        """The hyper-parameters of a config file (``rl8 train``'s ``hparams:``, a preset) as
        keyword arguments of :meth:`from_kwargs`: names checked, numeric strings (``"3e-4"``,
        which YAML reads as a string) as numbers, whole floats as ints for int fields.

        Args:
            hparams: ``{name: value}`` as read from YAML.
            where: Where they come from, for the error message (``"preset 'Hopper-v5': hparams"``).

        Raises:
            ValueError: An unknown name (with close matches and the valid names).
        """
        kinds = {f.name: str(f.type) for f in dataclasses.fields(cls)}
        out: dict[str, Any] = {}
        for key, value in hparams.items():
            if key not in kinds:
                raise ValueError(unknown_hparam_message(key, where))
            value = read_numbers(value)
            kind = kinds[key]
            if isinstance(value, float) and value.is_integer() and "int" in kind and "float" not in kind:
                value = int(value)
            out[key] = value
        return out

    @classmethod
    def from_config(cls, hparams: Mapping[str, Any], where: str = "hparams") -> "HParams":
        """Build from the hyper-parameters of a config file (see :meth:`read_config`).

        Args:
            hparams: ``{name: value}`` as read from YAML.
            where: Where they come from, for the error message.

        Raises:
            ValueError: An unknown name or a bad value; the message starts with ``where``.
        """
        kwargs = cls.read_config(hparams, where)
        try:
            return cls.from_kwargs(**kwargs)
        except (TypeError, ValueError) as exc:
            raise ValueError(f"{where}: {exc}") from None

    def replace(self, **changes: Any) -> "HParams":
        """A copy with some fields changed (validated again)."""
        return dataclasses.replace(self, **changes)

    def to_dict(self) -> dict[str, Any]:
        """The fields as a plain dict (classes stay classes)."""
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}

    @property
    def batch_size(self) -> int:
        """Transitions per update: ``num_envs * horizon``."""
        return self.num_envs * self.horizon

    @property
    def minibatch_size(self) -> int:
        """Transitions per minibatch of a feedforward model (see :meth:`minibatch_size_for`)."""
        return self.minibatch_size_for(1)

    def minibatch_size_for(self, seq_len: int) -> int:
        """Transitions per minibatch when the samples are sequences of ``seq_len`` steps.

        Args:
            seq_len: Steps per training sample: 1 for feedforward models, the sequence length
                for recurrent ones (it divides ``horizon``).

        Returns:
            ``sgd_minibatch_size`` when it is an int, the whole buffer when it is ``None``,
            else ``batch_size`` divided by the number of minibatches (``num_minibatches``, or
            the default count, see :class:`HParams`). A size that does not fit the samples is
            a ``ValueError`` that lists the nearest valid values.
        """
        samples = self.batch_size // seq_len
        if self.sgd_minibatch_size is None:
            return self.batch_size
        if self.sgd_minibatch_size != "auto":
            size = self.sgd_minibatch_size
            if size % seq_len or samples % (size // seq_len):
                nearest = _nearest_divisors(samples, size / seq_len)
                what = f"a divisor of num_envs * horizon = {self._batch_formula()}"
                if seq_len > 1:
                    what = (
                        f"a multiple of seq_len={seq_len} (a recurrent model trains on whole "
                        f"sequences) that divides num_envs * horizon = {self._batch_formula()}"
                    )
                raise ValueError(
                    f"hparam sgd_minibatch_size: expected {what}, got {size}; nearest valid: "
                    f"{_or(d * seq_len for d in nearest)} (or leave it at 'auto' and set "
                    "num_minibatches)"
                )
            return size
        if self.num_minibatches is None:
            count = max(d for d in _divisors(samples) if d <= _DEFAULT_NUM_MINIBATCHES)
        else:
            count = self.num_minibatches
            if samples % count:
                unit = "transitions" if seq_len == 1 else f"sequences of seq_len={seq_len} steps"
                raise ValueError(
                    f"hparam num_minibatches: expected a divisor of the {samples} {unit} in the "
                    f"buffer (num_envs * horizon = {self._batch_formula()}), got {count}; "
                    f"nearest valid: {_or(_nearest_divisors(samples, count))}"
                )
        return self.batch_size // count

    def _batch_formula(self) -> str:
        return f"{self.num_envs} * {self.horizon} = {self.batch_size}"

    def resolved_device(self) -> torch.device:
        """The torch device: ``"auto"`` is CUDA when available, else CPU."""
        if self.device == "auto":
            return torch.device("cuda" if torch.cuda.is_available() else "cpu")
        return torch.device(self.device)

    def lr_at(self) -> Schedule:
        """The learning-rate schedule (constant ``lr`` when no schedule is given)."""
        return Schedule(self.lr_schedule or [(0, self.lr)], self.schedule_kind, field="lr_schedule")

    def entropy_coeff_at(self) -> Schedule:
        """The entropy-coefficient schedule (constant when no schedule is given)."""
        return Schedule(
            self.entropy_coeff_schedule or [(0, self.entropy_coeff)],
            self.schedule_kind,
            field="entropy_coeff_schedule",
        )

    # ------------------------------------------------------------------ validation
    def __post_init__(self) -> None:
        def bad(name: str, expected: str) -> None:
            raise ValueError(f"hparam {name}: expected {expected}, got {getattr(self, name)!r}")

        def is_int(v: Any) -> bool:
            return isinstance(v, int) and not isinstance(v, bool)

        def is_num(v: Any) -> bool:
            return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)

        for name in ("num_envs", "horizon", "num_sgd_iters"):
            if not is_int(getattr(self, name)) or getattr(self, name) < 1:
                bad(name, "an int >= 1")
        if not is_int(self.horizons_per_env_reset) or self.horizons_per_env_reset == 0:
            bad("horizons_per_env_reset", "a non-zero int (k > 0: every k collects; k < 0: once)")
        if self.collect_mode not in ("sync", "overlap"):
            bad("collect_mode", "'sync' or 'overlap'")
        for name in ("gamma", "gae_lambda"):
            v = getattr(self, name)
            if not is_num(v) or not 0.0 <= v <= 1.0:
                bad(name, "a number in [0, 1]")
        size = self.sgd_minibatch_size
        if size is not None and size != "auto" and (not is_int(size) or size < 1):
            bad("sgd_minibatch_size", "an int >= 1, 'auto' or None")
        if self.num_minibatches is not None:
            if not is_int(self.num_minibatches) or self.num_minibatches < 1:
                bad("num_minibatches", "an int >= 1 or None")
            if size != "auto":
                raise ValueError(
                    f"hparam num_minibatches: only applies with sgd_minibatch_size='auto', but "
                    f"sgd_minibatch_size={size!r} was given; set one of the two"
                )
        self.minibatch_size_for(1)  # a size or count that does not divide the buffer
        for name in ("clip_param", "lr"):
            v = getattr(self, name)
            if not is_num(v) or v <= 0:
                bad(name, "a finite number > 0")
        if self.dual_clip_param is not None and (not is_num(self.dual_clip_param) or self.dual_clip_param <= 1):
            bad("dual_clip_param", "a number > 1 or None")
        for name in ("vf_clip_param", "target_kl_div", "max_grad_norm"):
            v = getattr(self, name)
            if v is not None and (not is_num(v) or v <= 0):
                bad(name, "a number > 0 or None")
        for name in ("vf_coeff", "entropy_coeff"):
            v = getattr(self, name)
            if not is_num(v) or v < 0:
                bad(name, "a number >= 0")
        if self.schedule_kind not in ("step", "linear"):
            bad("schedule_kind", "'step' or 'linear'")
        for name in ("lr_schedule", "entropy_coeff_schedule"):
            v = getattr(self, name)
            if v is not None:
                points = tuple(tuple(p) for p in v)
                object.__setattr__(self, name, points)
                Schedule(points, self.schedule_kind, field=name)  # validates
                if name == "lr_schedule" and any(p[1] <= 0 for p in points):
                    bad(name, "learning rates > 0")
                if name == "entropy_coeff_schedule" and any(p[1] < 0 for p in points):
                    bad(name, "coefficients >= 0")
        for name in (
            "shuffle_minibatches", "normalize_advantages", "normalize_rewards",
            "normalize_observations", "accumulate_grads", "enable_amp",
        ):
            if not isinstance(getattr(self, name), bool):
                bad(name, "a bool")
        for name in ("optimizer_kwargs", "model_config", "env_config", "env_kwargs"):
            if not isinstance(getattr(self, name), dict):
                bad(name, "a dict")
        if "lr" in self.optimizer_kwargs:
            raise ValueError("hparam optimizer_kwargs: set the learning rate with lr=..., not optimizer_kwargs['lr']")
        # Classes given as objects are checked here; dotted paths when PPO resolves them.
        for name, kind in HPARAM_KINDS.items():
            v = getattr(self, name)
            if v is None and name == "optimizer_cls":
                bad(name, f"{kind.description} or its dotted path")
            if not isinstance(v, str):
                resolve(v, kind, field=f"hparam {name}")
        if not isinstance(self.device, (str, torch.device)):
            bad("device", "'auto', 'cpu', 'cuda', 'cuda:N' or a torch.device")
        if self.device != "auto":
            try:
                dev = torch.device(self.device)
            except (RuntimeError, TypeError):
                bad("device", "'auto', 'cpu', 'cuda', 'cuda:N' or a torch.device")
            problem = missing_cuda_device(dev)
            if problem is not None:
                bad("device", f"a device that exists ({problem})")
        if self.seed is not None and (not is_int(self.seed) or not 0 <= self.seed <= _MAX_SEED):
            bad("seed", "an int in [0, 2**63 - 1] or None")
        if not is_int(self.check_finite_collects) or self.check_finite_collects < -1:
            bad("check_finite_collects", "an int >= -1")
        if self.seq_len is not None:
            if not is_int(self.seq_len) or self.seq_len < 1 or self.horizon % self.seq_len:
                raise ValueError(
                    f"hparam seq_len: expected an int >= 1 that divides horizon={self.horizon}, "
                    f"got {self.seq_len!r}"
                )
        if not is_int(self.seqs_per_state_reset) or self.seqs_per_state_reset == 0:
            bad("seqs_per_state_reset", "a non-zero int (k > 0: every k sequences; k < 0: never)")


def unknown_hparam_message(name: Any, where: str) -> str:
    """The error message for a hyper-parameter ``name`` that :class:`HParams` does not have,
    read at ``where`` (``"--set lr_rate=1"``, ``"hparams"``): its close matches
    (:func:`close_hparam_names`) and every valid name."""
    close = close_hparam_names(str(name))
    hint = f"; did you mean {' or '.join(repr(c) for c in close)}?" if close else ""
    valid = ", ".join(f.name for f in dataclasses.fields(HParams))
    return f"{where}: unknown hyper-parameter {name!r}{hint} (valid: {valid})"


def close_hparam_names(name: str) -> list[str]:
    """The hyper-parameter names that a mistyped or foreign ``name`` may mean: rl8's name for
    another library's (``learning_rate``: ``lr``, ``n_steps``: ``horizon``), then close
    spellings (``gama``: ``gamma``). Empty when none is close."""
    names = [f.name for f in dataclasses.fields(HParams)]
    close = difflib.get_close_matches(str(name), names, n=3)
    other = _OTHER_NAMES.get(str(name).lower())
    return [other, *[c for c in close if c != other]] if other else close
