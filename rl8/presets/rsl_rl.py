"""rsl_rl runner configs as rl8 hyper-parameters: :func:`from_rsl_rl` reads Isaac Lab's and
mjlab's ``RslRlOnPolicyRunnerCfg`` as a dict or YAML file (rsl_rl 5's ``actor``/``critic``
sections, or the older ``policy`` section) and says what it could not map (``docs/rsl_rl.md``)."""

from __future__ import annotations

import os
import warnings
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, NamedTuple

import yaml

from rl8.fields import is_int
from rl8.policies.models import ACTIVATIONS
from rl8.training.conditions import HitsUpperBound

__all__ = [
    "RslRlConfig",
    "RslRlConfigWarning",
    "from_rsl_rl",
    "rsl_rl_run_args",
    "rsl_rl_teacher_args",
]

#: rsl_rl 5 PPO's defaults, for the algorithm fields a config leaves out.
_PPO_DEFAULTS = {
    "class_name": "PPO",
    "optimizer": "adam",
    "learning_rate": 1e-3,
    "num_learning_epochs": 5,
    "num_mini_batches": 4,
    "schedule": "adaptive",
    "desired_kl": 0.01,
    "value_loss_coef": 1.0,
    "clip_param": 0.2,
    "use_clipped_value_loss": True,
    "entropy_coef": 0.01,
    "gamma": 0.99,
    "lam": 0.95,
    "max_grad_norm": 1.0,
    "normalize_advantage_per_mini_batch": False,
}
#: Runner fields of bookkeeping (logging, saving, resuming), which rl8's Trainer has its own options for.
_BOOKKEEPING = {
    "save_interval",
    "experiment_name",
    "run_name",
    "logger",
    "wandb_project",
    "neptune_project",
    "wandb_tags",
    "resume",
    "load_run",
    "load_checkpoint",
    "upload_model",
    "check_for_nan",
    "multi_gpu",
}
#: Deprecated runner fields that Isaac Lab 3.0 clears for rsl_rl 5 (``handle_deprecated_rsl_rl_cfg``
#: sets them to ``dataclasses.MISSING``), which its ``to_dict`` writes as ``{}``: read as absent.
_CLEARED = ("policy", "empirical_normalization")
_ACTIVATION_NAMES = {"lrelu": "leaky_relu", "swish": "silu"}  # rsl_rl's names that rl8 spells otherwise
_OPTIMIZERS = {
    "adam": "torch.optim.Adam",
    "adamw": "torch.optim.AdamW",
    "sgd": "torch.optim.SGD",
    "rmsprop": "torch.optim.RMSprop",
}
_OPTIMIZER = ("one of " + ", ".join(_OPTIMIZERS), lambda v: v in _OPTIMIZERS)
_MLP_CLASSES = {"MLPModel", "ActorCritic"}
#: rsl_rl 5 Distillation's defaults, for the algorithm fields a DistillationRunner config leaves out.
_DISTILLATION_DEFAULTS = {
    "class_name": "Distillation",
    "optimizer": "adam",
    "learning_rate": 1e-3,
    "num_learning_epochs": 1,
    "gradient_length": 15,
    "max_grad_norm": None,
    "loss_type": "mse",
}
_RNN_CLASSES = {"lstm": "rl8.policies.recurrent.LSTMModel", "gru": "rl8.policies.recurrent.GRUModel"}
_MISSING = object()


class RslRlConfigWarning(UserWarning):
    """Fields of an rsl_rl config that :func:`from_rsl_rl` could not map."""


class RslRlConfig(NamedTuple):
    """What :func:`from_rsl_rl` returns: ``hparams, unmapped, run_args = from_rsl_rl(cfg)``, for
    ``Trainer(PPO(env, **hparams)).run(**run_args)``.

    Attributes:
        hparams: Keyword arguments of ``PPO(env, **hparams)``.
        unmapped: ``"field=value (why)"`` for each field that changes training but has no rl8
            counterpart (also warned as :class:`RslRlConfigWarning`).
        run_args: Keyword arguments of :meth:`rl8.Trainer.run` (:func:`rsl_rl_run_args`): the
            runner's ``max_iterations`` as the run's stop, ``{}`` when the config has none.
    """

    hparams: dict[str, Any]
    unmapped: list[str]
    run_args: dict[str, Any]


