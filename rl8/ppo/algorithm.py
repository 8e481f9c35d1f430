"""Proximal Policy Optimization over batched environments.

The whole algorithm reads top to bottom: :meth:`PPO.collect` fills the preallocated buffer by
stepping the envs ``horizon`` times; :meth:`PPO.update` computes GAE advantages and runs the
clipped-surrogate update. Both return flat ``dict[str, float]`` stats named as listed in
docs/trainer.md (Metrics).
"""

from __future__ import annotations

import contextlib
import inspect
import math
import secrets
import warnings
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import torch
from tensordict import TensorDict, TensorDictBase

from rl8.envs.base import Env, ReadyEnvs, validate_reset_output
from rl8.envs.episodes import EpisodeTracker
from rl8.envs.gymnasium import GymnasiumEnv, GymnasiumEnvFactory
from rl8.policies.policy import Policy
from rl8.policies.runner import run_policy
from rl8.ppo import presets
from rl8.ppo.buffer import (
    MIN_SLOT_BYTES, RecurrentCarry, RolloutBuffer, RolloutCarry, buffer_allocation, check_buffer_fits,
    compute_gae, slot_bytes,
)
from rl8.ppo.distributed import DistContext, agree_on_run_seed, current_roles, derive_seed
from rl8.ppo.finite import (
    CHECKED_ROLLOUT_STATS, CHECKED_UPDATE_STATS, NonFiniteError, check_buffer_finite, check_stats_finite,
)
from rl8.ppo.hparams import HParams
from rl8.ppo.losses import ppo_loss
from rl8.ppo.overlap import OverlapCollector
from rl8.ppo.resolve import DISTRIBUTION, MODEL, OPTIMIZER, env_target, qualified_name, resolve
from rl8.ppo.rewards import RewardNormalizer
from rl8.ppo.rollout import rollout, rollout_ready_envs
from rl8.ppo.stats import Stats, reduce_stats, rollout_stats

__all__ = ["NonFiniteError", "PPO", "PresetHint", "make_env"]

#: The counters of training progress, saved in checkpoints (see :class:`PPO`, Attributes).
_COUNTERS = ("env_steps", "env_resets", "collects", "steps")


def normalized_advantages(advantages: torch.Tensor, num_minibatches: int, dist: DistContext) -> torch.Tensor:
    """Each minibatch's advantages (rows ``j * mb:(j + 1) * mb`` of ``advantages``, ``[B, ...]``)
    centred and divided by their own sample std (+ 1e-8), for all minibatches of a pass in a
    few ops. In data-parallel training the moments of minibatch ``j`` cover every rank's
    minibatch ``j``, with ONE all-reduce per pass."""
    adv = advantages.reshape(num_minibatches, -1)
    if not dist.enabled:
        # two-pass std (sample, n - 1): torch.std's one-pass kernel is slower on a CPU
        centred = adv - adv.mean(1, keepdim=True)
        std = centred.square().sum(1, keepdim=True).div_(max(adv.shape[1] - 1, 1)).sqrt_()
        return centred.div_(std.add_(1e-8)).reshape(advantages.shape)
    x = adv.double()
    moments = torch.stack([torch.full_like(x[:, 0], x.shape[1]), x.sum(1), x.square().sum(1)], 1)
    n, s, ss = dist.all_reduce_(moments).unbind(1)
    mean = s / n
    std = ((ss - n * mean * mean) / (n - 1).clamp(min=1)).clamp(min=0).sqrt()
    out = (adv - mean[:, None].to(adv.dtype)) / (std[:, None].to(adv.dtype) + 1e-8)
    return out.reshape(advantages.shape)


def _keyword_defaults(cls: type) -> str:
    """``name=default`` of the keyword arguments of ``cls`` (an optimizer: not params, lr)."""
    try:
        parameters = inspect.signature(cls).parameters.values()
    except (TypeError, ValueError):
        return "see its documentation"
    return ", ".join(
        f"{p.name}={p.default!r}" for p in parameters
        if p.name not in ("params", "lr") and p.default is not inspect.Parameter.empty
    )


def make_env(
    env: type[Env] | str | Callable[..., Any],
    num_envs: int,
    horizon: int | None,
    *,
    device: torch.device | str,
    env_kwargs: dict[str, Any] | None = None,
) -> Env:
    """Build a batched env from an :class:`Env` subclass, a gymnasium id or a gymnasium maker.

    Args:
        env: An :class:`Env` subclass (or a dotted path to one); a registered gymnasium id
            such as ``"CartPole-v1"``; a callable returning a ``gymnasium.Env``; or a
            :meth:`GymnasiumEnv.make_factory <rl8.envs.GymnasiumEnv.make_factory>` factory.
        num_envs: Number of parallel envs.
        horizon: PPO's horizon, handed to the env.
        device: Device of the env's tensors.
        env_kwargs: Extra keyword arguments of the env's constructor (for gymnasium envs: of
            :class:`rl8.envs.GymnasiumEnv`, e.g. ``vectorization_mode`` or ``env_kwargs``).
    """
    kwargs = dict(env_kwargs or {})
    target, gymnasium = env_target(env)
    if not gymnasium:
        return target(num_envs, horizon, device=device, **kwargs)
    if isinstance(target, GymnasiumEnvFactory):
        return target(num_envs, horizon, device=device, **kwargs)
    return GymnasiumEnv(num_envs, horizon, device=device, env=target, **kwargs)


