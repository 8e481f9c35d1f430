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
import os
import secrets
import warnings
from collections.abc import Callable, Iterator
from typing import Any

import torch
from tensordict import TensorDict, TensorDictBase

from ._resolve import DISTRIBUTION, HPARAM_KINDS, MODEL, OPTIMIZER, is_dotted_path, qualified_name, resolve, resolve_env
from .buffer import RolloutBuffer, compute_gae
from .distributed import DistContext, derive_seed
from .episodes import EpisodeTracker
from .env import Env, EnvOutputError, find_nonfinite, validate_reset_output, validate_step_output
from .hparams import HParams
from .losses import ppo_loss
from .normalization import RewardNormalizer
from .policy import Policy
from .spaces import zeros_like_space
from .stats import Stats, reduce_stats

__all__ = ["NonFiniteError", "PPO", "make_env"]

#: Update stats checked for NaN/inf after every :meth:`PPO.update` (the grad norm only without a
#: gradient scaler: with one, an inf grad norm is a skipped step, not a failure).
_CHECKED_UPDATE_STATS = ("losses/total", "monitors/grad_norm")
#: Rollout stats checked for NaN/inf after every collect (they reduce every reward).
_CHECKED_ROLLOUT_STATS = ("rollout/reward_sum_mean", "rollout/reward_sum_std", "rewards/min", "rewards/max")


class NonFiniteError(FloatingPointError):
    """Training produced NaN or inf: a loss, the gradient norm or a rollout statistic.

    Raised by :meth:`PPO.update` and :meth:`PPO.collect`; the message names the stat, its value
    and the step. The optimizer step that produced it may already have made the parameters
    non-finite, so the Trainer never checkpoints them (resume from an earlier checkpoint).
    """


# Observations up to this size per step (all envs) are kept through a collect and stacked into
# the buffer once; bigger ones (images) are copied step by step, not held horizon times over.
_STACKED_OBS_MAX_BYTES = 1 << 20


# Bytes of one buffer slot (one env, one step) whatever the spaces: the float32 log-prob,
# value and reward.
_MIN_SLOT_BYTES = 12


def _device_memory(device: torch.device) -> int | None:
    """Total memory of ``device`` in bytes, or ``None`` where it cannot be told."""
    if device.type == "cuda":
        return torch.cuda.mem_get_info(device)[1]
    if device.type == "cpu" and hasattr(os, "sysconf"):
        try:
            return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
        except (ValueError, OSError):
            return None
    return None


def _space_bytes(space: Any) -> int:
    """Bytes of one value of ``space`` as rl8 stores it."""
    value = zeros_like_space(space, [1])
    tensors = value.values(True, True) if isinstance(value, TensorDictBase) else [value]
    return sum(t.nbytes for t in tensors)


def _buffer_size_error(hp: HParams, need: int, problem: str) -> ValueError:
    return ValueError(
        f"hparam num_envs, horizon: a rollout buffer of num_envs={hp.num_envs} envs x "
        f"(horizon={hp.horizon} + 1) steps needs about {need} bytes ({need / 2**30:.1f} GiB); "
        f"{problem}. Use fewer envs or a shorter horizon"
    )


def _check_buffer_fits(hp: HParams, device: torch.device, slot_bytes: int) -> None:
    """Refuse, before allocating anything, a buffer of ``slot_bytes`` per env and step that
    is larger than the whole memory of ``device`` (it could never be allocated)."""
    need = hp.num_envs * (hp.horizon + 1) * slot_bytes
    total = _device_memory(device)
    if total is not None and need > total:
        raise _buffer_size_error(hp, need, f"{device} has {total} bytes ({total / 2**30:.1f} GiB) in all")


@contextlib.contextmanager
def _allocation(hp: HParams, slot_bytes: int | None):
    """Re-raise a failed allocation (torch's allocators, ``MemoryError``) as an error naming
    ``num_envs``, ``horizon`` and the bytes of the buffer of ``slot_bytes`` per env and step;
    ``slot_bytes=None``: the allocation is the envs' own (their constructor), and the error
    names ``num_envs`` only. Other errors pass unchanged."""
    try:
        yield
    except (MemoryError, RuntimeError) as err:
        text = str(err).strip()
        out_of_memory = isinstance(err, (MemoryError, torch.cuda.OutOfMemoryError)) or (
            "can't allocate memory" in text or "out of memory" in text
        )
        if not out_of_memory:
            raise
        reason = text.splitlines()[-1] if text else type(err).__name__
        if slot_bytes is None:
            raise ValueError(f"hparam num_envs: building num_envs={hp.num_envs} envs ran out of memory "
                             f"({reason}). Use fewer envs") from err
        need = hp.num_envs * (hp.horizon + 1) * slot_bytes
        raise _buffer_size_error(hp, need, f"allocating memory failed ({reason})") from err


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