_NUMBER = ("a number", lambda v: isinstance(v, (int, float)) and not isinstance(v, bool))
_INT = ("an int", is_int)
_BOOL = ("a bool", lambda v: isinstance(v, bool))
_STR = ("a str", lambda v: isinstance(v, str))
_DIMS = (
    "a list of ints >= 1",
    lambda v: isinstance(v, (list, tuple)) and bool(v) and all(is_int(d) and d >= 1 for d in v),
)
_POSITIVE_INT = ("an int >= 1", lambda v: is_int(v) and v >= 1)
_DICT = ("a dict", lambda v: isinstance(v, Mapping))
_ANY = ("anything", lambda v: True)


def _optional(kind: tuple[str, Callable[[Any], bool]]) -> tuple[str, Callable[[Any], bool]]:
    return f"{kind[0]} or None", lambda v: v is None or kind[1](v)


class _Section:
    """A section of the config whose fields are taken (checked) one by one; what is left is unmapped."""

    def __init__(self, fields: Any, where: str, defaults: Mapping[str, Any] | None = None) -> None:
        if not isinstance(fields, Mapping):
            raise ValueError(f"rsl_rl config {where}: expected a dict, got {fields!r}")
        self.fields, self.where = {**(defaults or {}), **fields}, where

    def take(self, key: str, kind: tuple[str, Callable[[Any], bool]], default: Any = _MISSING) -> Any:
        if key not in self.fields:
            if default is _MISSING:
                raise ValueError(f"rsl_rl config {self.name(key)}: missing (expected {kind[0]})")
            return default
        value = self.fields.pop(key)
        if not kind[1](value):
            raise ValueError(f"rsl_rl config {self.name(key)}: expected {kind[0]}, got {value!r}")
        return value

    def name(self, key: str) -> str:
        return f"{self.where}.{key}" if self.where else key

    def rest(self) -> list[str]:
        return [f"{self.name(k)}={v!r} (no rl8 counterpart)" for k, v in self.fields.items()]


class _TupleLoader(yaml.SafeLoader):
    """``yaml.SafeLoader`` that also reads the ``!!python/tuple`` lists of Isaac Lab's ``agent.yaml``."""


_TupleLoader.add_constructor(
    "tag:yaml.org,2002:python/tuple", lambda loader, node: loader.construct_sequence(node)
)


def _read(cfg: Mapping[str, Any] | str | os.PathLike[str]) -> Mapping[str, Any]:
    if isinstance(cfg, Mapping):
        return cfg
    if not isinstance(cfg, (str, os.PathLike)):
        raise ValueError(
            f"from_rsl_rl: expected a dict or the path of a YAML file, got {type(cfg).__name__}"
        )
    try:
        data = yaml.load(Path(cfg).read_text(), Loader=_TupleLoader)  # noqa: S506 (a SafeLoader subclass)
    except (OSError, yaml.YAMLError) as err:
        raise ValueError(f"from_rsl_rl: cannot read {str(cfg)!r}: {err}") from None
    if not isinstance(data, Mapping):
        raise ValueError(
            f"from_rsl_rl: {str(cfg)!r} holds {type(data).__name__}, not a dict of runner fields"
        )
    return data


def _model_sections(runner: _Section) -> tuple[_Section, _Section]:
    """The actor's and the critic's fields in rsl_rl 5's names (``hidden_dims``,
    ``obs_normalization``...), from ``actor``/``critic`` or from the older ``policy`` section."""
    if "policy" not in runner.fields:
        return _Section(runner.take("actor", _DICT), "actor"), _Section(
            runner.take("critic", _DICT), "critic"
        )
    policy = _Section(runner.take("policy", _DICT), "policy")
    norm = bool(runner.take("empirical_normalization", _optional(_BOOL), None))
    shared = {
        "class_name": policy.fields.pop("class_name", "ActorCritic"),
        "activation": policy.fields.pop("activation", "elu"),
    }
    models = {
        name: {
            **shared,
            "hidden_dims": policy.fields.pop(f"{name}_hidden_dims", [256, 256, 256]),
            "obs_normalization": policy.fields.pop(f"{name}_obs_normalization", norm),
        }
        for name in ("actor", "critic")
    }
    # the rest of the policy section (the std fields among it) goes with the actor's
    return _Section({**models["actor"], **policy.fields}, "policy"), _Section(models["critic"], "policy")


