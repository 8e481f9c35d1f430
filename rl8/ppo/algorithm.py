"""Proximal Policy Optimization over batched environments: :meth:`PPO.collect` fills the rollout
buffer, :meth:`PPO.update` computes GAE advantages and runs minibatch SGD on the PPO loss."""

from __future__ import annotations

import contextlib
import secrets
import warnings
from collections.abc import Callable, Iterator, Mapping
from typing import Any, ClassVar

import torch
from tensordict import TensorDict, TensorDictBase

from rl8.envs.base import Env, ReadyEnvs, validate_log, validate_reset_output
from rl8.envs.episodes import EpisodeTracker
from rl8.envs.tasks import is_task_spec
from rl8.policies.policy import Policy
from rl8.policies.runner import run_policy
from rl8.ppo import presets
from rl8.ppo.buffer import (
    MIN_SLOT_BYTES,
    RecurrentCarry,
    RolloutBuffer,
    RolloutCarry,
    buffer_allocation,
    check_buffer_fits,
    compute_gae,
    make_rollout_buffer,
    minibatches,
)
from rl8.ppo.collectors import Collector, SyncCollector
from rl8.ppo.compiled import (
    CompiledLossStep,
    CompiledSteps,
    FusedStep,
    FusedTrainStep,
    fused_step_problem,
)
from rl8.ppo.distributed import DistContext, agree_on_run_seed, derive_seed, rank_device
from rl8.ppo.finite import (
    CHECKED_ROLLOUT_STATS,
    CHECKED_UPDATE_STATS,
    NonFiniteError,
    check_buffer_finite,
    check_stats_finite,
)
from rl8.ppo.hparams import HParams
from rl8.ppo.losses import PPOLoss, make_optimizer, ppo_loss
from rl8.ppo.overlap import OverlapCollector
from rl8.ppo.precision import choose_amp_dtype
from rl8.ppo.resolve import DISTRIBUTION, MODEL, resolve
from rl8.ppo.rewards import RewardNormalizer
from rl8.ppo.rnd import RandomNetworkDistillation
from rl8.ppo.rollout import (
    env_hparams,
    env_state,
    given_env,
    load_env_state,
    make_env,
    rank_hparams,
    rollout,
    rollout_ready_envs,
    second_instance_problem,
)
from rl8.ppo.stats import Stats, intrinsic_moments, intrinsic_stats, rollout_stats, update_stats
from rl8.ppo.symmetry import Symmetry, augmentation_env
from rl8.ppo.update_step import (
    EagerStep,
    UpdateExtension,
    UpdateStep,
    optimizer_step,
    set_lr,
)

__all__ = ["NonFiniteError", "PPO", "PresetHint", "check_env_configs", "make_env"]

#: The counters a checkpoint stores (``counters``), by their stored name: the attribute's.
_COUNTERS = {
    "env_steps": "env_steps",
    "env_resets": "env_resets",
    "collects": "collects",
    "steps": "updates",
}
_UNTUNED_HPARAMS = {"seed", "device"}
_STEPS_RENAMED = (
    "PPO.steps is renamed PPO.updates (the number of update() calls; env_steps counts transitions)"
)


class _SB3Name:
    """A name of Stable-Baselines3's PPO that rl8's has not (``learn``, ``PPO.load``): reading it,
    on the class or an object, is an AttributeError saying rl8's way, ``pointer``."""

    def __init__(self, pointer: str) -> None:
        self.pointer = pointer

    def __set_name__(self, owner: type, name: str) -> None:
        self.name = name

    def __get__(self, obj: Any, owner: type) -> Any:
        where = f"type object {owner.__name__!r}" if obj is None else f"{owner.__name__!r} object"
        raise AttributeError(
            f"{where} has no attribute {self.name!r}: {self.pointer}",
            name=self.name,
            obj=owner if obj is None else obj,
        )


def _seed_and_device(hparams: Mapping[str, Any]) -> tuple[int | None, torch.device]:
    """The ``seed`` hyper-parameter as given (checked) and this rank's device: ``device``
    resolved, under torchrun with CUDA ``cuda:LOCAL_RANK`` (:func:`~rl8.ppo.distributed.rank_device`)."""
    probe = HParams.from_kwargs(**{k: hparams[k] for k in ("seed", "device") if k in hparams})
    return probe.seed, torch.device(rank_device(probe.resolved_device()))


