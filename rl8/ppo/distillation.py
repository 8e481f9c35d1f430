"""Student-teacher distillation (DAgger, as rsl_rl's ``Distillation``): the student acts in the
envs, a frozen teacher labels the observations the student reached with its own actions, and
the student is trained to match them (behaviour cloning); ``docs/distillation.md``."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, ClassVar, Literal

import torch
import torch.nn.functional as F
from gymnasium import spaces
from tensordict import TensorDict, TensorDictBase

from rl8.fields import attributes_doc, check, int_at_least, is_number, one_of, optional
from rl8.policies.policy import Policy
from rl8.ppo.algorithm import PPO
from rl8.ppo.buffer import minibatches
from rl8.ppo.hparams import HParams
from rl8.ppo.stats import reduce_stats

__all__ = ["BEHAVIOUR_LOSSES", "Distillation", "DistillationHParams", "check_teacher"]

#: ``loss_type``'s names: the behaviour-cloning losses, as rsl_rl names them (mean over the batch).
BEHAVIOUR_LOSSES: dict[str, Callable[[torch.Tensor, torch.Tensor], torch.Tensor]] = {
    "mse": F.mse_loss,
    "huber": F.huber_loss,
}

#: PPO's hyper-parameters that distillation has no use for (no returns, advantages, PPO loss,
#: value loss, entropy or KL): a value other than the default is an error, not ignored.
_PPO_ONLY = (
    "gamma",
    "gae_lambda",
    "clip_param",
    "dual_clip_param",
    "vf_clip_param",
    "vf_coeff",
    "entropy_coeff",
    "entropy_coeff_schedule",
    "target_kl_div",
    "desired_kl",
    "normalize_advantages",
    "normalize_advantages_over",
    "accumulate_grads",
    "enable_amp",
    "compile",
    "collect_mode",
)


def _field(default: Any, checker: Any, doc: str) -> Any:
    return dataclasses.field(default=default, metadata={"check": checker, "doc": doc, "convert": None})


@dataclass(frozen=True, kw_only=True)
class DistillationHParams(HParams):
    """Hyper-parameters of :class:`Distillation`: those of :class:`rl8.HParams` that collection,
    the student's model and its optimizer read, with ``num_sgd_iters`` (rsl_rl's
    ``num_learning_epochs``) 1, ``max_grad_norm`` ``None`` and ``normalize_rewards`` off by
    default, and ``loss_type``. The minibatches are ``num_minibatches`` consecutive or shuffled
    chunks of the buffer (rsl_rl's ``gradient_length`` steps: ``num_minibatches = horizon /
    gradient_length``); a recurrent student trains on sequences of ``seq_len`` steps. PPO's own
    fields (``gamma``, ``clip_param``, ``vf_coeff``, ``entropy_coeff``...) must keep their
    defaults: a ``ValueError`` names one that is set."""

    num_sgd_iters: int = _field(
        1, int_at_least(1), "Passes (rsl_rl's epochs) over the buffer per update."
    )
    max_grad_norm: float | None = _field(
        None,
        optional(check("a number > 0", lambda v: is_number(v) and v > 0)),
        "Clip the student's global gradient norm to this, or ``None`` (rsl_rl's default).",
    )
    normalize_rewards: bool = _field(False, check("False", lambda v: v is False), "Always off.")
    loss_type: Literal["mse", "huber"] = _field(
        "mse",
        one_of(*BEHAVIOUR_LOSSES),
        '``"mse"`` or ``"huber"``: the behaviour-cloning loss between the student\'s and the '
        "teacher's deterministic actions (the means of Gaussian policies), as rsl_rl's.",
    )

    def __post_init__(self) -> None:
        super().__post_init__()
        ppo_defaults = HParams()
        for name in _PPO_ONLY:
            default = getattr(ppo_defaults, name)
            if getattr(self, name) != default:
                raise ValueError(
                    f"hparam {name}: Distillation trains by behaviour cloning and has no use for "
                    f"PPO's {name} (expected its default {default!r}, got {getattr(self, name)!r})"
                )


DistillationHParams.__doc__ = (DistillationHParams.__doc__ or "") + attributes_doc(DistillationHParams)


def check_teacher(teacher: Any, observation_space: spaces.Space, action_space: spaces.Space) -> None:
    """Refuse a ``teacher`` that cannot label the env's observations for a student of its action
    space: a ``TypeError`` for anything but a feedforward :class:`~rl8.Policy`, a ``ValueError``
    naming the observation group or space that differs.

    Args:
        teacher: The teacher policy.
        observation_space: The env's observation space.
        action_space: The env's action space (a ``Box``: behaviour cloning matches actions).
    """
    _require_policy(teacher)
    if teacher.recurrent:
        raise ValueError(
            f"Distillation: teacher: expected a feedforward policy, got one of the recurrent "
            f"{teacher.model_cls.__name__}; rl8 labels the buffer after each collect, where a "
            "recurrent teacher would need its state carried along the rollout as rsl_rl 5 does "
            "(the student may be recurrent: model_cls)"
        )
    if not isinstance(action_space, spaces.Box):
        raise ValueError(
            f"Distillation: behaviour cloning matches continuous actions, so the env's action space "
            f"must be a Box, got {action_space}"
        )
    if teacher.action_space != action_space:
        raise ValueError(
            f"Distillation: the teacher's action space {teacher.action_space} differs from the "
            f"env's {action_space}"
        )
    needed = teacher.actor_observation_space
    if isinstance(needed, spaces.Dict) and isinstance(observation_space, spaces.Dict):
        for key, space in needed.spaces.items():
            given = observation_space.spaces.get(key)
            if given != space:
                found = "missing" if given is None else f"{given}"
                raise ValueError(
                    f"Distillation: the teacher reads observation group {key!r} as {space}, but the "
                    f"env's is {found} (the env's groups: {list(observation_space.spaces)})"
                )
    elif needed != observation_space:
        raise ValueError(
            f"Distillation: the teacher reads observations of {needed}, but the env's are "
            f"{observation_space}"
        )


def _require_policy(teacher: Any) -> None:
    if not isinstance(teacher, Policy):
        holds = isinstance(getattr(teacher, "policy", None), Policy)
        raise TypeError(
            f"Distillation: teacher must be a rl8.Policy (e.g. rl8.load_policy(path)), got a "
            f"{type(teacher).__name__}{' (it holds one: pass its .policy)' if holds else ''}"
        )


def _flat_steps(obs: torch.Tensor | TensorDictBase) -> torch.Tensor | TensorDictBase:
    """``[N, H, ...]`` observations as ``[N * H, ...]``."""
    return obs.reshape(-1) if isinstance(obs, TensorDictBase) else obs.flatten(0, 1)


class Distillation(PPO):
    """Student-teacher distillation on batched envs, with :class:`~rl8.PPO`'s interface
    (``collect``, ``update``, ``evaluate``, ``state_dict``, counters, ``policy``: the student), so
    that :class:`~rl8.Trainer`, checkpoints, exports and ``load_policy`` work unchanged.

    :meth:`collect` runs the student (its actions sampled, as DAgger and rsl_rl do);
    :meth:`update` labels the buffer's observations with the teacher's deterministic actions and
    runs ``num_sgd_iters`` passes of minibatch gradient steps on the behaviour-cloning loss
    between them and the student's deterministic actions (``loss_type``).

    Args:
        env: The env, as for :class:`~rl8.PPO`; its observations must hold the groups the teacher
            reads (a ``Dict`` of groups: the student reads ``obs_groups["actor"]``).
        teacher: The frozen teacher: a feedforward :class:`~rl8.Policy` with the env's action
            space (``rl8.load_policy(path, ...)`` of an rl8 policy, checkpoint, run id,
            ``models:/`` URI or rsl_rl checkpoint). It is moved to the run's device, put in eval
            mode and its parameters stop requiring gradients.
        **hparams: See :class:`DistillationHParams` (an unknown name is an error).

    Attributes:
        teacher: The frozen teacher policy.
        loss_fn: The behaviour-cloning loss (``BEHAVIOUR_LOSSES[loss_type]``).
    """

    algorithm: ClassVar[str] = "Distillation"
    hparams_cls: ClassVar[type[HParams]] = DistillationHParams

    def __init__(self, env: Any, /, *, teacher: Any, **hparams: Any) -> None:
        _require_policy(teacher)  # before the envs are built
        super().__init__(env, **hparams)
        check_teacher(teacher, self.env.observation_space, self.env.action_space)
        if teacher.distribution_cls is not self.policy.distribution_cls:
            raise ValueError(
                f"Distillation: the teacher's distribution {teacher.distribution_cls.__name__} and "
                f"the student's {self.policy.distribution_cls.__name__} differ, so their raw actions "
                "cannot be compared; set hparam distribution_cls to the teacher's"
            )
        self.teacher = teacher.to(self.device).eval().requires_grad_(False)
        self.loss_fn = BEHAVIOUR_LOSSES[self.hparams.loss_type]

    def update(self) -> dict[str, float]:
        """Behaviour cloning on the last collect's buffer: the teacher's actions as labels, then
        ``num_sgd_iters`` passes of minibatch steps; returns ``losses/behavior``,
        ``monitors/grad_norm`` and ``coefficients/lr``.

        Raises:
            NonFiniteError: The loss or the gradient norm is NaN or inf.
        """
        if self.collects == 0:
            raise RuntimeError(
                "Distillation.update() needs a collect() first: the rollout buffer is empty"
            )
        hp = self.hparams
        self._set_lr(self.lr_schedule(self.env_steps))
        samples = self._labelled_samples()
        num_minibatches = samples.batch_size[0] * self.seq_len // self.minibatch_size
        batches = minibatches(
            samples,
            num_minibatches,
            num_passes=hp.num_sgd_iters,
            seq_len=self.seq_len,
            shuffle=hp.shuffle_minibatches,
            normalize_advantages=None,
            dist=self.dist,
            generator=self.generator,
        )
        losses, grad_norms = [], []
        for minibatch in batches:
            actions = self._student_actions(minibatch)
            loss = self.loss_fn(actions, minibatch["teacher_actions"].reshape(actions.shape))
            self.optimizer.zero_grad()
            loss.backward()
            grad_norms.append(self._optimizer_step())
            losses.append(loss.detach())
        self._update_obs_normalizer()
        self.updates += 1
        means = {"behavior": torch.stack(losses).mean(), "grad_norm": torch.stack(grad_norms).mean()}
        out = reduce_stats(self.dist, means=means)
        stats = {
            "losses/behavior": out["behavior"],
            "monitors/grad_norm": out["grad_norm"],
            "coefficients/lr": self.optimizer.param_groups[0]["lr"],
        }
        self._check_stats_finite(
            stats, ("losses/behavior", "monitors/grad_norm"), f"update step {self.updates}"
        )
        return stats

    @torch.no_grad()
    def _labelled_samples(self) -> TensorDict:
        """The buffer's samples (transitions, or ``seq_len``-step sequences) with the teacher's
        deterministic raw actions on each observation, ``teacher_actions``."""
        h = self.hparams.horizon
        obs = self.buffer.data["obs"][:, :h]
        dist, _ = self.teacher.actor_step(_flat_steps(obs), None)
        labels = dist.deterministic_sample().float()
        zeros = torch.zeros(self.hparams.num_envs, h, device=self.device)  # no advantages, no returns
        samples = self.buffer.training_samples(zeros, zeros)
        samples["teacher_actions"] = labels.reshape(samples["actions"].shape)
        return samples

    def _student_actions(self, minibatch: TensorDictBase) -> torch.Tensor:
        """The student's deterministic raw actions on a minibatch's observations, ``[B, ...]`` (a
        recurrent student's sequences replayed from their stored states: ``[S * T, ...]``)."""
        policy, obs = self.policy, minibatch["obs"]
        if policy.recurrent:
            params, _, _ = policy.model(policy.preprocess(obs), minibatch["state"], minibatch["firsts"])
            params = params.flatten(0, 1)
        else:
            params = policy.model.actor_params(policy.preprocess(obs))
        return policy.distribution_cls(params, policy.action_space).deterministic_sample()

    def state_dict(self) -> dict[str, Any]:
        """:meth:`rl8.PPO.state_dict` and the teacher's weights (``teacher``)."""
        return {**super().state_dict(), "teacher": self.teacher.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore :meth:`state_dict` (the teacher's weights included)."""
        super().load_state_dict(state)
        self.teacher.load_state_dict(state["teacher"])

    def __repr__(self) -> str:
        return (
            f"Distillation(env={self.env!r}, device={self.device}, student="
            f"{self.policy.model_cls.__name__}, teacher={self.teacher.model_cls.__name__})"
        )