def _activation(model: _Section) -> str:
    name = model.take("activation", _STR, "elu")
    rl8_name = _ACTIVATION_NAMES.get(name, name)
    if rl8_name not in ACTIVATIONS:
        raise ValueError(
            f"rsl_rl config {model.name('activation')}: rl8 has no activation {name!r} (it has "
            f"{sorted([*ACTIVATIONS, *_ACTIVATION_NAMES])})"
        )
    return rl8_name


def _distribution(actor: _Section, config: dict[str, Any], unmapped: list[str]) -> None:
    """The actor's output distribution (rsl_rl 5's ``distribution_cfg`` or rsl_rl 4's fields)
    as ``model_config`` entries."""
    dist = actor.take("distribution_cfg", _optional(_DICT), None)
    if dist is not None:
        dist = _Section(dist, actor.name("distribution_cfg"))
    else:  # rsl_rl 4's fields of the actor
        actor.take("stochastic", _BOOL, True)
        dist = _Section(
            {
                "class_name": "HeteroscedasticGaussianDistribution"
                if actor.take("state_dependent_std", _BOOL, False)
                else "GaussianDistribution",
                "init_std": actor.take("init_noise_std", _NUMBER, 1.0),
                "std_type": actor.take("noise_std_type", _STR, "scalar"),
            },
            actor.where,
        )
    kind = dist.take("class_name", _STR, "GaussianDistribution").rsplit(":", 1)[-1].rsplit(".", 1)[-1]
    if kind not in ("GaussianDistribution", "HeteroscedasticGaussianDistribution"):
        unmapped.append(
            f"{dist.name('class_name')}={kind!r} (rl8 picks the distribution from the action "
            "space; set distribution_cls)"
        )
        unmapped.extend(dist.rest())
        return
    init_std = dist.take("init_std", _NUMBER, 1.0)
    std_type = dist.take("std_type", ("'scalar' or 'log'", lambda v: v in ("scalar", "log")), "scalar")
    if kind == "HeteroscedasticGaussianDistribution":
        config["state_dependent_std"] = True
        unmapped.append(
            f"{dist.name('init_std')}={init_std!r} (rl8's state-dependent log-std head starts "
            "near 0: std 1)"
        )
    else:
        config.update(init_noise_std=init_std, noise_std_type=std_type)
    if dist.take("std_range", _ANY, (1e-6, 1e6)) not in ([1e-6, 1e6], (1e-6, 1e6)):
        unmapped.append(f"{dist.name('std_range')} (rl8 clamps the log-std to [-20, 2])")
    if not dist.take("learn_std", _BOOL, True):
        unmapped.append(f"{dist.name('learn_std')}=False (rl8 learns the std)")
    unmapped.extend(dist.rest())


def _obs_groups(
    runner: _Section, unmapped: list[str]
) -> tuple[dict[str, list[str]] | None, list[str] | None]:
    """The actor's and critic's sets as hparam ``obs_groups``, and the ``rnd_state`` set (RND's)."""
    groups = runner.take("obs_groups", _optional(_DICT), None)
    out, rnd_state = {}, None
    for name, keys in (groups or {}).items():
        rl8_name = {"policy": "actor"}.get(name, name)  # rsl_rl 3's name of the actor's set
        if rl8_name not in ("actor", "critic", "rnd_state"):
            unmapped.append(f"obs_groups.{name}={keys!r} (rl8 has the sets actor, critic and rnd_state)")
            continue
        if not (isinstance(keys, (list, tuple)) and keys and all(isinstance(k, str) for k in keys)):
            raise ValueError(
                f"rsl_rl config obs_groups.{name}: expected a non-empty list of group names, got {keys!r}"
            )
        if rl8_name == "rnd_state":
            rnd_state = list(keys)
        else:
            out[rl8_name] = list(keys)
    return out or None, rnd_state