def _make_optimizer(hp: HParams, params: Iterable[torch.nn.Parameter], device: torch.device) -> torch.optim.Optimizer:
    """``hp.optimizer_cls`` over ``params`` with ``hp.lr`` and ``hp.optimizer_kwargs``; Adam(W) is
    fused on CPU and CUDA unless the kwargs choose an implementation."""
    optimizer_cls = resolve(hp.optimizer_cls, OPTIMIZER, field="hparam optimizer_cls")
    optimizer_kwargs = dict(hp.optimizer_kwargs)
    if optimizer_cls in (torch.optim.Adam, torch.optim.AdamW) and not {"fused", "foreach"} & set(optimizer_kwargs):
        # One fused kernel per parameter group instead of a loop of small ops: the same
        # maths, several times faster for the small networks PPO uses.
        optimizer_kwargs["fused"] = device.type in ("cpu", "cuda")
    try:
        return optimizer_cls(params, lr=hp.lr, **optimizer_kwargs)
    except (TypeError, ValueError) as err:
        raise ValueError(
            f"hparam optimizer_kwargs: {qualified_name(optimizer_cls)} refused {hp.optimizer_kwargs!r} "
            f"({err}); expected its keyword arguments: {_keyword_defaults(optimizer_cls)}"
        ) from err


def _random_run_seed() -> int:
    """A random seed for the whole run: every rank of the job (actors included) takes the
    largest one drawn."""
    return agree_on_run_seed(secrets.randbits(31))


