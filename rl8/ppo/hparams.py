"""PPO's hyper-parameters: one frozen, validated dataclass of fields (type, default, check, doc),
from which messages, the docstring, checkpoints and MLflow params derive (``docs/hparams.md``)."""

from __future__ import annotations

import dataclasses
import difflib
import math
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import torch

from rl8.fields import (
    Check,
    attributes_doc,
    check,
    did_you_mean,
    first_invalid,
    int_at_least,
    is_int,
    is_number,
    one_of,
    optional,
    read_numbers,
    unknown_names_message,
)
from rl8.policies.groups import obs_groups_problem
from rl8.ppo.resolve import HPARAM_KINDS, qualified_name, resolve
from rl8.ppo.rnd import rnd_problem
from rl8.ppo.schedules import Schedule
from rl8.ppo.symmetry import plain_symmetry, symmetry_problem

__all__ = ["HParams", "changed_hparams", "missing_cuda_device", "unknown_hparams_message"]

_MAX_SEED = 2**63 - 1  # seeds are stored as int64
_DEFAULT_NUM_MINIBATCHES = 4  # CleanRL's num_minibatches

#: The names other PPO libraries (SB3, CleanRL) give some hyper-parameters, and rl8's names.
_OTHER_NAMES = {
    "learning_rate": "lr",
    "n_steps": "horizon",
    "num_steps": "horizon",
    "n_envs": "num_envs",
    "batch_size": "sgd_minibatch_size",
    "minibatch_size": "sgd_minibatch_size",
    "n_epochs": "num_sgd_iters",
    "update_epochs": "num_sgd_iters",
    "clip_range": "clip_param",
    "clip_coef": "clip_param",
    "clip_range_vf": "vf_clip_param",
    "ent_coef": "entropy_coeff",
    "vf_coef": "vf_coeff",
    "target_kl": "target_kl_div",
    "norm_adv": "normalize_advantages",
    "normalize_advantage": "normalize_advantages",
    "norm_obs": "normalize_observations",
    "norm_reward": "normalize_rewards",
    "policy_kwargs": "model_config",
}

#: Stable-Baselines3's keywords that no field of rl8 takes, and what rl8 offers instead.
_OTHER_ADVICE = {
    "net_arch": (
        "Stable-Baselines3's net_arch=[64, 64] is model_config={'hiddens': [64, 64]} (the value "
        "network's: 'critic_hiddens')"
    ),
    "activation_fn": (
        "Stable-Baselines3's activation_fn=nn.Tanh is model_config={'activation': 'tanh'} (a name "
        "or an nn.Module class)"
    ),
    "verbose": (
        "PPO prints nothing; Trainer(algo).run() prints a progress line on stderr: Trainer(algo, "
        "progress=False) turns it off, progress_every_s=N sets its pace off a terminal"
    ),
    "tensorboard_log": (
        "rl8 logs to MLflow, not TensorBoard: Trainer(algo, tracking_uri=..., experiment=...) says "
        "where (default: MLFLOW_TRACKING_URI, else sqlite:///mlflow.db), `mlflow ui` shows the "
        "runs (docs/tracking.md)"
    ),
    "use_sde": (
        "rl8 has no gSDE (state-dependent exploration); a Gaussian policy's std is a learned "
        "parameter (the default) or an output of the network: model_config={'state_dependent_std': True}"
    ),
    "sde_sample_freq": (
        "rl8 has no gSDE (state-dependent exploration), so no noise to resample; a Gaussian "
        "policy samples fresh noise at every step"
    ),
}


def missing_cuda_device(device: torch.device) -> str | None:
    """Why the CUDA ``device`` cannot be used on this machine, or ``None`` when it can (and
    for every device that is not CUDA)."""
    if device.type != "cuda":
        return None
    if not torch.cuda.is_available():
        return "CUDA is not available on this machine"
    count = torch.cuda.device_count()
    if device.index is not None and device.index >= count:
        return f"this machine has {count} CUDA device(s), cuda:0 to cuda:{count - 1}"
    return None