def _symmetry(cfg: Mapping[str, Any] | None, unmapped: list[str]) -> dict[str, Any] | None:
    """rsl_rl's ``symmetry_cfg`` as hparam ``symmetry``: the function itself, or the name a YAML
    file gives it (``"module:function"`` as ``"module.function"``, which PPO looks up among the
    names registered with ``rl8.register``; nothing is imported)."""
    if cfg is None:
        return None
    section = _Section(cfg, "algorithm.symmetry_cfg")
    section.fields.pop("env", None)  # rsl_rl's runner puts the env there; PPO passes its own
    func = section.take(
        "data_augmentation_func", ("a function or its name", lambda v: callable(v) or isinstance(v, str))
    )
    symmetry = {
        "data_augmentation_func": func.replace(":", ".") if isinstance(func, str) else func,
        "use_data_augmentation": section.take("use_data_augmentation", _BOOL, False),
        "use_mirror_loss": section.take("use_mirror_loss", _BOOL, False),
        "mirror_loss_coeff": section.take("mirror_loss_coeff", _NUMBER, 0.0),
    }
    unmapped.extend(section.rest())
    return symmetry


#: rsl_rl's ``rnd_cfg`` fields, each with its kind; hparam ``rnd`` takes them by the same names.
_RND_FIELDS = {
    "weight": _NUMBER,
    "weight_schedule": _optional(_DICT),
    "reward_normalization": _BOOL,
    "state_normalization": _BOOL,
    "learning_rate": _NUMBER,
    "num_outputs": _POSITIVE_INT,
    "predictor_hidden_dims": ("a list of ints", lambda v: isinstance(v, (list, tuple))),
    "target_hidden_dims": ("a list of ints", lambda v: isinstance(v, (list, tuple))),
    "activation": _STR,
}


def _rnd(
    cfg: Mapping[str, Any] | None, rnd_state: list[str] | None, unmapped: list[str]
) -> dict[str, Any] | None:
    """rsl_rl's ``rnd_cfg`` as hparam ``rnd``: its fields by their names, the ``rnd_state``
    observation set as ``state_groups``, and the weight scaled by the env's ``step_dt`` as
    rsl_rl scales it (``scale_by_step_dt``)."""
    if cfg is None:
        return None
    section = _Section(cfg, "algorithm.rnd_cfg")
    for key in ("num_states", "obs_groups"):  # filled in by rsl_rl's runner from the env
        section.fields.pop(key, None)
    rnd = {key: section.take(key, kind) for key, kind in _RND_FIELDS.items() if key in section.fields}
    for key in ("predictor_hidden_dims", "target_hidden_dims"):
        if key in rnd:
            rnd[key] = list(rnd[key])
    if rnd.get("weight_schedule") is not None:
        rnd["weight_schedule"] = dict(rnd["weight_schedule"])
    rnd.update(state_groups=rnd_state, scale_by_step_dt=True)
    unmapped.extend(section.rest())
    return rnd