class PPO:
    """PPO with a preallocated rollout buffer over batched environments.

    Args:
        env: An :class:`rl8.Env` subclass (built with ``num_envs`` and ``horizon``), a gymnasium
            id such as ``"CartPole-v1"``, a named task (``"mjlab:<task id>"``), a callable that
            makes a gymnasium env, or an env already built (an ``rl8.Env``, an rsl_rl ``VecEnv``,
            a torch-batched gymnasium vector env) or a callable returning one, called with
            ``device`` (this rank's device) and ``seed`` (:attr:`env_seed`) where it has such
            parameters: ``num_envs`` and ``device`` are then the env's (``docs/simulators.md``).
        **hparams: Hyper-parameters, see :class:`rl8.HParams` (an unknown name is an error).

    Attributes:
        hparams: The frozen, validated :class:`~rl8.HParams`.
        seed: The run's seed (``hparams.seed``, else drawn by rank 0 for every rank): the model's.
        env_seed: This rank's seed of the envs (a named task's or a factory's simulation, the
            first reset) and of the sampling: ``derive_seed(seed, rank)``, ``seed`` on rank 0.
        device: This rank's torch device (under torchrun with CUDA ``cuda:LOCAL_RANK``).
        env: The batched env instance.
        policy: The :class:`~rl8.Policy` (model + distribution + normaliser).
        optimizer: The torch optimizer.
        buffer: The :class:`~rl8.ppo.buffer.RolloutBuffer`.
        amp_dtype: The forward passes' autocast dtype (``torch.float32``: none; see ``enable_amp``).
        compiled: With ``compile=True``, the :class:`~rl8.ppo.compiled.CompiledSteps`; else ``None``.
        rollout_loop: The rollout loop of this env, chosen here: :func:`~rl8.ppo.rollout.rollout`,
            or :func:`~rl8.ppo.rollout.rollout_ready_envs` for an env with the ``ReadyEnvs``
            interface (the pool).
        collector: What :meth:`collect` hands the buffer's filling to, chosen here (a
            :class:`~rl8.ppo.collectors.Collector`): a :class:`~rl8.ppo.collectors.SyncCollector`,
            with ``collect_mode="overlap"`` the :class:`~rl8.ppo.overlap.OverlapCollector`.
        update_step: What each minibatch of :meth:`update` does to the weights, chosen here: an
            :class:`~rl8.ppo.update_step.EagerStep`, or with ``compile=True`` a
            :class:`~rl8.ppo.compiled.FusedStep` or :class:`~rl8.ppo.compiled.CompiledLossStep`.
        extensions: The update's extensions (:class:`~rl8.ppo.update_step.UpdateExtension`):
            :attr:`rnd` and :attr:`symmetry` where they are on, in that order.
        minibatch_size: Transitions per minibatch (:meth:`HParams.minibatch_size_for <rl8.HParams.minibatch_size_for>`).
        env_steps: Env transitions collected so far (all envs of every rank: the whole job).
        env_resets: Times PPO reset all envs.
        collects: Number of :meth:`collect` calls.
        updates: Number of :meth:`update` calls (a checkpoint's ``counters["steps"]``); the
            deprecated name :attr:`steps` still answers. (``env_steps`` counts transitions, a
            Trainer step is one collect and one update, ``profiling/step_ms`` times the update.)
        behaviour_version: The :attr:`updates` count of the weights that collected the buffer.
        advantage_weights: ``None``, or ``[num_envs, horizon]`` weights of the (normalised)
            advantages in the next :meth:`update` only (importance weights of actors).
        symmetry: With hparam ``symmetry``, the :class:`~rl8.ppo.symmetry.Symmetry` extension
            (mirrored minibatches, mirror loss); else ``None``.
        rnd: With hparam ``rnd``, the :class:`~rl8.ppo.rnd.RandomNetworkDistillation` extension;
            else ``None``.
        intrinsic_rewards: With hparam ``rnd``, the last collect's weighted intrinsic rewards
            ``[num_envs, horizon]``, which the next :meth:`update` adds to the env's; else ``None``.
    """

    #: The name checkpoints record (``algo.algorithm``) and the hyper-parameters' class.
    algorithm: ClassVar[str] = "PPO"
    hparams_cls: ClassVar[type[HParams]] = HParams

    def __init__(
        self, env: type[Env] | str | Callable[..., Any] | Any, /, *extra: Any, **hparams: Any
    ) -> None:
        if extra:  # Stable-Baselines3's PPO("MlpPolicy", "CartPole-v1")
            raise TypeError(
                f"PPO takes one positional argument, the env, and hyper-parameters by keyword; got "
                f"PPO({', '.join(map(repr, (env, *extra)))}). Stable-Baselines3's PPO('MlpPolicy', env) is "
                f"rl8's PPO(env) (an MLP by default; another model: model_cls=..., model_config=...)"
            )
        self.dist = DistContext()
        # the run's seed and the rank's, and the rank's device, before any env is built: a
        # factory and a named task's simulator get them (one simulation per rank under torchrun)
        given_seed, device = _seed_and_device(hparams)
        self.seed = given_seed if given_seed is not None else agree_on_run_seed(secrets.randbits(31))
        # the model starts from the run's seed (every rank alike); envs and sampling from the rank's
        self.env_seed = derive_seed(self.seed, self.dist.global_rank)
        # an env given built (or made by a factory, on this rank's device and with its seed)
        built = given_env(env, hparams.get("env_kwargs"), device=device, seed=self.env_seed)
        env_hp = env_hparams(built, hparams) if built is not None else {}
        given = self.hparams_cls.from_kwargs(**{**hparams, **env_hp})
        self.hparams = hp = rank_hparams(given)
        self.device = hp.resolved_device() if built is not None else device
        self.dist.check_same(
            "hparams",
            {
                k: repr(v)
                for k, v in given.to_plain().items()
                if k not in ("device", "check_finite_collects")
            },
        )
        if self.dist.is_main and self.algorithm == "PPO" and not set(hparams) - _UNTUNED_HPARAMS:
            _hint_preset(env)
        self.env_spec = env
        # The envs and the model's initial weights draw from torch's global RNG, seeded here with
        # the run's seed and restored afterwards: building a PPO leaves the user's stream alone.
        with seeded_global_rng(self.seed, self.device):
            check_buffer_fits(
                hp.num_envs, hp.horizon, self.device, MIN_SLOT_BYTES
            )  # before the env allocates per env
            with buffer_allocation(hp.num_envs, hp.horizon, None):
                self.env = (
                    built
                    if built is not None
                    else make_env(
                        env,
                        hp.num_envs,
                        hp.horizon,
                        device=self.device,
                        env_kwargs=self._rank_env_kwargs(env),
                        seed=self.env_seed,
                    )
                )
            self.policy = Policy(
                self.env.observation_space,
                self.env.action_space,
                model_cls=resolve(hp.model_cls, MODEL, field="hparam model_cls"),
                model_config=hp.model_config
                if hp.obs_groups is None
                else {**hp.model_config, "obs_groups": hp.obs_groups},
                distribution_cls=resolve(
                    hp.distribution_cls, DISTRIBUTION, field="hparam distribution_cls"
                ),
                normalize_observations=hp.normalize_observations,
                device=self.device,
            )
            self.rnd = (  # its random target network from the run's seed
                None
                if hp.rnd is None
                else RandomNetworkDistillation(
                    hp.rnd,
                    self.env.observation_space,
                    step_dt=getattr(self.env, "step_dt", None),
                    device=self.device,
                    average_gradients=self.dist.average_gradients,
                    all_reduce=self._sum_over_ranks,
                )
            )
        self.dist.broadcast_module(self.policy)
        if self.rnd is not None:
            self.dist.broadcast_module(self.rnd)
        self.amp_dtype = choose_amp_dtype(self.device, hp.enable_amp)
        self.symmetry = (
            None
            if hp.symmetry is None
            else Symmetry(hp.symmetry, augmentation_env(self.env), self.policy, autocast=self._autocast)
        )
        # the update's extensions, in the order they see each minibatch (RND's before symmetry's copies)
        self.extensions: tuple[UpdateExtension, ...] = tuple(
            ext for ext in (self.rnd, self.symmetry) if ext is not None
        )
        self.intrinsic_rewards: torch.Tensor | None = None
        # Action sampling and minibatch shuffling draw from this object's own generator, so
        # two PPO objects (or user code) in one process never disturb each other's streams.
        self.generator = torch.Generator(device=self.device).manual_seed(self.env_seed)
        self.eval_generator = torch.Generator(device=self.device).manual_seed(
            derive_seed(self.env_seed, 1)
        )
        self.optimizer = make_optimizer(
            hp.optimizer_cls,
            self.policy.parameters(),
            lr=hp.lr,
            optimizer_kwargs=hp.optimizer_kwargs,
            device=self.device,
        )
        self.recurrent = self.policy.recurrent
        self.seq_len = (hp.seq_len or hp.horizon) if self.recurrent else 1
        self.minibatch_size = hp.minibatch_size_for(self.seq_len)
        self.buffer = self._make_buffer()
        self.carry = self._make_carry(self.policy, self.buffer)
        self.reward_normalizer = (
            RewardNormalizer(hp.num_envs, hp.gamma, device=self.device) if hp.normalize_rewards else None
        )
        self.lr_schedule = hp.lr_at()
        self.entropy_coeff_schedule = hp.entropy_coeff_at()
        self.grad_scaler = torch.amp.GradScaler("cuda") if self.amp_dtype == torch.float16 else None
        self.compiled = self._make_compiled() if hp.compile else None
        self.update_step = self._make_update_step()
        self.env_steps = self.env_resets = self.collects = self.updates = 0
        self._obs: torch.Tensor | TensorDictBase | None = None
        self._validated = False
        self.episodes = EpisodeTracker(hp.num_envs, self.device)
        # the rollout loop of this env and the collector, chosen once
        self.rollout_loop = rollout_ready_envs if isinstance(self.env, ReadyEnvs) else rollout
        self.collector: Collector = SyncCollector(self._rollout, self.buffer, self.carry, self.generator)
        if hp.collect_mode == "overlap":  # the actor side: its own buffer, carry and generator
            generator = torch.Generator(device=self.device).manual_seed(derive_seed(self.env_seed, 2))
            self.collector = OverlapCollector(
                self.policy,
                self._make_buffer(),
                generator,
                run=self._rollout,
                make_carry=self._make_carry,
                learner_buffer=self.buffer,
            )
        self.behaviour_version = 0
        self.advantage_weights: torch.Tensor | None = None

    @classmethod
    def from_preset(cls, name: str, /, **overrides: Any) -> PPO:
        """PPO on the env of preset ``name`` with its tuned hyper-parameters (``rl8 train NAME``).

        Args:
            name: A preset's name (``rl8.presets.names()``), with or without ``preset:``.
            **overrides: Hyper-parameters over the preset's (a dict replaces the whole value).
        """
        config = presets.load(name)
        return cls(config["env"], **{**presets.hparams(config).to_dict(), **overrides})

    # ----------------------------------------------------------------- one iteration: collect, then update
    @torch.no_grad()
    def collect(self, *, env_config: dict[str, Any] | None = None, deterministic: bool = False) -> Stats:
        """Step the envs ``horizon`` times (after a reset when :attr:`next_collect_resets`),
        filling the rollout buffer; returns the rollout stats (docs/trainer.md, Metrics).
        In overlap mode the buffer gets the background rollout (docs/collection.md).

        Args:
            env_config: Env parameters if the envs are reset first (over ``hparams.env_config``).
            deterministic: Take the distributions' modes instead of sampling.

        Raises:
            EnvOutputError: NaN/inf in the observations or rewards (naming the envs and steps).
            NonFiniteError: The reduced reward stats are NaN/inf though every reward is finite.
        """
        k = self.hparams.horizons_per_env_reset
        done = self.collector.collect(
            self.policy,
            self.updates,
            self._obs,
            deterministic,
            reset_envs=(lambda: self.reset_envs(env_config=env_config))
            if self.next_collect_resets
            else None,
            resets_next=k > 0 and (self.collects + 1) % k == 0,
        )
        self._obs, self.behaviour_version = done.obs, done.version
        self._count_collect()
        return self._collect_stats()

    def update(self) -> dict[str, float]:
        """The PPO update on the last collect's buffer: GAE advantages, then ``num_sgd_iters``
        passes of minibatch SGD; returns the update stats (docs/trainer.md, Metrics).

        Raises:
            NonFiniteError: ``losses/total`` or ``monitors/grad_norm`` is NaN or inf.
        """
        if self.collects == 0:
            raise RuntimeError("PPO.update() needs a collect() first: the rollout buffer is empty")
        hp = self.hparams
        policy_lag = self.updates - self.behaviour_version  # updates since the buffer's weights
        samples, explained_variance = self._training_samples()
        entropy_coeff = self.entropy_coeff_schedule(self.env_steps)
        if hp.desired_kl is None:  # else the optimizer's lr, adapted minibatch by minibatch
            self._set_lr(self.lr_schedule(self.env_steps))
        num_minibatches = samples.batch_size[0] * self.seq_len // self.minibatch_size
        batches = minibatches(
            samples,
            num_minibatches,
            num_passes=hp.num_sgd_iters,
            seq_len=self.seq_len,
            shuffle=hp.shuffle_minibatches,
            normalize_advantages=hp.normalize_advantages_over if hp.normalize_advantages else None,
            dist=self.dist,
            generator=self.generator,
        )
        losses: list[PPOLoss] = []
        grad_norms: list[torch.Tensor] = []  # one per optimizer step
        extension_losses: dict[str, list[torch.Tensor]] = {e.loss_name: [] for e in self.extensions}
        for j, minibatch in enumerate(batches):
            extra_loss = None  # the extensions' terms of PPO's loss
            for extension in self.extensions:
                minibatch, extension_loss, term = extension.minibatch_step(minibatch)
                extension_losses[extension.loss_name].append(extension_loss)
                if term is not None:
                    extra_loss = term if extra_loss is None else extra_loss + term
            # PPO's loss (policy, value, entropy: _minibatch_loss), backward, clip, optimizer step
            loss, grad_norm = self.update_step(minibatch, entropy_coeff, extra_loss, j)
            losses.append(loss)
            if grad_norm is not None:
                grad_norms.append(grad_norm)
            if hp.target_kl_div is not None and self._mean_over_ranks(loss.approx_kl) > hp.target_kl_div:
                break  # the approximate KL left target_kl_div: the update stops early
        self._update_obs_normalizer()
        for extension in self.extensions:  # after the update, as rsl_rl's
            extension.after_update(self.buffer.data["obs"][:, : hp.horizon])
        self.updates += 1
        if not grad_norms:  # a KL stop before the first accumulated optimizer step
            grad_norms.append(torch.zeros((), device=self.device))
        stats = update_stats(
            self.dist,
            losses,
            grad_norms,
            explained_variance,
            hp.vf_coeff,
            entropy_coeff,
            self.optimizer.param_groups[0]["lr"],
            {e.loss_name: (extension_losses[e.loss_name], e.loss_coeff) for e in self.extensions},
        )
        stats.update(self.collector.update_stats(policy_lag))  # overlap: monitors/policy_lag
        stats.update(self.update_step.stats())  # compile=True: profiling/compile_ms, once
        checked = CHECKED_UPDATE_STATS if self.grad_scaler is None else ("losses/total",)
        self._check_stats_finite(stats, checked, f"update step {self.updates}")
        return stats

    @property
    def steps(self) -> int:
        """Deprecated name of :attr:`updates`, the number of :meth:`update` calls."""
        warnings.warn(_STEPS_RENAMED, DeprecationWarning, stacklevel=2)
        return self.updates

    @steps.setter
    def steps(self, value: int) -> None:
        warnings.warn(_STEPS_RENAMED, DeprecationWarning, stacklevel=2)
        self.updates = value

    def step(self) -> dict[str, float]:
        """Deprecated name of :meth:`update`."""
        warnings.warn("PPO.step() is renamed PPO.update()", DeprecationWarning, stacklevel=2)
        return self.update()

    # ----------------------------------------------------------------- the update, step by step
    def _training_samples(self) -> tuple[TensorDict, torch.Tensor]:
        """The buffer's samples with advantages and returns; the explained variance of its values."""
        with torch.no_grad():
            advantages, returns = self.compute_advantages()
            old_values = self.buffer.data["values"][:, : self.hparams.horizon]
            explained_variance = 1 - (returns - old_values).var() / returns.var().clamp(min=1e-8)
        samples = self.buffer.training_samples(advantages, returns)
        if self.advantage_weights is not None:  # for this update only
            samples["advantage_weights"] = self.advantage_weights.reshape(-1)
            self.advantage_weights = None
        return samples, explained_variance

    def compute_advantages(self) -> tuple[torch.Tensor, torch.Tensor]:
        """GAE advantages and returns ``[num_envs, horizon]`` of the last collect, truncated steps
        bootstrapped (``update`` calls it; call it under ``torch.no_grad()``)."""
        hp, data, h = self.hparams, self.buffer.data, self.hparams.horizon
        rewards = data["rewards"][:, :h]
        if self.reward_normalizer is not None:
            rewards = self.reward_normalizer(rewards)
        if self.intrinsic_rewards is not None:  # hparam rnd's, with their own normalisation
            rewards = rewards + self.intrinsic_rewards
        terminated = truncated = truncated_values = None
        if self.env.episodic:
            terminated, truncated = data["terminated"][:, :h], data["truncated"][:, :h]
            index = truncated.nonzero()  # [K, 2]: env, step; their final_obs valued in one forward pass
            if index.shape[0]:
                with self._autocast():
                    values = self.policy.rollout_value(
                        data["final_obs"][index[:, 0], index[:, 1]], self.carry.after(index)
                    )
                truncated_values = torch.zeros(truncated.shape, device=self.device)
                truncated_values[index[:, 0], index[:, 1]] = values.float()
        return compute_gae(
            rewards,
            data["values"],
            gamma=hp.gamma,
            gae_lambda=hp.gae_lambda,
            terminated=terminated,
            truncated=truncated,
            final_values=truncated_values,
        )

    def _minibatch_loss(
        self,
        minibatch: TensorDict,
        entropy_coeff: float | torch.Tensor,
        *,
        entropy_grad: bool | None = None,
    ) -> PPOLoss:
        """:func:`~rl8.ppo.losses.ppo_loss` of the current policy on ``minibatch``; the entropy is
        differentiated if ``entropy_grad`` (default ``entropy_coeff != 0``, else only reported; the
        fused step, whose ``entropy_coeff`` is a tensor, passes it)."""
        hp = self.hparams
        if entropy_grad is None:
            entropy_grad = entropy_coeff != 0
        with self._autocast():
            logp, entropy, values = self.policy.evaluate(minibatch, entropy_grad=entropy_grad)
        old = {key: minibatch[key].reshape(-1) for key in ("logp", "values", "advantages", "returns")}
        return ppo_loss(
            logp.float(),
            values.float(),
            entropy.float(),
            old["logp"],
            old["advantages"],
            old["values"],
            old["returns"],
            clip_param=hp.clip_param,
            dual_clip_param=hp.dual_clip_param,
            vf_clip_param=hp.vf_clip_param,
            vf_coeff=hp.vf_coeff,
            entropy_coeff=entropy_coeff,
            collected=minibatch.get("collected", None),  # hparam symmetry's augmented minibatches
        )

    def _update_obs_normalizer(self) -> None:
        """After the update: a collect and its update see the same normalisation."""
        if self.policy.obs_normalizer is not None:
            obs = self.buffer.data["obs"][:, : self.hparams.horizon]
            self.policy.obs_normalizer.update(obs, batch_dims=2, all_reduce=self._sum_over_ranks)

    def _optimizer_step(self) -> torch.Tensor:
        """Average the gradients across ranks, clip and step; returns the norm before clipping."""
        return optimizer_step(
            self.optimizer,
            [p for p in self.policy.parameters() if p.requires_grad],
            self.hparams.max_grad_norm,
            average_gradients=self.dist.average_gradients,
            grad_scaler=self.grad_scaler,
        )

    def _make_update_step(self) -> UpdateStep:
        """The update step, chosen once: eager, or with compile=True the fused step where it is
        exact, else the eager step on the compiled loss."""
        hp = self.hparams
        options = dict(
            policy=self.policy,
            optimizer=self.optimizer,
            max_grad_norm=hp.max_grad_norm,
            # accumulate_grads: one optimizer step per pass, on the mean of its minibatches' losses
            minibatches_per_step=hp.batch_size // self.minibatch_size if hp.accumulate_grads else 1,
            desired_kl=hp.desired_kl,
            mean_over_ranks=self._mean_over_ranks,
            average_gradients=self.dist.average_gradients,
            grad_scaler=self.grad_scaler,
        )
        if self.compiled is None:
            return EagerStep(self._minibatch_loss, **options)
        compiled_loss = CompiledLossStep(self.compiled, **options)
        if self.compiled.train_step_kind == "fused":
            return FusedStep(self.compiled, fallback=compiled_loss)
        return compiled_loss

    def _make_compiled(self) -> CompiledSteps:
        """compile=True's steps: the fused minibatch step where it is exact, else the compiled loss."""
        problem = fused_step_problem(
            self.optimizer,
            grad_scaler=self.grad_scaler is not None,
            distributed=self.dist.enabled,
            accumulate_grads=self.hparams.accumulate_grads,
            recurrent=self.recurrent,
            mirror_loss=self.symmetry is not None and self.symmetry.use_mirror_loss,
        )
        fused = (
            FusedTrainStep(
                self.policy,
                self.optimizer,
                self._minibatch_loss,
                self.hparams.max_grad_norm,
                desired_kl=self.hparams.desired_kl,
            )
            if problem is None
            else None
        )
        return CompiledSteps(
            self.policy.rollout_step,
            self._minibatch_loss,
            self.device,
            fused_step=fused,
            fused_problem=problem,
        )

    def _rank_env_kwargs(self, env: Any) -> dict[str, Any]:
        """``env_kwargs`` as this rank builds the env: a named task's ``seed`` becomes the rank's
        (``derive_seed``: rank 0 keeps it), so that no two ranks simulate alike."""
        kwargs = dict(self.hparams.env_kwargs)
        if is_task_spec(env) and kwargs.get("seed") is not None:
            kwargs["seed"] = derive_seed(kwargs["seed"], self.dist.global_rank)
        return kwargs

    def _set_lr(self, lr: float) -> None:
        set_lr(self.optimizer, lr)

    @property
    def _sum_over_ranks(self) -> Callable[[torch.Tensor], Any] | None:
        """For running moments in data-parallel training: the in-place all-reduce, else ``None``."""
        return self.dist.all_reduce_ if self.dist.enabled else None

    def _mean_over_ranks(self, value: torch.Tensor) -> float:
        return (self.dist.all_reduce_(value.clone()) / self.dist.world_size).item()

    # ----------------------------------------------------------------- the collect, step by step
    def _rollout(
        self,
        policy: Policy,
        buffer: RolloutBuffer,
        carry: RolloutCarry,
        obs: torch.Tensor | TensorDictBase,
        generator: torch.Generator,
        deterministic: bool,
    ) -> torch.Tensor | TensorDictBase:
        obs = self.rollout_loop(
            policy,
            self.env,
            buffer,
            carry,
            obs,
            generator=generator,
            deterministic=deterministic,
            autocast=self._autocast(),
            check_first_step=not self._validated,
            rollout_step=None if self.compiled is None else self.compiled.rollout_step,
        )
        self._validated = True
        buffer.env_episodes = self.env.pop_episode_records()  # the episodes of this rollout
        buffer.env_log = validate_log(self.env.pop_log(), self.env)  # the simulator's own values
        return obs

    def _count_collect(self) -> None:
        self.env_steps += self.hparams.batch_size * self.dist.world_size  # every rank's envs
        self.collects += 1

    def _collect_stats(self) -> Stats:
        """The last collect's rollout stats, after its NaN/inf checks."""
        n = self.hparams.check_finite_collects
        if n == -1 or self.collects <= n:
            self._check_buffer_finite()
        h, normalizer = self.hparams.horizon, self.reward_normalizer
        rewards = self.buffer.data["rewards"][:, :h]
        dones = (
            self.buffer.data["terminated"][:, :h] | self.buffer.data["truncated"][:, :h]
            if self.env.episodic
            else None
        )
        episode_sums = self.episodes.advance(rewards, dones) if dones is not None else None
        records = self.buffer.env_episodes
        env_episode_sums = records.stat_sums(self.device) if records is not None else None
        # the normaliser's moments travel with the rollout stats (one transfer), merged on the host
        moments, current = {}, {}
        if normalizer is not None:
            seen = normalizer.advance(rewards, dones)
            moments, current = normalizer.returns_moments(seen)
        if self.rnd is not None:  # the intrinsic rewards of the states each step reached
            first_step = (self.collects - 1) * h  # rsl_rl's counter: env steps per env before
            self.intrinsic_rewards = self.rnd.rewards(
                self.buffer.data["obs"][:, 1 : h + 1],
                first_step,
                self._sum_over_ranks,
            )
            moments.update(intrinsic_moments(self.intrinsic_rewards))
        stats, values = rollout_stats(
            self.dist, rewards, episode_sums, moments, current, env_episode_sums, self.buffer.env_log
        )
        if normalizer is not None:
            normalizer.merge_returns_moments(values, float(seen.numel() * self.dist.world_size))
        if self.rnd is not None:
            stats.update(intrinsic_stats(values, rewards.numel() * self.dist.world_size))
        if n != 0:  # after the first n collects: the reduced stats only
            self._check_stats_finite(stats, CHECKED_ROLLOUT_STATS, f"collect {self.collects}")
        return stats

    def _check_buffer_finite(self) -> None:
        check_buffer_finite(self.buffer, type(self.env).__name__, self.collects)

    def _check_stats_finite(self, stats: dict[str, float], names: tuple[str, ...], where: str) -> None:
        find_cause = self._check_buffer_finite if self.hparams.check_finite_collects != 0 else None
        check_stats_finite(stats, names, where, self.env_steps, find_cause)

    @torch.no_grad()
    def collect_received(self, fill: Callable[[RolloutBuffer], None]) -> Stats:
        """A learner's collect (:mod:`rl8.training.actors`): ``fill`` writes the rollouts other
        processes collected into the buffer it is given; returns the stats as :meth:`collect`."""
        fill(self.buffer)
        self.buffer.env_episodes = None  # the actors report their envs' records themselves
        self.buffer.env_log = {}
        self.behaviour_version = self.updates
        self._validated = True
        self._count_collect()
        return self._collect_stats()

    # ----------------------------------------------------------------- envs
    @property
    def next_collect_resets(self) -> bool:
        """Whether the next :meth:`collect` resets every env first."""
        k = self.hparams.horizons_per_env_reset
        return self._obs is None or (k > 0 and self.collects % k == 0)

    def reset_envs(self, *, env_config: dict[str, Any] | None = None) -> torch.Tensor | TensorDictBase:
        """Reset every env (``env_config`` over the hparams'), dropping a background rollout;
        returns the envs' first observations."""
        self.collector.discard()
        config = {**self.hparams.env_config, **(env_config or {})}
        seed = self.env_seed if self.env_resets == 0 else None
        self._obs = self.env.reset(config=config or None, seed=seed)
        validate_reset_output(self._obs, self.env)
        self.env_resets += 1
        self.episodes.reset()
        if self.reward_normalizer is not None:
            self.reward_normalizer.reset()
        self._env_carry.reset()
        return self._obs

    @property
    def _env_carry(self) -> RolloutCarry:
        return self.collector.carry

    def _autocast(self) -> contextlib.AbstractContextManager:
        if self.amp_dtype == torch.float32:
            return contextlib.nullcontext()
        return torch.autocast(self.device.type, dtype=self.amp_dtype)

    def _make_carry(self, policy: Policy, buffer: RolloutBuffer) -> RolloutCarry:
        if not self.recurrent:
            return RolloutCarry()
        return RecurrentCarry(policy.initial_state, buffer, self.hparams.seqs_per_state_reset)

    def _make_buffer(self) -> RolloutBuffer:
        hp = self.hparams
        return make_rollout_buffer(
            self.env,
            self.policy,
            hp.num_envs,
            hp.horizon,
            self.device,
            seq_len=self.seq_len,
            buffers=2 if hp.collect_mode == "overlap" else 1,
        )

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
        """Run the policy without touching training state; returns the rollout stats of
        :meth:`collect` over the ``num_steps`` steps.

        Args:
            env: A dedicated eval env (see :func:`make_env`), reset first; ``None``: the training
                envs, only when the next collect resets them anyway (:attr:`next_collect_resets`),
                or at any time for an env that rl8 cannot build twice (the next collect resets it).
            env_config: Env parameters for the eval reset (over ``hparams.env_config``).
            deterministic: Act with the distributions' modes.
            num_steps: Steps per env; default ``horizon``.
        """
        hp = self.hparams
        if env is None:
            if not self.next_collect_resets and second_instance_problem(self.env, self.env_spec) is None:
                k = hp.horizons_per_env_reset
                raise RuntimeError(
                    "eval on the training envs is only possible at an env-reset boundary (horizons_per_env_reset="
                    f"{k}: the envs reset "
                    + ("only once, before the first collect" if k < 0 else f"every {k} collects")
                    + f"; {self.collects} collects done so far). Use a dedicated eval env "
                    "(Trainer(eval_num_envs=...)) to evaluate at any time."
                )
            env = self.env
            self.collector.discard()
            self._obs = None  # the next training collect resets the envs
        config = {**hp.env_config, **(env_config or {})}
        env.pop_log()  # what steps outside a collect logged is not this evaluation's
        obs = env.reset(config=config or None)
        validate_reset_output(obs, env)
        with self._autocast(), self.policy.rollout():
            run = run_policy(
                self.policy,
                env,
                obs,
                num_steps=num_steps or hp.horizon,
                deterministic=deterministic,
                generator=self.eval_generator,
            )
            steps = [(step.rewards, step.done) for step in run]
        records, env_log = env.pop_episode_records(), validate_log(env.pop_log(), env)
        rewards = torch.stack([r for r, _ in steps], 1).to(self.device)
        dones = torch.stack([d for _, d in steps], 1).to(self.device) if env.episodic else None
        episode_sums = (
            None if dones is None else EpisodeTracker(env.num_envs, self.device).advance(rewards, dones)
        )
        env_episode_sums = records.stat_sums(self.device) if records is not None else None
        return rollout_stats(
            self.dist, rewards, episode_sums, env_episode_sums=env_episode_sums, env_log=env_log
        )[0]

    # ----------------------------------------------------------------- state
    def state_dict(self) -> dict[str, Any]:
        """Everything needed to continue training exactly, as tensors and plain values
        (docs/checkpoints.md); in overlap mode the rollout in flight included."""
        self._obs = self.collector.finish(self._obs)  # a rollout in flight: kept for the next collect
        return {
            "algorithm": self.algorithm,
            "hparams": self.hparams.to_plain(),
            "seed": self.seed,
            "policy": self.policy.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "grad_scaler": self.grad_scaler.state_dict() if self.grad_scaler is not None else None,
            "reward_normalizer": self.reward_normalizer.state_dict()
            if self.reward_normalizer is not None
            else None,
            "counters": {stored: getattr(self, name) for stored, name in _COUNTERS.items()},
            "recurrent": self._env_carry.state_dict(),
            **self.episodes.state_dict(),
            **env_state(self.env, self._obs),
            "rng": {
                "generator": self.generator.get_state(),
                "eval_generator": self.eval_generator.get_state(),
                "torch": torch.get_rng_state(),
                "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else [],
            },
            "overlap": self.collector.state_dict(),
            "rnd": self.rnd.checkpoint() if self.rnd is not None else None,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore :meth:`state_dict` (the hyper-parameters must already match)."""
        self.collector.discard()
        self.seed = int(state["seed"])
        self.policy.load_state_dict(state["policy"])
        self.optimizer.load_state_dict(state["optimizer"])
        if self.rnd is not None:
            if state.get("rnd") is None:
                raise ValueError(
                    "PPO.load_state_dict: hparam rnd is on, but the state has no 'rnd' entry (it was "
                    "saved without RND); its predictor and target networks cannot be restored"
                )
            self.rnd.load_checkpoint(state["rnd"])
        if self.grad_scaler is not None and state.get("grad_scaler"):
            self.grad_scaler.load_state_dict(state["grad_scaler"])
        if self.reward_normalizer is not None and state.get("reward_normalizer") is not None:
            self.reward_normalizer.load_state_dict(state["reward_normalizer"])
        for stored, name in _COUNTERS.items():
            setattr(self, name, int(state["counters"][stored]))
        self.episodes.load_state_dict(state)
        self._env_carry.load_state_dict(state.get("recurrent"))
        self._obs = load_env_state(self.env, state, self.device)
        self._validated = False  # the first step after a resume is checked like any first step
        rng = state["rng"]
        self.generator.set_state(rng["generator"])
        self.eval_generator.set_state(rng["eval_generator"])
        torch.set_rng_state(rng["torch"])
        if rng["cuda"] and torch.cuda.is_available():
            torch.cuda.set_rng_state_all(rng["cuda"])
        if state.get("overlap") is not None:
            self.collector.load_state_dict(state["overlap"], self._obs)
            self.behaviour_version = self.updates  # the collector's rollout (if any) brings its own

    def close(self) -> None:
        """Overlap mode: join the rollout thread (its rollout kept for the next :meth:`collect`).
        The training envs stay open (``algo.env.close()``)."""
        self.collector.join()

    def __repr__(self) -> str:
        return f"PPO(env={self.env!r}, device={self.device}, policy={self.policy.model_cls.__name__})"

    # Stable-Baselines3's names: reading one is an AttributeError saying rl8's way (docs/migrating.md)
    learn = _SB3Name(
        "Stable-Baselines3's model.learn(total_timesteps) is rl8.Trainer(algo).learn(total_timesteps) "
        "(or Trainer(algo).run(max_env_steps=N), a total budget): the Trainer trains, tracks the run "
        "in MLflow and writes checkpoints (docs/trainer.md)"
    )
    predict = _SB3Name(
        "Stable-Baselines3's model.predict(obs) is algo.policy.predict(obs), which returns (actions, "
        "state) as SB3's does"
    )
    save = _SB3Name(
        "Stable-Baselines3's model.save(path) is rl8.save_policy(algo.policy, path) for acting "
        "(rl8.load_policy(path) reads it back); to resume training, a Trainer(algo) writes "
        "checkpoints (trainer.save_checkpoint(), and at the end of trainer.run())"
    )
    load = _SB3Name(
        "Stable-Baselines3's PPO.load(path) is rl8.load_policy(path) for acting (then "
        ".predict(obs)), or rl8.Trainer.from_checkpoint(path) to resume training (its PPO: "
        "trainer.algo)"
    )
    num_timesteps = _SB3Name("Stable-Baselines3's model.num_timesteps is algo.env_steps")
    get_env = _SB3Name("Stable-Baselines3's model.get_env() is algo.env (rl8's batched env)")


class PresetHint(UserWarning):
    """The hint, once per id, that a gymnasium id given to :class:`PPO` with default
    hyper-parameters has a tuned preset (``PPO.from_preset(id)``)."""


_hinted: set[str] = set()


@contextlib.contextmanager
def seeded_global_rng(seed: int, device: torch.device) -> Iterator[None]:
    """Inside: torch's global RNG (the CPU's, and ``device``'s when it is a CUDA device) seeded with
    ``seed``; afterwards: the states it had before, so that code outside never sees the seed."""
    cuda = [device] if device.type == "cuda" else []
    with torch.random.fork_rng(devices=cuda):
        torch.random.default_generator.manual_seed(seed)
        if cuda:
            with torch.cuda.device(device):
                torch.cuda.manual_seed(seed)
        yield


def check_env_configs(algo: PPO, configs: Mapping[str, Mapping[str, Any] | None]) -> None:
    """Reset a one-env CPU copy of ``algo``'s env with each env config (``{where: config}``, over
    ``hparams.env_config``), torch's RNG kept, so that a mistake is a ``ValueError`` naming where
    the config was given before training rather than at its first step."""
    if second_instance_problem(algo.env, algo.env_spec) is not None:
        return  # no second env: the training env reports its own config errors
    base = dict(algo.hparams.env_config or {})
    checks = {"hparams: env_config": base} if base else {}
    checks.update({where: {**base, **config} for where, config in configs.items() if config})
    if not checks:
        return
    with torch.random.fork_rng(devices=[]):
        try:
            env = make_env(
                algo.env_spec, 1, algo.hparams.horizon, device="cpu", env_kwargs=algo.hparams.env_kwargs
            )
        except Exception:  # noqa: BLE001 - the training env was built: let it report its own problems
            return
        with contextlib.closing(env):
            for where, config in checks.items():
                try:
                    env.reset(config=config, seed=0)
                except (KeyError, ValueError, TypeError) as exc:
                    message = str(exc.args[0]) if isinstance(exc, KeyError) and exc.args else str(exc)
                    raise ValueError(f"{where}: {message}") from None


def _hint_preset(env: Any) -> None:
    name = presets.for_env(env)
    if name is None or name in _hinted:
        return
    _hinted.add(name)
    warnings.warn(
        f"rl8: {name} has a tuned preset: PPO.from_preset({name!r}) / rl8 train {name} "
        "(PPO's default hyper-parameters are not tuned for it; see docs/results/index.md)",
        PresetHint,
        stacklevel=3,
    )