def _plain_hparams(hp: HParams) -> dict[str, Any]:
    """Hyper-parameters as plain values (classes as dotted paths), for checkpoints and MLflow."""
    out = {}
    for key, value in hp.to_dict().items():
        if key in HPARAM_KINDS:
            value = value if value is None or isinstance(value, str) else qualified_name(value)
        elif key == "device":
            value = str(value)
        out[key] = value
    return out


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
    if is_dotted_path(env):
        env = resolve_env(env)
    if isinstance(env, type) and issubclass(env, Env):
        return env(num_envs, horizon, device=device, **kwargs)
    if isinstance(env, str) or callable(env):
        from .envs.gymnasium import GymnasiumEnv, GymnasiumEnvFactory

        if isinstance(env, GymnasiumEnvFactory):
            return env(num_envs, horizon, device=device, **kwargs)

        return GymnasiumEnv(num_envs, horizon, device=device, env=env, **kwargs)
    raise TypeError(
        f"env: expected an rl8.Env subclass, a gymnasium id or a callable making a gymnasium "
        f"env, got {env!r}"
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
        buffer: The :class:`~rl8.buffer.RolloutBuffer`.
        minibatch_size: Transitions per minibatch of an update (see
            :meth:`HParams.minibatch_size_for <rl8.HParams.minibatch_size_for>`).
        env_steps: Env transitions collected so far (all envs together, of every rank in
            data-parallel training: schedules and ``env/steps`` count the whole job).
        env_resets: Times PPO reset all envs.
        collects: Number of :meth:`collect` calls.
        steps: Number of :meth:`update` calls (optimisation steps of the policy).

    Example:
        >>> from rl8 import PPO
        >>> from rl8.envs import CartPole
        >>> algo = PPO(CartPole, num_envs=64, horizon=16, seed=0)
        >>> rollout_stats = algo.collect()
        >>> update_stats = algo.update()
    """

    def __init__(self, env: type[Env] | str | Callable[..., Any], /, **hparams: Any) -> None:
        self.hparams = hp = HParams.from_kwargs(**hparams)
        self.device = hp.resolved_device()
        self.dist = DistContext()
        if hp.seed is not None:
            self.seed = hp.seed
        else:  # one seed for the whole run: every rank takes rank 0's
            seed = torch.tensor([secrets.randbits(31)], dtype=torch.int64)
            self.seed = int(self.dist.all_reduce_(seed, "max").item()) if self.dist.enabled else int(seed)
        # The model is initialised from the run's seed (the same on every rank); envs and
        # action sampling then use a seed derived from the run's seed and the rank.
        self.env_seed = derive_seed(self.seed, self.dist.rank)
        torch.manual_seed(self.seed)
        self.env_spec = env
        _check_buffer_fits(hp, self.device, _MIN_SLOT_BYTES)  # before the env allocates per env
        with _allocation(hp, None):
            self.env = make_env(env, hp.num_envs, hp.horizon, device=self.device, env_kwargs=hp.env_kwargs)
        self.policy = Policy(
            self.env.observation_space,
            self.env.action_space,
            model_cls=resolve(hp.model_cls, MODEL, field="hparam model_cls"),
            model_config=hp.model_config,
            distribution_cls=resolve(hp.distribution_cls, DISTRIBUTION, field="hparam distribution_cls"),
            normalize_observations=hp.normalize_observations,
            device=self.device,
        )
        self.dist.broadcast_module(self.policy)
        # Action sampling and minibatch shuffling draw from this object's own generator, so
        # two PPO objects (or user code) in one process never disturb each other's streams.
        self.generator = torch.Generator(device=self.device)
        self.generator.manual_seed(self.env_seed)
        self.eval_generator = torch.Generator(device=self.device)  # evaluate() samples from it
        self.eval_generator.manual_seed(derive_seed(self.env_seed, 1))
        torch.manual_seed(self.env_seed)
        optimizer_cls = resolve(hp.optimizer_cls, OPTIMIZER, field="hparam optimizer_cls")
        optimizer_kwargs = dict(hp.optimizer_kwargs)
        if optimizer_cls in (torch.optim.Adam, torch.optim.AdamW) and not {"fused", "foreach"} & set(optimizer_kwargs):
            # One fused kernel per parameter group instead of a loop of small ops: the same
            # maths, several times faster for the small networks PPO uses.
            optimizer_kwargs["fused"] = self.device.type in ("cpu", "cuda")
        try:
            self.optimizer = optimizer_cls(self.policy.parameters(), lr=hp.lr, **optimizer_kwargs)
        except (TypeError, ValueError) as err:
            raise ValueError(
                f"hparam optimizer_kwargs: {qualified_name(optimizer_cls)} refused {hp.optimizer_kwargs!r} "
                f"({err}); expected its keyword arguments: {_keyword_defaults(optimizer_cls)}"
            ) from err
        dist = self.policy.distribution_cls
        space = self.env.action_space
        self.recurrent = self.policy.recurrent
        self.seq_len = (hp.seq_len or hp.horizon) if self.recurrent else 1
        # transitions per minibatch: whole sequences of seq_len steps for recurrent models
        self.minibatch_size = hp.minibatch_size_for(self.seq_len)
        self._state = self.policy.initial_state(hp.num_envs)
        self._firsts = torch.zeros(hp.num_envs, dtype=torch.bool, device=self.device)
        self.sequences = 0
        action_shape, action_dtype = tuple(dist.raw_action_shape(space)), dist.raw_action_dtype(space)
        slot_bytes = (  # obs (and final_obs, flags), action, log-prob, value, reward
            _space_bytes(self.env.observation_space) * (2 if self.env.episodic else 1)
            + math.prod(action_shape) * action_dtype.itemsize + _MIN_SLOT_BYTES + 2 * self.env.episodic
        )
        _check_buffer_fits(hp, self.device, slot_bytes)
        with _allocation(hp, slot_bytes):
            self.buffer = RolloutBuffer(
                self.env.observation_space,
                action_shape,
                action_dtype,
                hp.num_envs,
                hp.horizon,
                device=self.device,
                episodic=self.env.episodic,
                state_example=self._state,
                seq_len=self.seq_len,
            )
        # views of the collected steps (column horizon holds only the last obs and value)
        h = hp.horizon
        self._rewards_view = self.buffer.data["rewards"][:, :h]
        # Columns written by ONE stack per collect instead of a copy per step: the loop keeps
        # the step's tensors (new ones each step: the env's outputs are never mutated later,
        # see docs/envs.md, and neither are the model's), then stacks them into the
        # time-major storage. Observations only while small: the loop holds horizon of them.
        buffer = self.buffer
        self._stacked = {  # obs and values include column horizon
            "values": buffer.time_major("values"),
            "rewards": buffer.time_major("rewards")[:h].unsqueeze(-1),
        }
        obs_steps = buffer.time_major("obs")
        if obs_steps is not None and obs_steps[0].nbytes <= _STACKED_OBS_MAX_BYTES:
            self._stacked["obs"] = obs_steps
        if self.env.episodic:
            self._terminated_view = self.buffer.data["terminated"][:, :h]
            self._truncated_view = self.buffer.data["truncated"][:, :h]
        self.reward_normalizer = (
            RewardNormalizer(hp.num_envs, hp.gamma, device=self.device) if hp.normalize_rewards else None
        )
        self.lr_schedule = hp.lr_at()
        self.entropy_coeff_schedule = hp.entropy_coeff_at()
        self.amp_dtype = torch.float16 if self.device.type == "cuda" else torch.bfloat16
        self.grad_scaler = (
            torch.amp.GradScaler("cuda") if hp.enable_amp and self.device.type == "cuda" else None
        )
        self.env_steps = 0
        self.env_resets = 0
        self.collects = 0
        self.steps = 0
        self._obs: torch.Tensor | TensorDictBase | None = None
        self._validated = False
        self.episodes = EpisodeTracker(hp.num_envs, self.device)

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

    def reset_envs(self, *, env_config: dict[str, Any] | None = None) -> None:
        """Reset every env (applying ``hparams.env_config`` updated with ``env_config``)."""
        config = {**self.hparams.env_config, **(env_config or {})}
        seed = self.env_seed if self.env_resets == 0 else None
        self._obs = self.env.reset(config=config or None, seed=seed)
        validate_reset_output(self._obs, self.env)  # once per reset: cheap
        self.env_resets += 1
        self.episodes.reset()
        if self.reward_normalizer is not None:
            self.reward_normalizer.reset()
        if self.recurrent:
            self._state = self.policy.initial_state(self.hparams.num_envs)
            self._firsts.zero_()

    # ----------------------------------------------------------------- collect
    @torch.no_grad()
    def collect(self, *, env_config: dict[str, Any] | None = None, deterministic: bool = False) -> Stats:
        """Step the envs ``horizon`` times, filling the rollout buffer in place.

        Envs are reset first when the reset rule says so (before the first collect, then
        every ``horizons_per_env_reset`` collects when that is positive).

        Args:
            env_config: Env parameters applied if the envs are reset before this collect
                (merged over ``hparams.env_config``).
            deterministic: Take the distributions' modes instead of sampling.

        Returns:
            Rollout stats (a :class:`~rl8.stats.Stats` dict; see ``docs/trainer.md``,
            Metrics): ``rollout/reward_sum_*`` (each env's sum of rewards over the ``horizon``
            steps), ``rewards/*`` (per step), and for episodic envs
            ``episodes/{return_mean,length_mean,count}``.

        Raises:
            EnvOutputError: NaN/inf in the observations or rewards (every value is checked
                during the first ``check_finite_collects`` collects; afterwards the reduced
                reward stats are, and a failure names the envs and steps).
            NonFiniteError: The reduced reward stats are NaN/inf though every reward is
                finite (an overflow).
        """
        hp = self.hparams
        if self.next_collect_resets:
            self.reset_envs(env_config=env_config)
        columns = self.buffer.columns
        policy, env = self.policy, self.env
        to_env_action, space = policy.distribution_cls.to_env_action, env.action_space
        generator = self.generator
        obs_col, actions_col, logp_col = columns["obs"], columns["actions"], columns["logp"]
        episodic = env.episodic
        if episodic:
            term_col, trunc_col, final_col = columns["terminated"], columns["truncated"], columns["final_obs"]
        recurrent = self.recurrent
        if recurrent:  # the recurrent additions: state per sequence start, episode starts
            state, firsts = self._state, self._firsts
            seq_len, k = self.seq_len, hp.seqs_per_state_reset
            firsts_col, states_buf, post_states_buf = columns["firsts"], self.buffer.states, self.buffer.post_states
        obs = self._obs
        stacked = self._stacked
        kept_obs: list[torch.Tensor] | None = [] if "obs" in stacked else None
        kept_values: list[torch.Tensor] = []
        kept_rewards: list[torch.Tensor] = []
        with self._autocast(), policy.rollout():
            for t in range(hp.horizon):
                if kept_obs is None:
                    obs_col[t].copy_(obs)
                else:
                    kept_obs.append(obs)
                if recurrent:
                    if t % seq_len == 0:
                        if k > 0 and self.sequences % k == 0:
                            state = policy.initial_state(hp.num_envs)
                        states_buf[:, t // seq_len] = state
                        self.sequences += 1
                    firsts_col[t].copy_(firsts)
                    dist, value, state = policy.step(obs, state, firsts)
                else:
                    dist, value = policy.distribution(obs)
                # written into the buffer rows (the env gets row t: it must not keep it)
                actions, _ = dist.sample_with_log_prob(
                    generator, deterministic=deterministic, out=(actions_col[t], logp_col[t])
                )
                kept_values.append(value)
                out = env.step(to_env_action(actions, space))
                if not self._validated:
                    validate_step_output(out, env)
                    self._validated = True
                kept_rewards.append(out["rewards"])
                if episodic:
                    term = out.get("terminated", None)
                    trunc = out.get("truncated", None)
                    if term is not None:
                        term_col[t].copy_(term)
                    if trunc is not None:
                        trunc_col[t].copy_(trunc)
                        final_col[t].copy_(out["final_obs"])
                    if recurrent:
                        post_states_buf[:, t] = state
                        firsts = (term_col[t] | trunc_col[t])[:, 0]
                obs = out["obs"]
            # column horizon: the last obs and its (bootstrap) value, stacked with the rest
            if recurrent:
                firsts_col[hp.horizon].copy_(firsts)
                kept_values.append(policy.sequence_value(obs, state, firsts))
                self._state, self._firsts = state, firsts
            else:
                kept_values.append(policy.value(obs))
            torch.stack(kept_values, out=stacked["values"])
            torch.stack(kept_rewards, out=stacked["rewards"])
            if kept_obs is None:
                obs_col[hp.horizon].copy_(obs)
            else:
                kept_obs.append(obs)
                torch.stack(kept_obs, out=stacked["obs"])
        self._obs = obs
        self.env_steps += hp.num_envs * hp.horizon * self.dist.world_size  # every rank's envs
        self.collects += 1
        n = hp.check_finite_collects
        if n == -1 or self.collects <= n:
            self._check_finite()
        rewards = self._rewards_view
        dones = None
        if episodic:
            dones = self._terminated_view | self._truncated_view
        # the normaliser's running returns advance on the device; their moments travel with
        # the rollout stats (one transfer) and are merged on the host
        seen = self.reward_normalizer.advance(rewards, dones) if self.reward_normalizer is not None else None
        stats = self._rollout_stats(rewards, dones, self.episodes, seen)
        if n != 0:  # after the first n collects: the reduced stats, at no extra cost
            self._check_finite_stats(stats, _CHECKED_ROLLOUT_STATS, f"collect {self.collects}")
        return stats

    def _check_finite_stats(self, stats: dict[str, float], names: tuple[str, ...], where: str) -> None:
        """Raise when one of the (already reduced) ``stats`` named is NaN or inf: an
        :class:`EnvOutputError` naming envs and steps when the last collect's observations or
        rewards are the cause (unless ``check_finite_collects=0``), else :class:`NonFiniteError`."""
        bad = [name for name in names if name in stats and not math.isfinite(stats[name])]
        if not bad:
            return
        if self.hparams.check_finite_collects != 0:
            self._check_finite()  # the env's data, with positions
        values = ", ".join(f"{name}={stats[name]}" for name in bad)
        raise NonFiniteError(
            f"non-finite {values} at {where} (env steps {self.env_steps}); training cannot "
            "go on from here: resume from the last checkpoint (e.g. with a lower lr or "
            "max_grad_norm) or find what makes the model or env produce NaN/inf"
        )

    def _check_finite(self) -> None:
        data = self.buffer.data
        for key in ("obs", "rewards"):
            bad = find_nonfinite(data[key][:, : self.hparams.horizon + (key == "obs")], batch_dims=2)
            if bad is not None:
                pairs = ", ".join(f"(env {i}, step {t})" for i, t in bad[:10].tolist())
                more = f" and {len(bad) - 10} more" if len(bad) > 10 else ""
                raise EnvOutputError(
                    f"{type(self.env).__name__}: non-finite values (NaN or inf) in {key!r} at "
                    f"{pairs}{more} during collect {self.collects} (set "
                    f"check_finite_collects=0 to turn this check off)"
                )

    @property
    def _all_reduce(self) -> Callable[[torch.Tensor], Any] | None:
        """In-place cross-rank sum for running statistics, or ``None`` in one process."""
        return self.dist.all_reduce_ if self.dist.enabled else None

    def _rollout_stats(
        self, rewards: torch.Tensor, dones: torch.Tensor | None, episodes: EpisodeTracker,
        seen: torch.Tensor | None = None,
    ) -> Stats:
        """Rollout stats of ``rewards`` ``[num_envs, T]`` (all ranks), read back in ONE transfer.

        ``dones``: where episodes ended (``None`` for infinite-horizon envs); ``episodes``
        advances over them. ``seen``: the reward normaliser's running returns of this collect
        (:meth:`RewardNormalizer.advance`), whose moments are read back with the stats and
        folded into its statistics.
        """
        f64 = torch.float64
        reward_sums = rewards.sum(1, dtype=f64)  # per env, over the rollout's steps
        sums = {  # (the sum of all rewards is the sum of the reward sums)
            "reward_sum": reward_sums.sum(),
            "reward_sum_sq": reward_sums.dot(reward_sums),
            "reward_sq": torch.linalg.vector_norm(rewards, dtype=f64).square(),
        }
        if dones is not None:
            sums.update(episodes.advance(rewards, dones))
        local = {}
        if seen is not None:
            normalizer_sums, local = self.reward_normalizer.returns_moments(seen)
            sums.update(normalizer_sums)
        ret_lo, ret_hi = reward_sums.aminmax()
        rew_lo, rew_hi = rewards.aminmax()
        values = reduce_stats(
            self.dist, sums=sums, local=local,
            mins={"rollout/reward_sum_min": ret_lo, "rewards/min": rew_lo},
            maxs={"rollout/reward_sum_max": ret_hi, "rewards/max": rew_hi},
        )
        world = self.dist.world_size
        out = Stats()
        for prefix, n, sum_sq in (
            ("rollout/reward_sum_", reward_sums.numel() * world, values["reward_sum_sq"]),
            ("rewards/", rewards.numel() * world, values["reward_sq"]),
        ):
            mean = values["reward_sum"] / n
            out[f"{prefix}min"] = values[f"{prefix}min"]
            out[f"{prefix}max"] = values[f"{prefix}max"]
            out[f"{prefix}mean"] = mean
            out[f"{prefix}std"] = max(sum_sq / n - mean * mean, 0.0) ** 0.5
        if dones is not None:
            count = values["episodes/count"]
            # NaN when no episode ended: stop conditions treat NaN as "not reached".
            out["episodes/return_mean"] = values["episodes/return_sum"] / count if count > 0 else float("nan")
            out["episodes/length_mean"] = values["episodes/length_sum"] / count if count > 0 else float("nan")
            out["episodes/count"] = count
        if seen is not None:
            self.reward_normalizer.merge_returns_moments(values, float(seen.numel() * world))
        return out

    # ----------------------------------------------------------------- update
    def _advantages(self) -> tuple[torch.Tensor, torch.Tensor]:
        hp = self.hparams
        data = self.buffer.data
        h = hp.horizon
        rewards = data["rewards"][:, :h]
        if self.reward_normalizer is not None:
            rewards = self.reward_normalizer(rewards)
        values = data["values"]
        terminated = truncated = final_values = None
        if self.env.episodic:
            terminated = data["terminated"][:, :h]
            truncated = data["truncated"][:, :h]
            final_values = self._final_values(truncated)
        return compute_gae(
            rewards, values, gamma=hp.gamma, gae_lambda=hp.gae_lambda,
            terminated=terminated, truncated=truncated, final_values=final_values,
        )

    def _final_values(self, truncated: torch.Tensor) -> torch.Tensor | None:
        """Values of ``final_obs`` at truncated steps, in one batched forward pass."""
        index = truncated.nonzero()
        if index.shape[0] == 0:
            return None
        final_obs = self.buffer.data["final_obs"][index[:, 0], index[:, 1]]
        with self._autocast():
            if self.recurrent:
                state = self.buffer.post_states[index[:, 0], index[:, 1]]
                no_reset = torch.zeros(index.shape[0], dtype=torch.bool, device=index.device)
                values = self.policy.sequence_value(final_obs, state, no_reset).float()
            else:
                values = self.policy.value(final_obs).float()
        out = torch.zeros(truncated.shape, device=values.device)
        out[index[:, 0], index[:, 1]] = values
        return out

    def update(self) -> dict[str, float]:
        """Run the PPO update on the last collect's buffer (:meth:`collect` then ``update`` is
        one training iteration; :meth:`rl8.Trainer.step` does both and logs them).

        Computes GAE advantages (stopping at ``terminated``, bootstrapping from the value of
        ``final_obs`` at ``truncated``), then ``num_sgd_iters`` passes of minibatch SGD on the
        clipped surrogate, (optionally clipped) value loss and entropy bonus.

        Returns:
            Update stats: ``losses/{policy,vf,entropy,total}``,
            ``monitors/{kl_div,clip_fraction,explained_variance,grad_norm}``,
            ``coefficients/{entropy,vf,lr}``.

        Raises:
            NonFiniteError: ``losses/total`` or ``monitors/grad_norm`` (the latter only
                without a gradient scaler) is NaN or inf; the message names the stat and the
                update step. (An :class:`EnvOutputError` instead when the collect's
                observations or rewards hold NaN/inf.)
        """
        if self.collects == 0:
            raise RuntimeError("PPO.update() needs a collect() first: the rollout buffer is empty")
        hp = self.hparams
        with torch.no_grad():
            advantages, returns = self._advantages()
            old_values = self.buffer.data["values"][:, : hp.horizon]
            explained_variance = 1 - (returns - old_values).var() / returns.var().clamp(min=1e-8)
        # rows: transitions, or for recurrent models seq_len-step sequences with their state
        samples = self.buffer.training_samples(advantages, returns)
        lr = self.lr_schedule(self.env_steps)
        entropy_coeff = self.entropy_coeff_schedule(self.env_steps)
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        params = [p for p in self.policy.parameters() if p.requires_grad]
        num_minibatches = samples.batch_size[0] * self.seq_len // self.minibatch_size
        monitors, entropies, grad_norms = [], [], []  # per minibatch; per optimizer step
        for _ in range(hp.num_sgd_iters):
            if hp.accumulate_grads:  # one optimizer step per pass, on the minibatches' mean loss
                self.optimizer.zero_grad()
            for j, minibatch in enumerate(self._minibatches(samples, num_minibatches)):
                loss, minibatch_monitors, entropy = self._minibatch_loss(minibatch, entropy_coeff)
                if hp.accumulate_grads:
                    self._backward(loss / num_minibatches)
                    if j == num_minibatches - 1:
                        grad_norms.append(self._optimizer_step(params))
                else:
                    self.optimizer.zero_grad()
                    self._backward(loss)
                    grad_norms.append(self._optimizer_step(params))
                monitors.append(minibatch_monitors)
                entropies.append(entropy)
                if self._kl_exceeds_target(minibatch_monitors["kl_div"]):
                    break
            else:
                continue
            break  # KL early stop
        if self.policy.obs_normalizer is not None:
            obs = self.buffer.data["obs"][:, : hp.horizon]
            self.policy.obs_normalizer.update(obs, batch_dims=2, all_reduce=self._all_reduce)
        self.steps += 1
        if not grad_norms:  # a KL stop before the first accumulated optimizer step
            grad_norms.append(torch.zeros((), device=self.device))
        means = {f"monitors/{name}": torch.stack([m[name] for m in monitors]).mean() for name in monitors[0]}
        means["monitors/entropy"] = torch.stack(entropies).mean()
        means["monitors/explained_variance"] = explained_variance
        means["monitors/grad_norm"] = torch.stack(grad_norms).mean()
        out = reduce_stats(self.dist, means=means)
        entropy = out.pop("monitors/entropy")
        policy_loss, vf_loss = out.pop("monitors/policy"), out.pop("monitors/vf")
        stats = {
            "losses/policy": policy_loss,
            "losses/vf": vf_loss,
            "losses/entropy": -entropy,
            # the mean of the minibatches' total losses, from the means of their (linear) terms
            "losses/total": policy_loss + hp.vf_coeff * vf_loss - entropy_coeff * entropy,
            **out,
            "coefficients/entropy": entropy_coeff,
            "coefficients/vf": hp.vf_coeff,
            "coefficients/lr": lr,
        }
        checked = _CHECKED_UPDATE_STATS if self.grad_scaler is None else ("losses/total",)
        self._check_finite_stats(stats, checked, f"update step {self.steps}")
        return stats

    def _minibatches(self, samples: TensorDict, num_minibatches: int) -> Iterator[TensorDict]:
        """One pass over ``samples`` in ``num_minibatches`` minibatches (shuffled when asked),
        each with its advantages normalised when asked (:func:`normalized_advantages`)."""
        hp = self.hparams
        size = samples.batch_size[0] // num_minibatches
        order = None
        if num_minibatches > 1 and hp.shuffle_minibatches:
            order = torch.randperm(samples.batch_size[0], device=self.device, generator=self.generator)
        advantages = samples["advantages"] if order is None else samples["advantages"][order]
        if hp.normalize_advantages and size * self.seq_len > 1:
            advantages = normalized_advantages(advantages, num_minibatches, self.dist)
        for j in range(num_minibatches):
            rows = slice(j * size, (j + 1) * size)
            minibatch = samples[rows if order is None else order[rows]]
            minibatch["advantages"] = advantages[rows]
            yield minibatch

    def _minibatch_loss(
        self, minibatch: TensorDict, entropy_coeff: float
    ) -> tuple[torch.Tensor, dict[str, torch.Tensor], torch.Tensor]:
        """The minibatch's differentiable total loss, its detached monitors ``{policy, vf,
        kl_div, clip_fraction}`` and its detached mean entropy."""
        hp = self.hparams
        # With a zero entropy coefficient the entropy is only a reported stat: keep it out of
        # the graph so the backward pass does not differentiate it.
        entropy_grad = entropy_coeff != 0
        with self._autocast():
            logp, entropy, values = self.policy.evaluate(minibatch, entropy_grad=entropy_grad)
        old = {key: minibatch[key].reshape(-1) for key in ("logp", "values", "advantages", "returns")}
        total, monitors = ppo_loss(
            logp.float(), values.float(), old["logp"], old["advantages"], old["values"], old["returns"],
            clip_param=hp.clip_param, dual_clip_param=hp.dual_clip_param,
            vf_clip_param=hp.vf_clip_param, vf_coeff=hp.vf_coeff,
        )
        mean_entropy = entropy.float().mean()
        if entropy_grad:
            total = total - entropy_coeff * mean_entropy
        return total, dict(zip(("policy", "vf", "kl_div", "clip_fraction"), monitors.unbind())), mean_entropy.detach()

    def _kl_exceeds_target(self, kl_div: torch.Tensor) -> bool:
        """Whether the mean KL over all ranks exceeds ``target_kl_div`` (``False`` without one)."""
        if self.hparams.target_kl_div is None:
            return False
        kl = self.dist.all_reduce_(kl_div.clone()) / self.dist.world_size
        return kl.item() > self.hparams.target_kl_div

    def _backward(self, loss: torch.Tensor) -> None:
        if self.grad_scaler is not None:
            self.grad_scaler.scale(loss).backward()
        else:
            loss.backward()

    def _optimizer_step(self, params: list[torch.nn.Parameter]) -> torch.Tensor:
        """Average the gradients across ranks, clip them to ``max_grad_norm`` and step the
        optimizer; returns the gradient norm before clipping."""
        self.dist.average_gradients(params)  # data-parallel: one all-reduce per optimizer step
        if self.grad_scaler is not None:
            self.grad_scaler.unscale_(self.optimizer)
        max_norm = self.hparams.max_grad_norm
        if max_norm is None:
            grad_norm = torch.nn.utils.get_total_norm([p.grad for p in params if p.grad is not None], foreach=True)
        else:
            grad_norm = torch.nn.utils.clip_grad_norm_(params, max_norm, foreach=True)
        if self.grad_scaler is not None:
            self.grad_scaler.step(self.optimizer)
            self.grad_scaler.update()
        else:
            self.optimizer.step()
        return grad_norm.detach().float()

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
                k = hp.horizons_per_env_reset
                raise RuntimeError(
                    "eval on the training envs is only possible at an env-reset boundary "
                    f"(horizons_per_env_reset={k}: the envs reset "
                    + ("only once, before the first collect" if k < 0 else f"every {k} collects")
                    + f"; {self.collects} collects done so far). Use a dedicated eval env "
                    "(Trainer(eval_num_envs=...)) to evaluate at any time."
                )
            env = self.env
            self._obs = None  # the next training collect resets the envs
        config = {**hp.env_config, **(env_config or {})}
        obs = env.reset(config=config or None)
        validate_reset_output(obs, env)
        steps = num_steps or hp.horizon
        n = env.num_envs
        rewards = torch.zeros(n, steps, device=self.device)
        dones = torch.zeros(n, steps, dtype=torch.bool, device=self.device) if env.episodic else None
        policy, dist_cls = self.policy, self.policy.distribution_cls
        state = policy.initial_state(n)
        firsts = torch.zeros(n, dtype=torch.bool, device=self.device)
        with self._autocast(), policy.rollout():
            for t in range(steps):
                dist, _, state = policy.step(obs, state, firsts)
                actions = dist.deterministic_sample() if deterministic else dist.sample(self.eval_generator)
                out = env.step(dist_cls.to_env_action(actions, env.action_space))
                rewards[:, t] = out["rewards"][:, 0]
                if dones is not None:
                    done = out.get("terminated", None)
                    trunc = out.get("truncated", None)
                    if trunc is not None:
                        done = trunc if done is None else done | trunc
                    dones[:, t] = done[:, 0]
                    firsts = done[:, 0]
                obs = out["obs"]
        return self._rollout_stats(rewards, dones, EpisodeTracker(n, self.device))

    # ----------------------------------------------------------------- state
    def state_dict(self) -> dict[str, Any]:
        """Everything needed to continue training exactly: see ``docs/checkpoints.md``.

        Holds only tensors and plain Python values, so it loads with
        ``torch.load(weights_only=True)``.
        """
        obs: Any = None
        if isinstance(self._obs, TensorDictBase):
            obs = {"tensordict": self._obs.to_dict()}
        elif self._obs is not None:
            obs = {"tensor": self._obs}
        env_state = self.env.state_dict() if self._obs is not None else None
        return {
            "hparams": _plain_hparams(self.hparams),
            "seed": self.seed,
            "policy": self.policy.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "grad_scaler": self.grad_scaler.state_dict() if self.grad_scaler is not None else None,
            "reward_normalizer": (
                self.reward_normalizer.state_dict() if self.reward_normalizer is not None else None
            ),
            "counters": {
                "env_steps": self.env_steps, "env_resets": self.env_resets,
                "collects": self.collects, "steps": self.steps,
            },
            "recurrent": (
                {"state": self._state.to_dict(), "firsts": self._firsts.clone(), "sequences": self.sequences}
                if self.recurrent else None
            ),
            **self.episodes.state_dict(),
            "obs": obs if env_state is not None else None,
            "env": env_state,
            "rng": {
                "generator": self.generator.get_state(),
                "eval_generator": self.eval_generator.get_state(),
                "torch": torch.get_rng_state(),
                "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else [],
            },
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore :meth:`state_dict` (the hyper-parameters must already match)."""
        self.seed = int(state["seed"])
        self.policy.load_state_dict(state["policy"])
        self.optimizer.load_state_dict(state["optimizer"])
        if self.grad_scaler is not None and state.get("grad_scaler"):
            self.grad_scaler.load_state_dict(state["grad_scaler"])
        if self.reward_normalizer is not None and state.get("reward_normalizer") is not None:
            self.reward_normalizer.load_state_dict(state["reward_normalizer"])
        counters = state["counters"]
        self.env_steps = int(counters["env_steps"])
        self.env_resets = int(counters["env_resets"])
        self.collects = int(counters["collects"])
        self.steps = int(counters["steps"])
        self.episodes.load_state_dict(state)
        if self.recurrent and state.get("recurrent") is not None:
            from tensordict import TensorDict

            rec = state["recurrent"]
            self._state = TensorDict(rec["state"], batch_size=[self.hparams.num_envs]).to(self.device)
            self._firsts = rec["firsts"].to(self.device)
            self.sequences = int(rec["sequences"])
        obs, env_state = state.get("obs"), state.get("env")
        # an env that saves no state (GymnasiumEnv) is reset, whatever the file holds
        if obs is not None and env_state is not None and self.env.state_dict() is not None:
            self.env.load_state_dict(env_state)
            if "tensordict" in obs:
                from tensordict import TensorDict

                self._obs = TensorDict(obs["tensordict"], batch_size=[self.hparams.num_envs]).to(self.device)
            else:
                self._obs = obs["tensor"].to(self.device)
        else:
            self._obs = None
        self._validated = False  # the first step after a resume is checked like any first step
        self.generator.set_state(state["rng"]["generator"])
        self.eval_generator.set_state(state["rng"]["eval_generator"])
        torch.set_rng_state(state["rng"]["torch"])
        if state["rng"]["cuda"] and torch.cuda.is_available():
            torch.cuda.set_rng_state_all(state["rng"]["cuda"])

    # ----------------------------------------------------------------- misc
    def __repr__(self) -> str:
        return f"PPO(env={self.env!r}, device={self.device}, policy={self.policy.model_cls.__name__})"