def from_rsl_rl(cfg: Mapping[str, Any] | str | os.PathLike[str]) -> RslRlConfig:
    """rl8 hyper-parameters of an rsl_rl ``OnPolicyRunner`` config, and what could not be
    mapped (warned as :class:`RslRlConfigWarning`); the field-by-field table is ``docs/rsl_rl.md``.
    Fields the config leaves out take rsl_rl 5's defaults; bookkeeping fields (logging, saving)
    are left to rl8's Trainer; ``max_iterations`` is the stop of ``run_args``
    (:func:`rsl_rl_run_args`), so that ``Trainer(PPO(env, **hparams)).run(**run_args)`` runs
    as long as rsl_rl's runner.

    Args:
        cfg: The runner config as a dict (``dataclasses.asdict`` of Isaac Lab's or mjlab's
            ``RslRlOnPolicyRunnerCfg``, or rsl_rl's ``train_cfg``), or the path of a YAML file of it
            (Isaac Lab's ``params/agent.yaml``).

    Raises:
        ValueError: A field of the wrong type (naming it, the expected and the given value), an
            activation rl8 lacks, or an algorithm other than PPO.
    """
    runner = _Section(_read(cfg), "")
    for key in _BOOKKEEPING:
        runner.fields.pop(key, None)
    for key in _CLEARED:
        if runner.fields.get(key) == {}:
            del runner.fields[key]
    run_args = _run_args(runner)
    if runner.fields.get("class_name") == "DistillationRunner":
        return _from_distillation(runner, run_args)
    runner_cls = runner.take("class_name", _STR, "OnPolicyRunner")
    algo = _Section(runner.take("algorithm", _DICT), "algorithm", _PPO_DEFAULTS)
    algo_cls = algo.take("class_name", _STR)
    if (runner_cls, algo_cls) != ("OnPolicyRunner", "PPO"):
        raise ValueError(
            f"rsl_rl config class_name: rl8 runs PPO (OnPolicyRunner) and Distillation "
            f"(DistillationRunner), got {runner_cls!r} running {algo_cls!r}"
        )
    unmapped: list[str] = []
    actor, critic = _model_sections(runner)
    optimizer = _OPTIMIZERS[algo.take("optimizer", _OPTIMIZER)]
    hparams: dict[str, Any] = {
        "horizon": runner.take("num_steps_per_env", _INT),
        "lr": algo.take("learning_rate", _NUMBER),
        "num_sgd_iters": algo.take("num_learning_epochs", _INT),
        "num_minibatches": algo.take("num_mini_batches", _INT),
        "clip_param": algo.take("clip_param", _NUMBER),
        "entropy_coeff": algo.take("entropy_coef", _NUMBER),
        "vf_coeff": 2.0 * algo.take("value_loss_coef", _NUMBER),  # rsl_rl's value loss has no 1/2
        "max_grad_norm": algo.take("max_grad_norm", _optional(_NUMBER)),
        "gamma": algo.take("gamma", _NUMBER),
        "gae_lambda": algo.take("lam", _NUMBER),
        "optimizer_cls": optimizer,
        "optimizer_kwargs": {},  # torch's defaults, as rsl_rl
        "normalize_rewards": False,  # rsl_rl has no reward normalisation
    }
    hparams["vf_clip_param"] = (
        hparams["clip_param"] if algo.take("use_clipped_value_loss", _BOOL) else None
    )
    schedule = algo.take("schedule", ("'adaptive' or 'fixed'", lambda v: v in ("adaptive", "fixed")))
    desired_kl = algo.take("desired_kl", _optional(_NUMBER))
    hparams["desired_kl"] = desired_kl if schedule == "adaptive" else None
    # rsl_rl always normalises advantages: per minibatch, or (its default) over the whole rollout
    per_minibatch = algo.take("normalize_advantage_per_mini_batch", _BOOL)
    hparams["normalize_advantages"] = True
    hparams["normalize_advantages_over"] = "minibatch" if per_minibatch else "rollout"
    share_cnn_encoders = algo.take("share_cnn_encoders", _ANY, False)
    if share_cnn_encoders:
        unmapped.append(f"algorithm.share_cnn_encoders={share_cnn_encoders!r} (no rl8 counterpart)")
    if "seed" in runner.fields:
        hparams["seed"] = runner.take("seed", _INT)
    if runner.take("torch_compile_mode", _optional(_STR), None) is not None:
        hparams["compile"] = True
    obs_groups, rnd_state = _obs_groups(runner, unmapped)
    if obs_groups is not None:
        hparams["obs_groups"] = obs_groups
    symmetry = _symmetry(algo.take("symmetry_cfg", _optional(_DICT), None), unmapped)
    if symmetry is not None:
        hparams["symmetry"] = symmetry
    rnd = _rnd(algo.take("rnd_cfg", _optional(_DICT), None), rnd_state, unmapped)
    if rnd is not None:
        hparams["rnd"] = rnd
    clip_actions = runner.take("clip_actions", _optional(_NUMBER), None)
    if clip_actions is not None:
        unmapped.append(
            f"clip_actions={clip_actions!r} (rl8 clips actions to the action space's bounds)"
        )

    config: dict[str, Any] = {"ortho_init": False}  # torch's default init, as rsl_rl's MLPs
    for model in (actor, critic):
        kind = model.take("class_name", _STR, "MLPModel").rsplit(":", 1)[-1].rsplit(".", 1)[-1]
        if kind not in _MLP_CLASSES:
            unmapped.append(
                f"{model.name('class_name')}={kind!r} (rl8 builds its MLPModel; set model_cls)"
            )
        for key, off in (("rnn_type", None), ("cnn_cfg", None)):
            if model.take(key, _ANY, off) != off:
                unmapped.append(f"{model.name(key)} (rl8 builds its MLPModel; set model_cls)")
        for key in ("rnn_hidden_dim", "rnn_num_layers"):
            model.fields.pop(key, None)
    config["hiddens"] = list(actor.take("hidden_dims", _DIMS, [256, 256, 256]))
    critic_hiddens = list(critic.take("hidden_dims", _DIMS, [256, 256, 256]))
    if critic_hiddens != config["hiddens"]:
        config["critic_hiddens"] = critic_hiddens
    config["activation"] = _activation(actor)
    if _activation(critic) != config["activation"]:
        unmapped.append(f"critic.activation (rl8 uses the actor's, {config['activation']!r}, for both)")
    norms = [model.take("obs_normalization", _BOOL, False) for model in (actor, critic)]
    hparams["normalize_observations"] = any(norms)
    if norms[0] != norms[1]:
        unmapped.append(
            f"obs_normalization actor={norms[0]}, critic={norms[1]} (rl8 normalises every group "
            "alike: on for both)"
        )
    _distribution(actor, config, unmapped)
    critic.take("distribution_cfg", _ANY, None)
    critic.take("stochastic", _ANY, None)
    hparams["model_config"] = config
    if "device" in runner.fields:
        unmapped.append(
            f"device={runner.fields.pop('device')!r} (rl8's hparam device; PPO follows the env's)"
        )
    return _config(hparams, unmapped, run_args, (runner, algo, actor, critic), stacklevel=3)