def _rank_hparams(hp: HParams) -> HParams:
    """``hp`` as this rank uses them: an actor (``rl8 train --actors N``) runs its share of
    ``num_envs`` (its learner's buffer holds ``num_envs`` rows, one block per actor) and
    never updates (no minibatch size to check)."""
    roles = current_roles()
    if roles is None or not roles.is_actor:
        return hp
    share = roles.actors_per_learner
    if hp.num_envs % share:
        raise ValueError(
            f"hparam num_envs: with {roles.actors} actors and {roles.learners} learners each learner "
            f"combines {share} actors' rollouts, so num_envs (the envs of one learner's batch) must "
            f"be a multiple of {share}, got {hp.num_envs}"
        )
    return hp.replace(num_envs=hp.num_envs // share, sgd_minibatch_size=None, num_minibatches=None)


def _make_policy(hp: HParams, env: Env, device: torch.device) -> Policy:
    """The policy of ``hp``'s model, distribution and normaliser for ``env``'s spaces."""
    return Policy(
        env.observation_space, env.action_space,
        model_cls=resolve(hp.model_cls, MODEL, field="hparam model_cls"), model_config=hp.model_config,
        distribution_cls=resolve(hp.distribution_cls, DISTRIBUTION, field="hparam distribution_cls"),
        normalize_observations=hp.normalize_observations, device=device,
    )


def _make_buffer(hp: HParams, env: Env, policy: Policy, seq_len: int, device: torch.device) -> RolloutBuffer:
    """The rollout buffer of ``env``'s spaces and ``policy``'s raw actions, refused before
    allocating when it could never fit and named by ``num_envs`` and ``horizon`` when
    allocating it fails."""
    dist, space = policy.distribution_cls, env.action_space
    action_shape, action_dtype = tuple(dist.raw_action_shape(space)), dist.raw_action_dtype(space)
    slot = slot_bytes(env.observation_space, action_shape, action_dtype, env.episodic)
    check_buffer_fits(hp.num_envs, hp.horizon, device, slot, buffers=2 if hp.collect_mode == "overlap" else 1)
    with buffer_allocation(hp.num_envs, hp.horizon, slot):
        return RolloutBuffer(
            env.observation_space, action_shape, action_dtype, hp.num_envs, hp.horizon, device=device,
            episodic=env.episodic, state_example=policy.initial_state(hp.num_envs), seq_len=seq_len,
        )


def _env_state(env: Env, obs: torch.Tensor | TensorDictBase | None) -> dict[str, Any]:
    """The checkpoint's ``obs`` (the envs' last observations) and ``env`` (the env's
    ``state_dict``): both ``None`` before the first reset or for an env that saves no state."""
    env_state = env.state_dict() if obs is not None else None
    if env_state is None:
        return {"obs": None, "env": None}
    return {"obs": {"tensordict": obs.to_dict()} if isinstance(obs, TensorDictBase) else {"tensor": obs}, "env": env_state}


def _load_env_state(env: Env, state: dict[str, Any], device: torch.device) -> torch.Tensor | TensorDictBase | None:
    """Restore :func:`_env_state` into ``env``; returns the observations to go on from
    (``None``: the next collect resets the envs)."""
    obs, env_state = state.get("obs"), state.get("env")
    # an env that saves no state (GymnasiumEnv) is reset, whatever the file holds
    if obs is None or env_state is None or env.state_dict() is None:
        return None
    env.load_state_dict(env_state)
    if "tensordict" in obs:
        return TensorDict(obs["tensordict"], batch_size=[env.num_envs]).to(device)
    return obs["tensor"].to(device)


def _rng_state(generator: torch.Generator, eval_generator: torch.Generator) -> dict[str, Any]:
    """PPO's generators and torch's global (CPU and CUDA) random states."""
    return {
        "generator": generator.get_state(),
        "eval_generator": eval_generator.get_state(),
        "torch": torch.get_rng_state(),
        "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else [],
    }


def _load_rng_state(rng: dict[str, Any], generator: torch.Generator, eval_generator: torch.Generator) -> None:
    """Restore :func:`_rng_state`."""
    generator.set_state(rng["generator"])
    eval_generator.set_state(rng["eval_generator"])
    torch.set_rng_state(rng["torch"])
    if rng["cuda"] and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(rng["cuda"])



# ----------------------------------------------------------------- update machinery
def _final_values(
    policy: Policy, buffer: RolloutBuffer, carry: RolloutCarry, truncated: torch.Tensor,
    autocast: contextlib.AbstractContextManager,
) -> torch.Tensor | None:
    """Values of ``final_obs`` at the ``[num_envs, T]`` ``truncated`` steps, in one batched
    forward pass (``None`` when no step was truncated)."""
    index = truncated.nonzero()
    if index.shape[0] == 0:
        return None
    final_obs = buffer.data["final_obs"][index[:, 0], index[:, 1]]
    with autocast:
        values = policy.rollout_value(final_obs, carry.after(index)).float()
    out = torch.zeros(truncated.shape, device=values.device)
    out[index[:, 0], index[:, 1]] = values
    return out


def _minibatches(
    samples: TensorDict, num_minibatches: int, hp: HParams, seq_len: int, dist: DistContext,
    generator: torch.Generator,
) -> Iterator[TensorDict]:
    """One pass over ``samples`` in ``num_minibatches`` minibatches (shuffled when asked),
    each with its advantages normalised when asked (:func:`normalized_advantages`)."""
    if num_minibatches > 1 and hp.shuffle_minibatches:
        samples = samples[torch.randperm(samples.batch_size[0], device=samples.device, generator=generator)]
    else:
        samples = samples.clone(recurse=False)  # the advantages below replace a key
    if hp.normalize_advantages and samples.batch_size[0] * seq_len > num_minibatches:
        samples["advantages"] = normalized_advantages(samples["advantages"], num_minibatches, dist)
    if "advantage_weights" in samples.keys():  # per-sample importance weights (PPO.advantage_weights)
        samples["advantages"] = samples["advantages"] * samples["advantage_weights"]
    yield from samples.split(samples.batch_size[0] // num_minibatches)


def _minibatch_loss(
    policy: Policy, minibatch: TensorDict, hp: HParams, entropy_coeff: float,
    autocast: contextlib.AbstractContextManager,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """The minibatch's differentiable total loss and its detached monitors ``{policy, vf,
    kl_div, clip_fraction, entropy}``."""
    # With a zero entropy coefficient the entropy is only a reported stat: keep it out of
    # the graph so the backward pass does not differentiate it.
    entropy_grad = entropy_coeff != 0
    with autocast:
        logp, entropy, values = policy.evaluate(minibatch, entropy_grad=entropy_grad)
    old = {key: minibatch[key].reshape(-1) for key in ("logp", "values", "advantages", "returns")}
    total, monitors = ppo_loss(
        logp.float(), values.float(), old["logp"], old["advantages"], old["values"], old["returns"],
        clip_param=hp.clip_param, dual_clip_param=hp.dual_clip_param,
        vf_clip_param=hp.vf_clip_param, vf_coeff=hp.vf_coeff,
    )
    mean_entropy = entropy.float().mean()
    if entropy_grad:
        total = total - entropy_coeff * mean_entropy
    monitors = dict(zip(("policy", "vf", "kl_div", "clip_fraction"), monitors.unbind()))
    return total, {**monitors, "entropy": mean_entropy.detach()}


def _kl_exceeds_target(kl_div: torch.Tensor, target_kl_div: float | None, dist: DistContext) -> bool:
    """Whether the mean KL over all ranks exceeds ``target_kl_div`` (``False`` without one)."""
    if target_kl_div is None:
        return False
    return (dist.all_reduce_(kl_div.clone()) / dist.world_size).item() > target_kl_div


def _backward(loss: torch.Tensor, grad_scaler: torch.amp.GradScaler | None) -> None:
    (loss if grad_scaler is None else grad_scaler.scale(loss)).backward()


def _optimizer_step(
    optimizer: torch.optim.Optimizer, grad_scaler: torch.amp.GradScaler | None,
    params: list[torch.nn.Parameter], dist: DistContext, hp: HParams,
) -> torch.Tensor:
    """Average the gradients across ranks, clip them to ``hp.max_grad_norm`` and step the
    optimizer; returns the gradient norm before clipping."""
    dist.average_gradients(params)  # data-parallel: one all-reduce per optimizer step
    if grad_scaler is not None:
        grad_scaler.unscale_(optimizer)
    # max_grad_norm None: the norm is only measured (an infinite bound never scales)
    max_norm = math.inf if hp.max_grad_norm is None else hp.max_grad_norm
    grad_norm = torch.nn.utils.clip_grad_norm_(params, max_norm, foreach=True)
    if grad_scaler is not None:
        grad_scaler.step(optimizer)
        grad_scaler.update()
    else:
        optimizer.step()
    return grad_norm.detach().float()


def _update_stats(
    dist: DistContext, monitors: list[dict[str, torch.Tensor]], grad_norms: list[torch.Tensor],
    explained_variance: torch.Tensor, vf_coeff: float, entropy_coeff: float, lr: float,
) -> dict[str, float]:
    """The update stats (docs/trainer.md, Metrics) of the minibatches' ``monitors`` and the
    optimizer steps' ``grad_norms``, reduced over ranks with one host transfer."""
    means = {f"monitors/{name}": torch.stack([m[name] for m in monitors]).mean() for name in monitors[0]}
    means["monitors/explained_variance"] = explained_variance
    means["monitors/grad_norm"] = torch.stack(grad_norms).mean()
    out = reduce_stats(dist, means=means)
    entropy = out.pop("monitors/entropy")
    policy_loss, vf_loss = out.pop("monitors/policy"), out.pop("monitors/vf")
    return {
        "losses/policy": policy_loss,
        "losses/vf": vf_loss,
        "losses/entropy": -entropy,
        # the mean of the minibatches' total losses, from the means of their (linear) terms
        "losses/total": policy_loss + vf_coeff * vf_loss - entropy_coeff * entropy,
        **out,
        "coefficients/entropy": entropy_coeff,
        "coefficients/vf": vf_coeff,
        "coefficients/lr": lr,
    }


def _eval_on_training_envs_error(k: int, collects: int) -> RuntimeError:
    """Why :meth:`PPO.evaluate` cannot use the training envs now (``k``: ``horizons_per_env_reset``)."""
    return RuntimeError(
        "eval on the training envs is only possible at an env-reset boundary "
        f"(horizons_per_env_reset={k}: the envs reset "
        + ("only once, before the first collect" if k < 0 else f"every {k} collects")
        + f"; {collects} collects done so far). Use a dedicated eval env "
        "(Trainer(eval_num_envs=...)) to evaluate at any time."
    )


class PresetHint(UserWarning):
    """The hint that a gymnasium id given to :class:`PPO` with default hyper-parameters has a
    tuned preset (``PPO.from_preset(id)``); shown once per id per process. Silence it with
    ``warnings.filterwarnings("ignore", category=rl8.ppo.algorithm.PresetHint)``."""


#: Hyper-parameters that do not tune learning: given alone, PPO still hints at a preset.
_UNTUNED_HPARAMS = {"seed", "device"}
_hinted: set[str] = set()


def _hint_preset(env: Any) -> None:
    """Warn (:class:`PresetHint`, once per id) when ``env`` is a gymnasium id with a preset."""
    name = presets.for_env(env)
    if name is None or name in _hinted:
        return
    _hinted.add(name)
    warnings.warn(
        f"rl8: {name} has a tuned preset: PPO.from_preset({name!r}) / rl8 train {name} "
        "(PPO's default hyper-parameters are not tuned for it; see docs/results/index.md)",
        PresetHint, stacklevel=3,
    )


class PPO:
    """PPO with a preallocated rollout buffer over batched environments.

    Args:
        env: The environment: an :class:`rl8.Env` subclass (built with ``num_envs`` and
            ``horizon``), a gymnasium id such as ``"CartPole-v1"``, or a callable that makes a
            gymnasium env.
        **hparams: Hyper-parameters, see :class:`rl8.HParams` (an unknown name is an error).

    Attributes:
        hparams: The frozen, validated :class:`~rl8.HParams`.
        env: The batched env instance.
        policy: The :class:`~rl8.Policy` (model + distribution + normaliser).
        optimizer: The torch optimizer.
        buffer: The :class:`~rl8.ppo.buffer.RolloutBuffer`.
        collector: With ``collect_mode="overlap"``, the
            :class:`~rl8.ppo.overlap.OverlapCollector` (the actor side, which collects in the
            background); ``None`` in sync mode.
        minibatch_size: Transitions per minibatch of an update (see
            :meth:`HParams.minibatch_size_for <rl8.HParams.minibatch_size_for>`).
        env_steps: Env transitions collected so far (all envs together, of every rank in
            data-parallel training: schedules and ``env/steps`` count the whole job).
        env_resets: Times PPO reset all envs.
        collects: Number of :meth:`collect` calls.
        steps: Number of :meth:`update` calls (optimisation steps of the policy).
        advantage_weights: ``None``, or ``[num_envs, horizon]`` per-transition weights by which
            the next :meth:`update` multiplies the (normalised) advantages, then resets to
            ``None``; :mod:`rl8.training.actors` sets truncated importance weights here (feedforward
            models).

    Example:
        >>> from rl8 import PPO
        >>> from rl8.envs import CartPole
        >>> algo = PPO(CartPole, num_envs=64, horizon=16, seed=0)
        >>> rollout_stats = algo.collect()
        >>> update_stats = algo.update()
    """

    def __init__(self, env: type[Env] | str | Callable[..., Any], /, **hparams: Any) -> None:
        self.hparams = hp = _rank_hparams(HParams.from_kwargs(**hparams))
        self.device = hp.resolved_device()
        self.dist = DistContext()
        if self.dist.is_main and not set(hparams) - _UNTUNED_HPARAMS:
            _hint_preset(env)
        self.seed = hp.seed if hp.seed is not None else _random_run_seed()
        # The model is initialised from the run's seed (the same on every rank); envs and
        # action sampling then use a seed derived from the run's seed and the rank.
        self.env_seed = derive_seed(self.seed, self.dist.global_rank)
        torch.manual_seed(self.seed)
        self.env_spec = env
        check_buffer_fits(hp.num_envs, hp.horizon, self.device, MIN_SLOT_BYTES)  # before the env allocates per env
        with buffer_allocation(hp.num_envs, hp.horizon, None):
            self.env = make_env(env, hp.num_envs, hp.horizon, device=self.device, env_kwargs=hp.env_kwargs)
        self.policy = _make_policy(hp, self.env, self.device)
        self.dist.broadcast_module(self.policy)
        # Action sampling and minibatch shuffling draw from this object's own generator, so
        # two PPO objects (or user code) in one process never disturb each other's streams.
        self.generator = torch.Generator(device=self.device).manual_seed(self.env_seed)
        self.eval_generator = torch.Generator(device=self.device).manual_seed(derive_seed(self.env_seed, 1))
        torch.manual_seed(self.env_seed)
        self.optimizer = _make_optimizer(hp, self.policy.parameters(), self.device)
        self.recurrent = self.policy.recurrent
        self.seq_len = (hp.seq_len or hp.horizon) if self.recurrent else 1
        # transitions per minibatch: whole sequences of seq_len steps for recurrent models
        self.minibatch_size = hp.minibatch_size_for(self.seq_len)
        self.buffer = _make_buffer(hp, self.env, self.policy, self.seq_len, self.device)
        # the policy's carry from step to step (a recurrent state) and what the buffer keeps of it
        self.carry = self._make_carry(self.policy, self.buffer)
        self.reward_normalizer = (RewardNormalizer(hp.num_envs, hp.gamma, device=self.device)
                                  if hp.normalize_rewards else None)
        self.lr_schedule = hp.lr_at()
        self.entropy_coeff_schedule = hp.entropy_coeff_at()
        self.amp_dtype = torch.float16 if self.device.type == "cuda" else torch.bfloat16
        self.grad_scaler = torch.amp.GradScaler("cuda") if hp.enable_amp and self.device.type == "cuda" else None
        self.env_steps = self.env_resets = self.collects = self.steps = 0
        self._obs: torch.Tensor | TensorDictBase | None = None
        self._validated = False
        self.episodes = EpisodeTracker(hp.num_envs, self.device)
        # collect_mode="overlap": the actor side, which collects in the background
        self.collector = self._make_collector() if hp.collect_mode == "overlap" else None
        self._behaviour_version = 0  # the update count of the weights that collected the buffer
        # [num_envs, horizon] weights of the next update's (normalised) advantages, or None
        self.advantage_weights: torch.Tensor | None = None

    @classmethod
    def from_preset(cls, name: str, /, **overrides: Any) -> PPO:
        """PPO on the env of preset ``name`` with its tuned hyper-parameters (``rl8.presets``,
        the same as ``rl8 train NAME``), ``overrides`` over them.

        The preset's Trainer options and run arguments (evaluation, env-step budget) are
        :func:`rl8.presets.trainer_options` and :func:`rl8.presets.run_args`.

        Args:
            name: A preset's name (``rl8.presets.names()``: ``"Pendulum-v1"``, ``"HalfCheetah-v5"``...),
                with or without ``preset:``.
            **overrides: Hyper-parameters by name (``seed=1``, ``device="cpu"``), over the
                preset's; a nested one (``model_config``) replaces the preset's whole value.

        Raises:
            ValueError: Unknown preset (with close matches), or a bad value.
            TypeError: An unknown hyper-parameter name.
        """
        config = presets.load(name)
        return cls(config["env"], **{**presets.hparams(config).to_dict(), **overrides})

    def _make_carry(self, policy: Policy, buffer: RolloutBuffer) -> RolloutCarry:
        """``policy``'s carry from step to step over ``buffer`` (a recurrent state, or none)."""
        if not self.recurrent:
            return RolloutCarry()
        return RecurrentCarry(policy.initial_state, buffer, self.hparams.seqs_per_state_reset)

    def _make_collector(self) -> OverlapCollector:
        """The actor side of overlapped collection: its own buffer, carry and generator."""
        buffer = _make_buffer(self.hparams, self.env, self.policy, self.seq_len, self.device)
        generator = torch.Generator(device=self.device).manual_seed(derive_seed(self.env_seed, 2))
        return OverlapCollector(self.policy, buffer, generator, run=self._rollout, make_carry=self._make_carry)

    # ----------------------------------------------------------------- helpers
    def _autocast(self) -> contextlib.AbstractContextManager:
        if not self.hparams.enable_amp:
            return contextlib.nullcontext()
        return torch.autocast(self.device.type, dtype=self.amp_dtype)

    @property
    def next_collect_resets(self) -> bool:
        """Whether the next :meth:`collect` starts by resetting every env: before the first
        collect, after a reset-forcing :meth:`evaluate`, and every ``horizons_per_env_reset = k
        > 0`` collects. Only then can the training envs be evaluated."""
        k = self.hparams.horizons_per_env_reset
        return self._obs is None or (k > 0 and self.collects % k == 0)

    @property
    def _env_carry(self) -> RolloutCarry:
        """The carry that goes on with the training envs (the actor side's in overlap mode)."""
        return self.collector.carry if self.collector is not None else self.carry

    def _settle(self) -> None:
        """Overlap mode: wait for the rollout in flight, so that the training envs are idle
        and ``_obs`` are their observations (it stays ready for the next collect)."""
        if self.collector is not None and self.collector.in_flight:
            self._obs = self.collector.wait().obs

    def reset_envs(self, *, env_config: dict[str, Any] | None = None) -> None:
        """Reset every env (applying ``hparams.env_config`` updated with ``env_config``). In
        overlap mode a rollout collected in the background and not yet handed over is dropped
        (it was collected before the reset)."""
        if self.collector is not None:
            self.collector.discard()
        config = {**self.hparams.env_config, **(env_config or {})}
        seed = self.env_seed if self.env_resets == 0 else None
        self._obs = self.env.reset(config=config or None, seed=seed)
        validate_reset_output(self._obs, self.env)  # once per reset: cheap
        self.env_resets += 1
        self.episodes.reset()
        if self.reward_normalizer is not None:
            self.reward_normalizer.reset()
        self._env_carry.reset()

    # ----------------------------------------------------------------- collect
    @torch.no_grad()
    def collect(self, *, env_config: dict[str, Any] | None = None, deterministic: bool = False) -> Stats:
        """Step the envs ``horizon`` times, filling the rollout buffer in place.

        Envs are reset first when the reset rule says so (before the first collect, then
        every ``horizons_per_env_reset`` collects when that is positive).

        With ``collect_mode="overlap"`` the buffer gets the rollout that ran in the background
        since the previous collect (with the weights before the last update), and the next one
        starts before this returns (see ``docs/collection.md`` ("Overlapped collection")).

        Args:
            env_config: Env parameters applied if the envs are reset before this collect
                (merged over ``hparams.env_config``).
            deterministic: Take the distributions' modes instead of sampling.

        Returns:
            Rollout stats (a :class:`~rl8.ppo.stats.Stats` dict; see ``docs/trainer.md``,
            Metrics): ``rollout/reward_sum_*`` (each env's sum of rewards over the ``horizon``
            steps), ``rewards/*`` (per step), for episodic envs
            ``episodes/{return_mean,length_mean,count}``, and for envs that record episodes
            themselves (:meth:`rl8.Env.pop_episode_records`: a gymnasium env with a
            ``RecordEpisodeStatistics``, such as the Atari preset's)
            ``env_episodes/{return_mean,length_mean,count}``.

        Raises:
            EnvOutputError: NaN/inf in the observations or rewards, naming the envs and steps
                (every value is checked during the first ``check_finite_collects`` collects,
                afterwards the reduced reward stats).
            NonFiniteError: The reduced reward stats are NaN/inf though every reward is finite.
        """
        if self.collector is not None:
            return self._collect_overlapped(env_config, deterministic)
        if self.next_collect_resets:
            self.reset_envs(env_config=env_config)
        self._obs = self._rollout(self.policy, self.buffer, self.carry, self._obs, self.generator, deterministic)
        self._behaviour_version = self.steps
        self._count_collect()
        return self._collect_stats()

    @property
    def behaviour_version(self) -> int:
        """The update count (:attr:`steps`) of the weights that collected the buffer's rollout
        (in overlap mode the rollout ran before the last update; an actor of
        :mod:`rl8.training.actors` sets ``steps`` to the version of the weights it received)."""
        return self._behaviour_version

    @torch.no_grad()
    def collect_received(self, fill: Callable[[RolloutBuffer], None]) -> Stats:
        """The learner's collect in a job of actors and learners (:mod:`rl8.training.actors`):
        ``fill(self.buffer)`` writes rollouts that other processes collected into the buffer
        (every row and column, as :meth:`collect` would); then the counters advance and the
        rollout stats, NaN/inf checks and reward normaliser run as after :meth:`collect`.

        Args:
            fill: Writes the received rollouts into the buffer it is given, in place.

        Returns:
            The rollout stats of :meth:`collect`, over the buffer's rows.
        """
        fill(self.buffer)
        self.buffer.env_episodes = None  # the actors report their envs' records themselves
        self._behaviour_version = self.steps
        self._validated = True
        self._count_collect()
        return self._collect_stats()

    def _rollout(
        self, policy: Policy, buffer: RolloutBuffer, carry: RolloutCarry, obs: torch.Tensor | TensorDictBase,
        generator: torch.Generator, deterministic: bool,
    ) -> torch.Tensor | TensorDictBase:
        """One rollout of the training envs with ``policy`` into ``buffer`` (the learner's
        objects in sync mode, the actor side's in overlap mode, in its thread). Envs that step
        at their own pace (a worker pool) are acted on as they get ready."""
        collect_from = rollout_ready_envs if isinstance(self.env, ReadyEnvs) else rollout
        obs = collect_from(
            policy, self.env, buffer, carry, obs, generator=generator, deterministic=deterministic,
            autocast=self._autocast(), check_first_step=not self._validated,
        )
        self._validated = True
        buffer.env_episodes = self.env.pop_episode_records()  # the episodes of this rollout
        return obs

    def _count_collect(self) -> None:
        self.env_steps += self.hparams.batch_size * self.dist.world_size  # every rank's envs
        self.collects += 1

    def _collect_overlapped(self, env_config: dict[str, Any] | None, deterministic: bool) -> Stats:
        """Overlap mode's collect: hand the rollout that ran in the background over to the
        learner (one runs now when none did: first collect, after a reset or a load), sync the
        actor's weights and start the next rollout (unless the envs reset before it: that
        rollout waits for the next collect's ``env_config``), then the stats."""
        collector = self.collector
        if not collector.idle and collector.deterministic != deterministic:
            raise ValueError(
                f"PPO.collect: deterministic={deterministic}, but in collect_mode='overlap' the "
                f"rollout for this collect was started by the previous one with "
                f"deterministic={collector.deterministic}; pass the same value to consecutive collects"
            )
        if collector.idle:
            if self.next_collect_resets:
                self.reset_envs(env_config=env_config)
            collector.sync(self.policy, self.steps)
            collector.start(self._obs, deterministic, background=False)
        done = collector.hand_over(self.buffer)
        self._obs, self._behaviour_version = done.obs, done.version
        self._count_collect()
        if not self.next_collect_resets:
            collector.sync(self.policy, self.steps)
            collector.start(self._obs, deterministic)
        return self._collect_stats()

    def _collect_stats(self) -> Stats:
        """The last collect's rollout stats, after its NaN/inf checks; advances the episode
        tracker and the reward normaliser's running returns over it."""
        n = self.hparams.check_finite_collects
        if n == -1 or self.collects <= n:
            self._check_buffer_finite()
        data, h = self.buffer.data, self.hparams.horizon
        rewards = data["rewards"][:, :h]
        dones = data["terminated"][:, :h] | data["truncated"][:, :h] if self.env.episodic else None
        # the normaliser's running returns advance on the device; their moments travel with
        # the rollout stats (one transfer) and are merged on the host
        episode_sums = self.episodes.advance(rewards, dones) if dones is not None else None
        normalizer, moments, current = self.reward_normalizer, {}, {}
        if normalizer is not None:
            seen = normalizer.advance(rewards, dones)
            moments, current = normalizer.returns_moments(seen)
        records = self.buffer.env_episodes
        env_episode_sums = records.stat_sums(self.device) if records is not None else None
        stats, values = rollout_stats(self.dist, rewards, episode_sums, moments, current, env_episode_sums)
        if normalizer is not None:
            normalizer.merge_returns_moments(values, float(seen.numel() * self.dist.world_size))
        if n != 0:  # after the first n collects: the reduced stats, at no extra cost
            self._check_stats_finite(stats, CHECKED_ROLLOUT_STATS, f"collect {self.collects}")
        return stats

    def _check_buffer_finite(self) -> None:
        check_buffer_finite(self.buffer, type(self.env).__name__, self.collects)

    def _check_stats_finite(self, stats: dict[str, float], names: tuple[str, ...], where: str) -> None:
        """:func:`~rl8.ppo.finite.check_stats_finite`, naming envs and steps when the last collect's
        observations or rewards are the cause (unless ``check_finite_collects=0``)."""
        find_cause = self._check_buffer_finite if self.hparams.check_finite_collects != 0 else None
        check_stats_finite(stats, names, where, self.env_steps, find_cause)

    # ----------------------------------------------------------------- update
    def _advantages(self) -> tuple[torch.Tensor, torch.Tensor]:
        hp, data, h = self.hparams, self.buffer.data, self.hparams.horizon
        rewards = data["rewards"][:, :h]
        if self.reward_normalizer is not None:
            rewards = self.reward_normalizer(rewards)
        terminated = truncated = final_values = None
        if self.env.episodic:
            terminated, truncated = data["terminated"][:, :h], data["truncated"][:, :h]
            final_values = _final_values(self.policy, self.buffer, self.carry, truncated, self._autocast())
        return compute_gae(
            rewards, data["values"], gamma=hp.gamma, gae_lambda=hp.gae_lambda,
            terminated=terminated, truncated=truncated, final_values=final_values,
        )

    def update(self) -> dict[str, float]:
        """Run the PPO update on the last collect's buffer (:meth:`collect` then ``update`` is
        one training iteration; :meth:`rl8.Trainer.step` does both and logs them).

        Computes GAE advantages (stopping at ``terminated``, bootstrapping from the value of
        ``final_obs`` at ``truncated``), then ``num_sgd_iters`` passes of minibatch SGD on the
        clipped surrogate, (optionally clipped) value loss and entropy bonus.

        Returns:
            Update stats: ``losses/{policy,vf,entropy,total}``,
            ``monitors/{kl_div,clip_fraction,explained_variance,grad_norm}``,
            ``coefficients/{entropy,vf,lr}``; with ``collect_mode="overlap"`` also
            ``monitors/policy_lag`` (updates between the weights that collected the buffer
            and those at the start of this update: 0 for the first update, then 1).

        Raises:
            NonFiniteError: ``losses/total`` or ``monitors/grad_norm`` (the latter only without a
                gradient scaler) is NaN or inf (an :class:`~rl8.envs.base.EnvOutputError` when the
                collect's observations or rewards are the cause); the message names the stat and
                step.
        """
        if self.collects == 0:
            raise RuntimeError("PPO.update() needs a collect() first: the rollout buffer is empty")
        hp = self.hparams
        policy_lag = self.steps - self._behaviour_version  # updates since the buffer's weights
        with torch.no_grad():
            advantages, returns = self._advantages()
            old_values = self.buffer.data["values"][:, : hp.horizon]
            explained_variance = 1 - (returns - old_values).var() / returns.var().clamp(min=1e-8)
        # rows: transitions, or for recurrent models seq_len-step sequences with their state
        samples = self.buffer.training_samples(advantages, returns)
        if self.advantage_weights is not None:  # for this update only
            samples["advantage_weights"] = self.advantage_weights.reshape(-1)
            self.advantage_weights = None
        lr = self.lr_schedule(self.env_steps)
        entropy_coeff = self.entropy_coeff_schedule(self.env_steps)
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        params = [p for p in self.policy.parameters() if p.requires_grad]
        num_minibatches = samples.batch_size[0] * self.seq_len // self.minibatch_size
        monitors, grad_norms = [], []  # per minibatch; per optimizer step
        # accumulate_grads: one optimizer step per pass, on the minibatches' mean loss
        accumulate = num_minibatches if hp.accumulate_grads else 1
        for _ in range(hp.num_sgd_iters):
            passes = _minibatches(samples, num_minibatches, hp, self.seq_len, self.dist, self.generator)
            for j, minibatch in enumerate(passes):
                if j % accumulate == 0:
                    self.optimizer.zero_grad()
                loss, minibatch_monitors = _minibatch_loss(self.policy, minibatch, hp, entropy_coeff, self._autocast())
                _backward(loss if accumulate == 1 else loss / accumulate, self.grad_scaler)
                if (j + 1) % accumulate == 0:
                    grad_norms.append(_optimizer_step(self.optimizer, self.grad_scaler, params, self.dist, hp))
                monitors.append(minibatch_monitors)
                if _kl_exceeds_target(minibatch_monitors["kl_div"], hp.target_kl_div, self.dist):
                    break
            else:
                continue
            break  # KL early stop
        if self.policy.obs_normalizer is not None:
            obs = self.buffer.data["obs"][:, : hp.horizon]
            self.policy.obs_normalizer.update(obs, batch_dims=2, all_reduce=self.dist.all_reduce_ if self.dist.enabled else None)
        self.steps += 1
        if not grad_norms:  # a KL stop before the first accumulated optimizer step
            grad_norms.append(torch.zeros((), device=self.device))
        stats = _update_stats(self.dist, monitors, grad_norms, explained_variance, hp.vf_coeff, entropy_coeff, lr)
        if self.collector is not None:
            stats["monitors/policy_lag"] = float(policy_lag)
        checked = CHECKED_UPDATE_STATS if self.grad_scaler is None else ("losses/total",)
        self._check_stats_finite(stats, checked, f"update step {self.steps}")
        return stats

    def step(self) -> dict[str, float]:
        """Deprecated name of :meth:`update` (it was easy to confuse with
        :meth:`rl8.Trainer.step`, which collects and updates)."""
        warnings.warn("PPO.step() is renamed PPO.update()", DeprecationWarning, stacklevel=2)
        return self.update()

    # ----------------------------------------------------------------- eval
    @torch.no_grad()
    def evaluate(
        self,
        env: Env | None = None,
        *,
        env_config: dict[str, Any] | None = None,
        deterministic: bool = True,
        num_steps: int | None = None,
    ) -> Stats:
        """Run the policy without touching training state (buffer, counters, normalisers).

        Args:
            env: A dedicated eval env (see :func:`make_env`); it is reset first. ``None``
                uses the training envs, which is only allowed when they are about to be reset
                anyway (before the first collect, or when ``horizons_per_env_reset > 0`` and the
                next collect resets them); the next training collect then resets them again.
            env_config: Env parameters for the eval reset (over ``hparams.env_config``).
            deterministic: Act with the distributions' modes.
            num_steps: Steps per env; default ``horizon``. For episodic envs every episode
                that ends within them is counted.

        Returns:
            The rollout stats of :meth:`collect` (without an ``eval/`` prefix); here
            ``rollout/reward_sum_*`` sum each env's rewards over the ``num_steps`` steps.
        """
        hp = self.hparams
        if env is None:
            if not self.next_collect_resets:
                raise _eval_on_training_envs_error(hp.horizons_per_env_reset, self.collects)
            env = self.env
            self._reset_envs_later()  # the next training collect resets the envs
        config = {**hp.env_config, **(env_config or {})}
        obs = env.reset(config=config or None)
        validate_reset_output(obs, env)
        with self._autocast(), self.policy.rollout():
            run = run_policy(self.policy, env, obs, num_steps=num_steps or hp.horizon,
                             deterministic=deterministic, generator=self.eval_generator)
            steps = [(step.rewards, step.done) for step in run]
        records = env.pop_episode_records()
        rewards = torch.stack([r for r, _ in steps], 1).to(self.device)
        dones = torch.stack([d for _, d in steps], 1).to(self.device) if env.episodic else None
        episode_sums = None if dones is None else EpisodeTracker(env.num_envs, self.device).advance(rewards, dones)
        env_episode_sums = records.stat_sums(self.device) if records is not None else None
        return rollout_stats(self.dist, rewards, episode_sums, env_episode_sums=env_episode_sums)[0]

    def _reset_envs_later(self) -> None:
        """Make the next :meth:`collect` reset every env first (in overlap mode: wait for the
        rollout in flight and drop it), so the training envs are free until then."""
        if self.collector is not None:
            self.collector.discard()
        self._obs = None

    # ----------------------------------------------------------------- state
    def state_dict(self) -> dict[str, Any]:
        """Everything needed to continue training exactly: see ``docs/checkpoints.md``.

        Holds only tensors and plain Python values, so it loads with
        ``torch.load(weights_only=True)``. In overlap mode it first waits for the rollout in
        flight, which it includes (``"overlap"``): a resumed run hands it over at its first
        collect, exactly as the uninterrupted run does.
        """
        self._settle()
        return {
            "hparams": self.hparams.to_plain(),
            "seed": self.seed,
            "policy": self.policy.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "grad_scaler": self.grad_scaler.state_dict() if self.grad_scaler is not None else None,
            "reward_normalizer": self.reward_normalizer.state_dict() if self.reward_normalizer is not None else None,
            "counters": {name: getattr(self, name) for name in _COUNTERS},
            "recurrent": self._env_carry.state_dict(),
            **self.episodes.state_dict(),
            **_env_state(self.env, self._obs),
            "rng": _rng_state(self.generator, self.eval_generator),
            "overlap": self.collector.state_dict() if self.collector is not None else None,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore :meth:`state_dict` (the hyper-parameters must already match)."""
        if self.collector is not None:
            self.collector.discard()
        self.seed = int(state["seed"])
        self.policy.load_state_dict(state["policy"])
        self.optimizer.load_state_dict(state["optimizer"])
        if self.grad_scaler is not None and state.get("grad_scaler"):
            self.grad_scaler.load_state_dict(state["grad_scaler"])
        if self.reward_normalizer is not None and state.get("reward_normalizer") is not None:
            self.reward_normalizer.load_state_dict(state["reward_normalizer"])
        for name in _COUNTERS:
            setattr(self, name, int(state["counters"][name]))
        self.episodes.load_state_dict(state)
        self._env_carry.load_state_dict(state.get("recurrent"))
        self._obs = _load_env_state(self.env, state, self.device)
        self._validated = False  # the first step after a resume is checked like any first step
        _load_rng_state(state["rng"], self.generator, self.eval_generator)
        if self.collector is not None and state.get("overlap") is not None:
            self.collector.load_state_dict(state["overlap"], self._obs)
            self._behaviour_version = self.steps  # the collector's rollout (if any) brings its own

    def close(self) -> None:
        """Stop collecting in the background (overlap mode): wait for the rollout in flight and
        join its thread. A rollout that finished is kept for the next :meth:`collect` (its error,
        if it failed, raised there), so closing loses nothing and the object stays usable. The
        training envs stay open (``algo.env.close()`` closes them). Idempotent; a no-op in sync
        mode. :class:`rl8.Trainer` calls it when it closes."""
        if self.collector is not None:
            self.collector.join()

    # ----------------------------------------------------------------- misc
    def __repr__(self) -> str:
        return f"PPO(env={self.env!r}, device={self.device}, policy={self.policy.model_cls.__name__})"