def _nearest_divisors(n: int, value: float) -> list[int]:
    """The divisors of ``n`` closest to ``value`` from below and from above (one or two)."""
    small = [d for d in range(1, math.isqrt(n) + 1) if n % d == 0]
    divisors = sorted({*small, *(n // d for d in small)})
    return [*[d for d in divisors if d < value][-1:], *[d for d in divisors if d > value][:1]]


def _nonzero_int(meaning: str) -> Check:
    return check(f"a non-zero int ({meaning})", lambda v: is_int(v) and v != 0)


def _number(expected: str, ok: Callable[[float], bool]) -> Check:
    return check(expected, lambda v: is_number(v) and ok(v))


_BOOL = check("a bool", lambda v: isinstance(v, bool))
_DICT = check("a dict", lambda v: isinstance(v, dict))
_UNIT = _number("a number in [0, 1]", lambda v: 0.0 <= v <= 1.0)
_POSITIVE = _number("a finite number > 0", lambda v: v > 0)
_WEIGHT = _number("a number >= 0", lambda v: v >= 0)


def _schedule(expected: str, ok: Callable[[float], bool]) -> Check:
    """Points of a :class:`~rl8.ppo.schedules.Schedule` whose values satisfy ``ok``, or ``None``."""

    def schedule(points: Any, name: str) -> str | None:
        if points is None:
            return None
        Schedule(points, field=name)  # raises on a bad point
        return None if all(ok(p[1]) for p in points) else expected

    return schedule


def _points(value: Any) -> Any:
    """A schedule as a tuple of tuples (hashable, as in the frozen dataclass), or ``None``."""
    return None if value is None else tuple(tuple(p) for p in value)


def _group_lists(value: Any) -> Any:
    """``obs_groups`` with lists of groups (as checkpoints and YAML store them)."""
    if isinstance(value, Mapping) and all(isinstance(g, (list, tuple)) for g in value.values()):
        return {key: list(groups) for key, groups in value.items()}
    return value


def _class_or_path(value: Any, name: str) -> str | None:
    """A class of kind ``HPARAM_KINDS[name]``, its dotted path, or ``None`` (not for ``optimizer_cls``)."""
    kind = HPARAM_KINDS[name]
    if value is None and name == "optimizer_cls":
        return f"{kind.description} or its dotted path"
    if value is not None and not isinstance(value, str):
        resolve(value, kind, field=f"hparam {name}")  # raises naming the field
    return None


def _optimizer_kwargs(value: Any, name: str) -> str | None:
    if not isinstance(value, dict):
        return "a dict"
    if "lr" in value:
        raise ValueError(f"hparam {name}: set the learning rate with lr=..., not {name}['lr']")
    return None


def _device(value: Any, name: str) -> str | None:
    if value == "auto":
        return None
    try:
        device = torch.device(value) if isinstance(value, (str, torch.device)) else None
    except (RuntimeError, TypeError):
        device = None
    if device is None:
        return "'auto', 'cpu', 'cuda', 'cuda:N' or a torch.device"
    problem = missing_cuda_device(device)
    return None if problem is None else f"a device that exists ({problem})"


def _hparam(default: Any, check: Check, *, doc: str, convert: Callable[[Any], Any] | None = None) -> Any:
    """An :class:`HParams` field (a dict ``default`` copied for each instance; ``convert`` runs before ``check``)."""
    metadata = {"check": check, "doc": doc, "convert": convert}
    if isinstance(default, dict):
        return dataclasses.field(default_factory=lambda: dict(default), metadata=metadata)
    return dataclasses.field(default=default, metadata=metadata)


@dataclass(frozen=True, kw_only=True)
class HParams:
    """Hyper-parameters of :class:`rl8.PPO` (all keyword-only; see ``docs/hparams.md``); a bad
    value is a ``ValueError`` naming the field, what it expects and the value given."""

    num_envs: int = _hparam(256, int_at_least(1), doc="Number of environments simulated in parallel.")
    horizon: int = _hparam(
        32,
        int_at_least(1),
        doc=("Env steps per env between updates (the buffer holds ``num_envs * horizon`` transitions)."),
    )
    horizons_per_env_reset: int = _hparam(
        -1,
        _nonzero_int("k > 0: every k collects; k < 0: once"),
        doc=("``k > 0``: PPO resets every env every ``k`` collects; ``k < 0``: only before the first."),
    )
    collect_mode: Literal["sync", "overlap"] = _hparam(
        "sync",
        one_of("sync", "overlap"),
        doc=(
            '``"sync"``, or ``"overlap"``: the next collect runs in a background thread with a '
            "copy of the policy one update old, while the update runs (``docs/collection.md``)."
        ),
    )
    gamma: float = _hparam(0.99, _UNIT, doc="Discount factor in [0, 1].")
    gae_lambda: float = _hparam(0.95, _UNIT, doc="GAE's lambda in [0, 1].")
    num_sgd_iters: int = _hparam(8, int_at_least(1), doc="Passes (epochs) over the buffer per update.")
    sgd_minibatch_size: int | Literal["auto"] | None = _hparam(
        "auto",
        check("an int >= 1, 'auto' or None", lambda v: v is None or v == "auto" or is_int(v) and v >= 1),
        doc=(
            "Transitions per minibatch, a divisor of ``num_envs * horizon``; ``None``: the whole "
            'buffer; ``"auto"``: the buffer split into ``num_minibatches``.'
        ),
    )
    num_minibatches: int | None = _hparam(
        None,
        optional(int_at_least(1)),
        doc=(
            'With ``sgd_minibatch_size="auto"``: minibatches per pass; ``None``: 4 (CleanRL\'s), or '
            "the largest count below that divides the samples."
        ),
    )
    shuffle_minibatches: bool = _hparam(
        True, _BOOL, doc=("Draw minibatches from a fresh random permutation every pass.")
    )
    clip_param: float = _hparam(0.2, _POSITIVE, doc="PPO's ratio clip epsilon (> 0).")
    dual_clip_param: float | None = _hparam(
        None,
        optional(_number("a number > 1", lambda v: v > 1)),
        doc=(
            "Dual-clip constant c > 1 (Ye et al., 2020) bounding the loss of negative advantages; ``None``: off."
        ),
    )
    vf_clip_param: float | None = _hparam(
        None,
        optional(_number("a number > 0", lambda v: v > 0)),
        doc=(
            "Clip the value change to ``old_value +- vf_clip_param`` (PPO2's value clipping); ``None``: off."
        ),
    )
    vf_coeff: float = _hparam(0.5, _WEIGHT, doc="Weight of the value loss in the total loss.")
    entropy_coeff: float = _hparam(
        0.0, _WEIGHT, doc=("Weight of the entropy bonus (constant unless a schedule is given).")
    )
    entropy_coeff_schedule: tuple[tuple[int, float], ...] | None = _hparam(
        None,
        _schedule("coefficients >= 0", lambda c: c >= 0),
        convert=_points,
        doc="``[(env_steps, coeff), ...]`` overriding ``entropy_coeff``.",
    )
    lr: float = _hparam(
        1e-3,
        _POSITIVE,
        doc=("Learning rate of the optimizer, finite and > 0 (constant unless a schedule is given)."),
    )
    lr_schedule: tuple[tuple[int, float], ...] | None = _hparam(
        None,
        _schedule("learning rates > 0", lambda lr: lr > 0),
        convert=_points,
        doc="``[(env_steps, lr), ...]`` overriding ``lr``.",
    )
    schedule_kind: Literal["step", "linear"] = _hparam(
        "step",
        one_of("step", "linear"),
        doc=('``"step"`` or ``"linear"`` interpolation of both schedules.'),
    )
    target_kl_div: float | None = _hparam(
        None,
        optional(_number("a number > 0", lambda v: v > 0)),
        doc=(
            "Skip the update's remaining minibatches once a minibatch's approximate KL exceeds this; ``None``: never."
        ),
    )
    desired_kl: float | None = _hparam(
        None,
        optional(_POSITIVE),
        doc=(
            "rsl_rl's adaptive learning rate (``schedule=\"adaptive\"``): each minibatch's step divides ``lr`` "
            "by 1.5 when its approximate KL (all ranks' mean) exceeds ``2 * desired_kl``, multiplies it by 1.5 "
            "below ``desired_kl / 2``, within [1e-5, 1e-2], from ``lr`` on (kept in checkpoints); ``None``: off. "
            "Not with ``lr_schedule``."
        ),
    )
    max_grad_norm: float | None = _hparam(
        0.5,
        optional(_number("a number > 0", lambda v: v > 0)),
        doc=("Clip the global gradient norm to this, or ``None``."),
    )
    normalize_advantages: bool = _hparam(
        True,
        _BOOL,
        doc=("Normalise advantages (zero mean, unit std) over ``normalize_advantages_over``."),
    )
    normalize_advantages_over: Literal["minibatch", "rollout"] = _hparam(
        "minibatch",
        one_of("minibatch", "rollout"),
        doc=(
            'What the advantages\' mean and std are taken over: ``"minibatch"`` (each minibatch of '
            'each pass, as SB3 and CleanRL) or ``"rollout"`` (all the update\'s samples, once before '
            "its passes, as rsl_rl 5 by default); across all ranks in data-parallel training. Only "
            "with ``normalize_advantages=True``."
        ),
    )
    normalize_rewards: bool = _hparam(
        True, _BOOL, doc=("Scale rewards by the running std of the discounted return.")
    )
    normalize_observations: bool = _hparam(
        False, _BOOL, doc=("Normalise float observations with running mean/variance.")
    )
    accumulate_grads: bool = _hparam(
        False,
        _BOOL,
        doc=(
            "One optimizer step per pass, on the gradients of all its minibatches (not one per minibatch)."
        ),
    )
    enable_amp: bool = _hparam(
        False,
        _BOOL,
        doc=(
            "Mixed precision: bfloat16 (float16 on CUDA before 8.0) autocast where the device runs "
            "it fast, else float32 with a warning (``PPO.amp_dtype`` says which)."
        ),
    )
    compile: bool = _hparam(
        False,
        _BOOL,
        doc=(
            "``torch.compile`` the rollout step and the update's minibatch step (not with "
            '``collect_mode="overlap"``; ``docs/hparams.md``, Speed).'
        ),
    )
    optimizer_cls: Any = _hparam(
        "torch.optim.Adam",
        _class_or_path,
        doc=('A ``torch.optim.Optimizer`` subclass or its dotted path (``"torch.optim.Adam"``).'),
    )
    optimizer_kwargs: dict[str, Any] = _hparam(
        {"eps": 1e-5},
        _optimizer_kwargs,
        doc=(
            "The optimizer's keyword arguments (not ``lr``); default ``eps=1e-5`` for Adam and AdamW, else ``{}``."
        ),
    )
    model_cls: Any = _hparam(
        None,
        _class_or_path,
        doc=(
            "A :class:`rl8.Model` subclass (:mod:`rl8.policies.models`), its dotted path, or ``None``: the default."
        ),
    )
    model_config: dict[str, Any] = _hparam({}, _DICT, doc="Keyword arguments of the model class.")
    obs_groups: dict[str, list[str]] | None = _hparam(
        None,
        lambda v, name: obs_groups_problem(v),
        convert=_group_lists,
        doc=(
            '``{"actor": [group, ...], "critic": [group, ...]}``: the keys of a ``Dict`` observation that '
            'the actor and the critic read (asymmetric actor-critic; ``model_config["obs_groups"]``); ``None`` '
            "or a missing set: rsl_rl 5's fallbacks (the group named as the set, then ``policy``, then all of it)."
        ),
    )
    distribution_cls: Any = _hparam(
        None,
        _class_or_path,
        doc=("A :class:`rl8.Distribution` subclass, its dotted path, or ``None``: the action space's."),
    )
    device: str = _hparam(
        "auto", _device, doc=('``"auto"`` (CUDA when available, else CPU) or an explicit torch device.')
    )
    seed: int | None = _hparam(
        None,
        optional(check("an int in [0, 2**63 - 1]", lambda v: is_int(v) and 0 <= v <= _MAX_SEED)),
        doc="Seed of torch's RNG and the envs, an int in [0, 2**63 - 1]; ``None``: drawn from the OS.",
    )
    env_config: dict[str, Any] = _hparam(
        {}, _DICT, doc=("Env parameters applied at every env reset (see ``Env.reset``).")
    )
    env_kwargs: dict[str, Any] = _hparam(
        {}, _DICT, doc="Extra keyword arguments for the env's constructor."
    )
    check_finite_collects: int = _hparam(
        2,
        int_at_least(-1),
        doc=(
            "Check observations and rewards for NaN/inf in this many first collects (``-1``: always, ``0``: never)."
        ),
    )
    seq_len: int | None = _hparam(
        None,
        optional(int_at_least(1)),
        doc=(
            "Recurrent models: steps per training sequence, a divisor of ``horizon``; ``None``: the horizon."
        ),
    )
    seqs_per_state_reset: int = _hparam(
        -1,
        _nonzero_int("k > 0: every k sequences; k < 0: never"),
        doc=(
            "Recurrent models: reset the hidden state every ``k`` sequences (``k > 0``) or only at "
            "episode ends and env resets (``k < 0``)."
        ),
    )

    symmetry: dict[str, Any] | None = _hparam(
        None,
        symmetry_problem,
        doc=(
            "rsl_rl 5's ``symmetry_cfg``: ``{'data_augmentation_func': f, 'use_data_augmentation': bool, "
            "'use_mirror_loss': bool, 'mirror_loss_coeff': float}``, ``f`` a function "
            "``f(env=, obs=, actions=) -> (obs, actions)`` with the mirrored copies after the given "
            "rows, or the name it is registered under (``rl8.register``); ``None``: off (``docs/ppo.md``, Symmetry)."
        ),
    )
    rnd: dict[str, Any] | None = _hparam(
        None,
        rnd_problem,
        doc=(
            "rsl_rl 5's ``rnd_cfg``: random network distillation's intrinsic reward, ``{'weight': w, "
            "'weight_schedule': ..., 'learning_rate': lr, 'state_groups': [...], ...}`` "
            "(``docs/ppo.md``, Random network distillation); ``None``: off."
        ),
    )

    # ------------------------------------------------------------------ validation
    def __post_init__(self) -> None:
        invalid = first_invalid(self)
        if invalid is not None:
            raise ValueError(
                f"hparam {invalid.name}: expected {invalid.expected}, got {invalid.value!r}"
            )
        conflicts = {  # hparam: (whether it conflicts with another, the message)
            "num_minibatches": (
                self.num_minibatches is not None and self.sgd_minibatch_size != "auto",
                f"only applies with sgd_minibatch_size='auto', but sgd_minibatch_size="
                f"{self.sgd_minibatch_size!r} was given; set one of the two",
            ),
            "desired_kl": (
                self.desired_kl is not None and self.lr_schedule is not None,
                f"the adaptive learning rate (desired_kl={self.desired_kl}) and lr_schedule both set "
                "the learning rate; set one (rsl_rl's schedule='adaptive' is desired_kl, 'fixed' is a "
                "constant lr)",
            ),
            "compile": (
                self.compile and self.collect_mode == "overlap",
                "compile=True does not work with collect_mode='overlap' (the background rollout runs a "
                "copy of the policy in another thread); set compile=False or collect_mode='sync'",
            ),
            "normalize_advantages_over": (
                not self.normalize_advantages and self.normalize_advantages_over != "minibatch",
                f"only applies with normalize_advantages=True, but normalize_advantages=False was "
                f"given with normalize_advantages_over={self.normalize_advantages_over!r}; set one "
                "of the two",
            ),
            "obs_groups": (
                self.obs_groups is not None and "obs_groups" in self.model_config,
                "also given as model_config['obs_groups']; set one",
            ),
        }
        for name, (conflict, message) in conflicts.items():
            if conflict:
                raise ValueError(f"hparam {name}: {message}")
        self.minibatch_size_for(1)  # a size or count that does not divide the buffer
        if self.seq_len is not None and self.horizon % self.seq_len:
            raise ValueError(
                f"hparam seq_len: expected an int >= 1 that divides horizon={self.horizon}, "
                f"got {self.seq_len!r}"
            )

    # ------------------------------------------------------------------ building
    @classmethod
    def from_kwargs(cls, **kwargs: Any) -> HParams:
        """Build from keyword arguments; unknown names are one ``TypeError`` naming each with what
        it may mean (:func:`unknown_hparams_message`).
        Without ``optimizer_kwargs``, an optimizer other than Adam and AdamW gets its own
        defaults (``{}``), not Adam's ``eps``."""
        names = [f.name for f in dataclasses.fields(cls)]
        unknown = [key for key in kwargs if key not in names]
        if unknown:
            raise TypeError(unknown_hparams_message(unknown, valid=names))
        optimizer = kwargs.get("optimizer_cls", "Adam")
        adam = (
            optimizer.rpartition(".")[2] in ("Adam", "AdamW")
            if isinstance(optimizer, str)
            else isinstance(optimizer, type)
            and issubclass(optimizer, (torch.optim.Adam, torch.optim.AdamW))
        )
        if "optimizer_kwargs" not in kwargs and not adam:
            kwargs["optimizer_kwargs"] = {}
        return cls(**kwargs)

    @classmethod
    def read_config(cls, hparams: Mapping[str, Any], where: str = "hparams") -> dict[str, Any]:
        """The hyper-parameters of a config file, ``hparams`` (``{name: value}`` as read from YAML),
        as keyword arguments of :meth:`from_kwargs`: names checked (a ``ValueError`` naming ``where``
        they come from, ``"preset 'Hopper-v5': hparams"``), numbers read by :func:`~rl8.fields.read_numbers`."""
        kinds = {f.name: str(f.type) for f in dataclasses.fields(cls)}
        unknown = [key for key in hparams if key not in kinds]
        if unknown:
            raise ValueError(unknown_hparams_message(unknown, where, list(kinds)))
        out: dict[str, Any] = {}
        for key, value in hparams.items():
            whole = "int" in kinds[key] and "float" not in kinds[key]  # an int field
            out[key] = read_numbers(value, whole_as_int=whole)
        return out

    @classmethod
    def from_config(cls, hparams: Mapping[str, Any], where: str = "hparams") -> HParams:
        """Build from the hyper-parameters of a config file (arguments of :meth:`read_config`);
        an unknown name or bad value is a ``ValueError`` starting with ``where``."""
        kwargs = cls.read_config(hparams, where)
        try:
            return cls.from_kwargs(**kwargs)
        except (TypeError, ValueError) as exc:
            raise ValueError(f"{where}: {exc}") from None

    def replace(self, **changes: Any) -> HParams:
        """A copy with some fields changed (validated again)."""
        return dataclasses.replace(self, **changes)

    def to_dict(self) -> dict[str, Any]:
        """The fields as a plain dict (classes stay classes)."""
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}

    def to_plain(self) -> dict[str, Any]:
        """The fields as plain values (classes as dotted paths), as checkpoints and MLflow store
        them; :meth:`from_config` reads them back."""
        out = self.to_dict()
        for key in HPARAM_KINDS:
            if out[key] is not None and not isinstance(out[key], str):
                out[key] = qualified_name(out[key])
        out["device"] = str(self.device)
        out["symmetry"] = plain_symmetry(self.symmetry)
        return out

    # ------------------------------------------------------------------ derived values
    @property
    def batch_size(self) -> int:
        """Transitions per update: ``num_envs * horizon``."""
        return self.num_envs * self.horizon

    @property
    def minibatch_size(self) -> int:
        """Transitions per minibatch of a feedforward model (see :meth:`minibatch_size_for`)."""
        return self.minibatch_size_for(1)

    def minibatch_size_for(self, seq_len: int) -> int:
        """Transitions per minibatch when the samples are sequences of ``seq_len`` steps (a divisor
        of ``horizon``; 1 for feedforward models); a size that does not fit is a ``ValueError``
        naming the nearest."""
        size, count = self.sgd_minibatch_size, self.num_minibatches
        samples = self.batch_size // seq_len  # training samples: transitions or sequences
        formula = f"{self.num_envs} * {self.horizon} = {self.batch_size}"
        if size is None:
            return self.batch_size
        if size == "auto":
            if count is None:
                count = max(d for d in range(1, _DEFAULT_NUM_MINIBATCHES + 1) if samples % d == 0)
            elif samples % count:
                unit = "transitions" if seq_len == 1 else f"sequences of seq_len={seq_len} steps"
                raise ValueError(
                    f"hparam num_minibatches: expected a divisor of the {samples} {unit} in the "
                    f"buffer (num_envs * horizon = {formula}), got {count}; "
                    f"nearest valid: {' or '.join(map(str, _nearest_divisors(samples, count)))}"
                )
            return self.batch_size // count
        if size % seq_len or samples % (size // seq_len):
            what = f"a divisor of num_envs * horizon = {formula}"
            if seq_len > 1:
                what = (
                    f"a multiple of seq_len={seq_len} (a recurrent model trains on whole "
                    f"sequences) that divides num_envs * horizon = {formula}"
                )
            raise ValueError(
                f"hparam sgd_minibatch_size: expected {what}, got {size}; nearest valid: "
                f"{' or '.join(str(d * seq_len) for d in _nearest_divisors(samples, size / seq_len))} (or leave "
                "it at 'auto' and set num_minibatches)"
            )
        return size

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
        points = self.entropy_coeff_schedule or [(0, self.entropy_coeff)]
        return Schedule(points, self.schedule_kind, field="entropy_coeff_schedule")


HParams.__doc__ = (HParams.__doc__ or "") + attributes_doc(HParams)


def unknown_hparams_message(
    names: Sequence[Any], where: str | None = None, valid: Sequence[str] | None = None
) -> str:
    """The error message for unknown hyper-parameter ``names`` (read at ``where``, such as
    ``"--set lr_rate=1"``), with every valid name and, for each, what it may mean: rl8's way for
    another library's keyword (``net_arch``: ``model_config={'hiddens': ...}``), rl8's name for
    another library's name (``n_steps``: ``horizon``), or close spellings.

    Args:
        names: The unknown names given.
        where: Where they were read, the message's prefix (``None``: no prefix).
        valid: The valid names (a subclass's fields, such as Distillation's ``loss_type``);
            ``None``: :class:`HParams`' fields.
    """
    if valid is None:
        valid = [f.name for f in dataclasses.fields(HParams)]
    valid = list(valid)
    message = unknown_names_message("hyper-parameter", {n: _meaning(n, valid) for n in names}, valid)
    return message if where is None else f"{where}: {message}"


def _meaning(name: Any, valid: list[str]) -> str:
    """What the unknown hyper-parameter ``name`` may mean (``"did you mean 'lr'?"``), or ``""``."""
    key = str(name).lower()
    if key in _OTHER_ADVICE:
        return _OTHER_ADVICE[key]
    close = difflib.get_close_matches(str(name), valid, n=3)
    other = _OTHER_NAMES.get(key)
    hint = did_you_mean(name, close=[other, *[c for c in close if c != other]] if other else close)
    return hint.removeprefix("; ")


def changed_hparams(
    stored: Mapping[str, Any], given: Mapping[str, Any], *, may_change: Collection[str] = ()
) -> dict[str, tuple[Any, Any]]:
    """The hyper-parameters of ``given`` that differ from a checkpoint's ``stored`` ones (what a
    resume must refuse): ``{name: (stored value, given value)}``, in ``given``'s order.

    Args:
        stored: A checkpoint's hyper-parameters (plain values); a name it lacks (a checkpoint
            older than the hyper-parameter) has its default.
        given: The hyper-parameters the resume would use, in the same form.
        may_change: Names that may differ (``device``: the machine, not the model).
    """
    saved = {**HParams().to_plain(), **stored}
    return {
        name: (saved.get(name), value)
        for name, value in given.items()
        if name not in may_change and value != saved.get(name)
    }