def _config(
    hparams: dict[str, Any],
    unmapped: list[str],
    run_args: dict[str, Any],
    sections: tuple[_Section, ...],
    stacklevel: int,
) -> RslRlConfig:
    """The :class:`RslRlConfig` of a read config: the fields left in ``sections`` (none of them
    read) join ``unmapped``, and one :class:`RslRlConfigWarning` lists them all; ``stacklevel``
    points the warning at the caller of :func:`from_rsl_rl`."""
    for section in sections:
        unmapped.extend(section.rest())
    if unmapped:
        warnings.warn(
            "from_rsl_rl: not mapped: " + "; ".join(unmapped), RslRlConfigWarning, stacklevel=stacklevel
        )
    return RslRlConfig(hparams, unmapped, run_args)


def rsl_rl_run_args(cfg: Mapping[str, Any] | str | os.PathLike[str]) -> dict[str, Any]:
    """The :meth:`rl8.Trainer.run` arguments of the rsl_rl config ``cfg`` (as for
    :func:`from_rsl_rl`, whose ``run_args`` they are): ``max_iterations`` as a stop after that
    many PPO updates, ``HitsUpperBound("algorithm/steps", max_iterations)`` (one rsl_rl iteration
    is one collect and one update: ``max_iterations * num_steps_per_env * num_envs`` env steps);
    ``{}`` without ``max_iterations``.

    Raises:
        ValueError: ``max_iterations`` that is not an int >= 1 (naming it and the value).
    """
    return _run_args(_Section(_read(cfg), ""))


def _run_args(runner: _Section) -> dict[str, Any]:
    """The :meth:`rl8.Trainer.run` arguments of the runner fields (``max_iterations`` taken)."""
    max_iterations = runner.take("max_iterations", _optional(_POSITIVE_INT), None)
    return (
        {}
        if max_iterations is None
        else {"stop_conditions": [HitsUpperBound("algorithm/steps", max_iterations)]}
    )


def _student_teacher_sections(runner: _Section) -> tuple[_Section, _Section]:
    """The student's and the teacher's fields in rsl_rl 5's names, from ``student``/``teacher``
    or from the older ``policy`` section (``StudentTeacher``, ``StudentTeacherRecurrent``)."""
    if "policy" not in runner.fields:
        return _Section(runner.take("student", _DICT), "student"), _Section(
            runner.take("teacher", _DICT), "teacher"
        )
    policy = _Section(runner.take("policy", _DICT), "policy")
    kind = policy.take("class_name", _STR, "StudentTeacher").rsplit(".", 1)[-1]
    if kind not in ("StudentTeacher", "StudentTeacherRecurrent"):
        raise ValueError(
            f"rsl_rl config policy.class_name: expected 'StudentTeacher' or "
            f"'StudentTeacherRecurrent' in a DistillationRunner config, got {kind!r}"
        )
    activation = policy.fields.pop("activation", "elu")
    student = {
        "class_name": "RNNModel" if kind == "StudentTeacherRecurrent" else "MLPModel",
        "hidden_dims": policy.fields.pop("student_hidden_dims", [256, 256, 256]),
        "activation": activation,
        "obs_normalization": policy.fields.pop("student_obs_normalization", False),
    }
    teacher = {
        "hidden_dims": policy.fields.pop("teacher_hidden_dims", [256, 256, 256]),
        "activation": activation,
        "obs_normalization": policy.fields.pop("teacher_obs_normalization", False),
    }
    teacher_recurrent = policy.fields.pop("teacher_recurrent", False)
    if teacher_recurrent is not False:
        raise ValueError(
            f"rsl_rl config policy.teacher_recurrent: expected False (rl8's Distillation takes a "
            f"feedforward teacher; the student may be recurrent), got {teacher_recurrent!r}"
        )
    for key in ("rnn_type", "rnn_hidden_dim", "rnn_num_layers"):
        if key in policy.fields:
            student[key] = policy.fields.pop(key)
    # the rest (the std fields among it) goes with the student's
    return _Section({**student, **policy.fields}, "policy"), _Section(teacher, "policy")


def _student_model(student: _Section, hparams: dict[str, Any], unmapped: list[str]) -> None:
    """The student's model as ``model_cls``/``model_config``: rl8's MLPModel, or for rsl_rl's
    ``RNNModel`` its LSTMModel or GRUModel."""
    kind = student.take("class_name", _STR, "MLPModel").rsplit(":", 1)[-1].rsplit(".", 1)[-1]
    config: dict[str, Any] = {"ortho_init": False, "activation": _activation(student)}
    hiddens = list(student.take("hidden_dims", _DIMS, [256, 256, 256]))
    hparams["normalize_observations"] = student.take("obs_normalization", _BOOL, False)
    if kind == "RNNModel":
        rnn = student.take("rnn_type", ("'lstm' or 'gru'", lambda v: v in _RNN_CLASSES), "lstm")
        hparams["model_cls"] = _RNN_CLASSES[rnn]
        config["hidden_size"] = student.take("rnn_hidden_dim", _POSITIVE_INT, 256)
        config["num_layers"] = student.take("rnn_num_layers", _POSITIVE_INT, 1)
        unmapped.append(
            f"{student.name('hidden_dims')}={hiddens!r} (rsl_rl's RNNModel puts its MLP after the "
            "RNN, rl8's recurrent models an encoder before it: model_config encoder_hiddens)"
        )
        dist: dict[str, Any] = {}
        _distribution(student, dist, unmapped)
        if "init_noise_std" in dist:
            config["init_noise_std"] = dist["init_noise_std"]
        if dist.get("noise_std_type", "log") != "log":
            unmapped.append(
                f"{student.name('std_type')}='scalar' (rl8's recurrent models learn the log-std)"
            )
    elif kind in _MLP_CLASSES:
        config["hiddens"] = hiddens
        config["critic_hiddens"] = []  # a distillation never trains the value: one linear layer
        _distribution(student, config, unmapped)
    else:
        unmapped.append(
            f"{student.name('class_name')}={kind!r} (rl8 builds its MLPModel; set model_cls)"
        )
    hparams["model_config"] = config


def _from_distillation(runner: _Section, run_args: dict[str, Any]) -> RslRlConfig:
    """:func:`from_rsl_rl` of a ``DistillationRunner`` config: ``Distillation`` hparams."""
    runner.take("class_name", _STR)
    algo = _Section(runner.take("algorithm", _DICT), "algorithm", _DISTILLATION_DEFAULTS)
    if algo.take("class_name", _STR) != "Distillation":
        raise ValueError(
            f"rsl_rl config algorithm.class_name: a DistillationRunner runs 'Distillation', got "
            f"{algo.fields.get('class_name', runner.fields.get('algorithm'))!r}"
        )
    unmapped: list[str] = []
    student, teacher = _student_teacher_sections(runner)
    optimizer = _OPTIMIZERS[algo.take("optimizer", _OPTIMIZER)]
    horizon = runner.take("num_steps_per_env", _INT)
    hparams: dict[str, Any] = {
        "horizon": horizon,
        "lr": algo.take("learning_rate", _NUMBER),
        "num_sgd_iters": algo.take("num_learning_epochs", _POSITIVE_INT),
        "max_grad_norm": algo.take("max_grad_norm", _optional(_NUMBER)),
        "loss_type": algo.take("loss_type", ("'mse' or 'huber'", lambda v: v in ("mse", "huber"))),
        "optimizer_cls": optimizer,
        "optimizer_kwargs": {},  # torch's defaults, as rsl_rl
    }
    # gradient_length steps per optimizer step: rl8's minibatches of that many steps of every env
    gradient_length = algo.take("gradient_length", _POSITIVE_INT)
    steps = max(d for d in range(1, min(gradient_length, horizon) + 1) if horizon % d == 0)
    if steps != gradient_length:
        unmapped.append(
            f"algorithm.gradient_length={gradient_length} (rl8 splits num_steps_per_env={horizon} "
            f"into whole minibatches: {steps} steps each)"
        )
    hparams["num_minibatches"] = horizon // steps
    _student_model(student, hparams, unmapped)
    if hparams.get("model_cls") is not None:
        hparams["seq_len"] = steps  # truncated backpropagation through gradient_length steps
    if "seed" in runner.fields:
        hparams["seed"] = runner.take("seed", _INT)
    groups = runner.take("obs_groups", _optional(_DICT), None) or {}
    for name, keys in groups.items():
        if name not in ("student", "teacher"):
            unmapped.append(
                f"obs_groups.{name}={keys!r} (a distillation has the sets student and teacher)"
            )
        elif not (isinstance(keys, (list, tuple)) and keys and all(isinstance(k, str) for k in keys)):
            raise ValueError(
                f"rsl_rl config obs_groups.{name}: expected a non-empty list of group names, got {keys!r}"
            )
    if "student" in groups:
        hparams["obs_groups"] = {"actor": list(groups["student"])}
    teacher_kind = teacher.fields.get("class_name", "MLPModel")
    if str(teacher_kind).rsplit(":", 1)[-1].rsplit(".", 1)[-1] not in _MLP_CLASSES:
        raise ValueError(
            f"rsl_rl config {teacher.name('class_name')}: expected a feedforward teacher "
            f"('MLPModel'), got {teacher_kind!r}; rl8's Distillation labels the buffer after each "
            "collect and takes a feedforward teacher (the student may be recurrent)"
        )
    # the teacher's other fields describe its checkpoint (rsl_rl_teacher_args), not training
    for key in ("class_name", "hidden_dims", "activation", "obs_normalization", "distribution_cfg"):
        teacher.fields.pop(key, None)
    for key in ("rnd_cfg", "symmetry_cfg"):
        if algo.take(key, _ANY, None) is not None:
            raise ValueError(f"rsl_rl config algorithm.{key}: rsl_rl's Distillation refuses it too")
    for key in ("torch_compile_mode", "clip_actions", "device", "empirical_normalization"):
        if runner.fields.get(key) is not None:
            unmapped.append(f"{key}={runner.fields.pop(key)!r} (not mapped for Distillation)")
        runner.fields.pop(key, None)
    return _config(hparams, unmapped, run_args, (runner, algo, student, teacher), stacklevel=4)


def rsl_rl_teacher_args(cfg: Mapping[str, Any] | str | os.PathLike[str]) -> dict[str, Any]:
    """The keyword arguments of :func:`rl8.io.export.load_rsl_rl_policy` (with the env's
    ``observation_space``) that load the teacher a ``DistillationRunner`` config describes
    from its rsl_rl checkpoint: the groups it reads (``obs_groups["teacher"]``; ``None`` when
    the config names none: pass ``obs_groups`` yourself) and its activation.

    Raises:
        ValueError: Not a ``DistillationRunner`` config, or a field of the wrong type.
    """
    runner = _Section(_read(cfg), "")
    if runner.fields.get("class_name") != "DistillationRunner":
        raise ValueError(
            f"rsl_rl config class_name: expected 'DistillationRunner', got {runner.fields.get('class_name')!r}"
        )
    _, teacher = _student_teacher_sections(runner)
    groups = (runner.take("obs_groups", _optional(_DICT), None) or {}).get("teacher")
    return {"obs_groups": list(groups) if groups else None, "activation": _activation(teacher)}
