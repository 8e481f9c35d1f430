"""The preallocated rollout buffer (layout: docs/ppo.md) and generalised advantage estimation."""

from __future__ import annotations

import contextlib
import functools
import math
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any, Literal

import torch
from gymnasium import spaces
from tensordict import TensorDict, TensorDictBase

from rl8.envs.episodes import EpisodeRecords
from rl8.envs.spaces import zeros_like_space
from rl8.policies.policy import device_memory

if TYPE_CHECKING:
    from rl8.envs.base import Env
    from rl8.policies.policy import Policy
    from rl8.ppo.distributed import DistContext

__all__ = [
    "RecurrentCarry",
    "RolloutBuffer",
    "RolloutCarry",
    "buffer_allocation",
    "check_buffer_fits",
    "compute_gae",
    "make_rollout_buffer",
    "minibatches",
    "normalized_advantages",
    "slot_bytes",
]

#: Observations up to this size per step (all envs) are stacked into the buffer once per
#: collect; bigger ones (images) are copied step by step.
STACKED_OBS_MAX_BYTES = 1 << 20

#: Bytes of one buffer slot (one env, one step) whatever the spaces: log-prob, value, reward.
MIN_SLOT_BYTES = 12


class RolloutBuffer:
    """Storage for one collect, allocated once and written in place (layout: docs/ppo.md).

    Args:
        observation_space: Space of one observation.
        action_shape: Per-sample shape of the raw actions the distribution produces.
        action_dtype: Dtype of the raw actions.
        num_envs: Number of envs (first batch dim).
        horizon: Steps per collect (the second batch dim is ``horizon + 1``).
        device: Device of the storage.
        episodic: Also store ``terminated``, ``truncated`` and ``final_obs``.
        state_example: For recurrent models, the initial state of ``num_envs`` envs (a
            TensorDict ``[num_envs]``); adds ``firsts``, :attr:`states` and :attr:`post_states`.
        seq_len: Recurrent models: steps per training sequence (divides ``horizon``).

    Attributes:
        data: ``[num_envs, horizon + 1]`` views of time-major storage (flatten with ``reshape``).
        columns: Each key's ``horizon + 1`` per-step views, which the rollout loop writes into.
        stacked: The storage of ``values``, ``rewards`` and small ``obs``, filled by :meth:`stack`.
        env_episodes: The env's own records of the episodes of the rollout, or ``None``.
        env_log: The simulator's per-episode values of the rollout (:meth:`rl8.Env.pop_log`).
    """

    def __init__(
        self,
        observation_space: spaces.Space,
        action_shape: tuple[int, ...],
        action_dtype: torch.dtype,
        num_envs: int,
        horizon: int,
        *,
        device: torch.device | str = "cpu",
        episodic: bool = False,
        state_example: TensorDictBase | None = None,
        seq_len: int = 1,
    ) -> None:
        self.num_envs, self.horizon, self.episodic, self.seq_len = num_envs, horizon, episodic, seq_len
        shape = [num_envs, horizon + 1]

        def steps_first(tail: tuple[int, ...] = (), dtype: torch.dtype = torch.float32) -> torch.Tensor:
            # stored step by step: the rollout loop writes one contiguous row per step
            return torch.zeros((horizon + 1, num_envs, *tail), dtype=dtype, device=device).transpose(
                0, 1
            )

        def obs_like() -> torch.Tensor | TensorDictBase:
            if isinstance(observation_space, spaces.Dict):
                return zeros_like_space(observation_space, shape, device=device)
            return zeros_like_space(observation_space, [horizon + 1, num_envs], device=device).transpose(
                0, 1
            )

        data = {
            "obs": obs_like(),
            "actions": steps_first(tuple(action_shape), action_dtype),
            "logp": steps_first(),
            "values": steps_first(),
            "rewards": steps_first(),
        }
        if episodic:
            data["terminated"] = steps_first(dtype=torch.bool)
            data["truncated"] = steps_first(dtype=torch.bool)
            data["final_obs"] = obs_like()
        self.states: TensorDictBase | None = None
        self.post_states: TensorDictBase | None = None
        if state_example is not None:
            data["firsts"] = steps_first(dtype=torch.bool)
            zeros = state_example.unsqueeze(1).to(device)
            self.states = zeros.expand(num_envs, horizon // seq_len).clone().zero_()
            if episodic:
                self.post_states = zeros.expand(num_envs, horizon).clone().zero_()
        self.data = TensorDict(data, batch_size=shape, device=device)
        self.env_episodes: EpisodeRecords | None = None
        self.env_log: dict[str, torch.Tensor] = {}
        # per-step views, made once; rewards and flags keep a trailing dim of 1, like env outputs
        keep_dim = {"rewards", "terminated", "truncated"}
        self.columns = {
            key: [value[:, t : t + 1] if key in keep_dim else value[:, t] for t in range(horizon + 1)]
            for key, value in self.data.items()
        }
        # Written by ONE stack per collect: the loop keeps each step's tensors (the env never
        # mutates its outputs later, docs/envs.md); observations only while small.
        self.stacked = {
            "values": self.time_major("values"),
            "rewards": self.time_major("rewards")[:horizon, :, None],
        }
        obs_steps = self.time_major("obs")
        if obs_steps is not None and obs_steps[0].nbytes <= STACKED_OBS_MAX_BYTES:
            self.stacked["obs"] = obs_steps

    def __getitem__(self, key: str) -> torch.Tensor | TensorDictBase:
        return self.data[key]

    @property
    def nbytes(self) -> int:
        """Bytes the buffer holds (recurrent states included)."""
        parts = [self.data, self.states, self.post_states]
        return sum(t.nbytes for td in parts if td is not None for t in td.values(True, True))

    @property
    def bytes_per_transition(self) -> float:
        """Bytes of storage per env step (:attr:`nbytes` over ``num_envs * (horizon + 1)``)."""
        return self.nbytes / (self.num_envs * (self.horizon + 1))

    def stack(self, kept: dict[str, list[torch.Tensor]]) -> None:
        """Write each key's per-step tensors ``kept[key]`` (all its steps) into :attr:`stacked`."""
        for key, steps in kept.items():
            torch.stack(steps, out=self.stacked[key])

    def training_samples(self, advantages: torch.Tensor, returns: torch.Tensor) -> TensorDict:
        """The collected steps as a TensorDict of one row per transition (or ``seq_len``-step
        sequence), with the given ``[num_envs, horizon]`` ``advantages`` and ``returns``."""
        h, seq_len = self.horizon, self.seq_len
        keys = ["obs", "actions", "logp", "values", *(["firsts"] if self.states is not None else [])]
        columns = TensorDict(
            {key: self.data[key][:, :h] for key in keys},
            batch_size=[self.num_envs, h],
            device=self.data.device,
        )
        columns.update(advantages=advantages, returns=returns)
        samples = columns.reshape(-1) if seq_len == 1 else columns.reshape(-1, seq_len)
        samples.batch_size = samples.batch_size[:1]  # one row per transition or sequence
        if self.states is not None:
            samples["state"] = self.states.reshape(-1)
        return samples

    def time_major(self, key: str) -> torch.Tensor | None:
        """The contiguous ``[horizon + 1, num_envs, ...]`` storage behind ``data[key]``, or
        ``None`` for Dict observations (stored env-major)."""
        value = self.data[key]
        return value.transpose(0, 1) if isinstance(value, torch.Tensor) else None


class RolloutCarry:
    """What the policy carries from one env step to the next, and what the buffer keeps of it:
    nothing for a feedforward policy (this class); :class:`RecurrentCarry` for a recurrent one.
    The ``*_steps`` forms serve envs that step at their own pace (each env at its own step ``t``).
    """

    def reset(self) -> None:
        """Every env starts a new episode (all envs were reset)."""

    def before_step(self, t: int) -> tuple[TensorDictBase | None, torch.Tensor | None]:
        """The carry and the ``[num_envs]`` episode starts for step ``t``."""
        return None, None

    def after_step(self, t: int, carry: TensorDictBase | None) -> None:
        """Keep ``carry``, the policy's carry after step ``t`` (its flags are in the buffer)."""

    def last(self) -> tuple[TensorDictBase | None, torch.Tensor | None]:
        """The carry and episode starts after the last step of a collect."""
        return None, None

    def after(self, index: torch.Tensor) -> TensorDictBase | None:
        """The carries after the steps ``index`` (``[K, 2]``: env, step), to value ``final_obs``."""
        return None

    def before_steps(
        self, env_ids: torch.Tensor, t: torch.Tensor
    ) -> tuple[TensorDictBase | None, torch.Tensor | None]:
        """The carry and ``[K]`` episode starts of envs ``env_ids`` before their steps ``t``."""
        return None, None

    def after_steps(self, env_ids: torch.Tensor, t: torch.Tensor, carry: TensorDictBase | None) -> None:
        """Keep ``carry``, the carry of envs ``env_ids`` after their steps ``t``."""

    def state_dict(self) -> dict[str, Any] | None:
        """The carry between collects (``None``: nothing to save)."""
        return None

    def load_state_dict(self, state: dict[str, Any] | None) -> None:
        """Restore :meth:`state_dict`."""


class RecurrentCarry(RolloutCarry):
    """A recurrent model's state through collects, kept in ``buffer``: the state before each
    sequence in ``states``, after each step in ``post_states`` (episodic envs), the episode
    starts in ``firsts``.

    Args:
        initial_state: ``initial_state(num_envs)``: the model's initial state, ``[num_envs]``.
        buffer: A :class:`RolloutBuffer` with recurrent storage (``state_example``).
        seqs_per_state_reset: ``k > 0``: reset the state every ``k`` sequences; ``k < 0``:
            only at env resets and episode ends.
    """

    def __init__(
        self,
        initial_state: Callable[[int], TensorDictBase],
        buffer: RolloutBuffer,
        seqs_per_state_reset: int,
    ) -> None:
        self.initial_state = initial_state
        self.buffer = buffer
        self.seqs_per_state_reset = seqs_per_state_reset
        self.state = initial_state(buffer.num_envs)
        self.firsts = torch.zeros(buffer.num_envs, dtype=torch.bool, device=buffer.data.device)
        self.sequences = 0

    def reset(self) -> None:
        self.state = self.initial_state(self.buffer.num_envs)
        self.firsts = torch.zeros_like(self.firsts)  # a new tensor: a carry handed out stays as it was

    def before_step(self, t: int) -> tuple[TensorDictBase, torch.Tensor]:
        seq_len, k = self.buffer.seq_len, self.seqs_per_state_reset
        if t % seq_len == 0:
            if k > 0 and (self.sequences + t // seq_len) % k == 0:
                self.state = self.initial_state(self.buffer.num_envs)
            self.buffer.states[:, t // seq_len] = self.state
        self.buffer.columns["firsts"][t].copy_(self.firsts)
        return self.state, self.firsts

    def after_step(self, t: int, carry: TensorDictBase) -> None:
        self.state = carry
        if self.buffer.episodic:
            self.buffer.post_states[:, t] = carry
            columns = self.buffer.columns
            self.firsts = (columns["terminated"][t] | columns["truncated"][t])[:, 0]

    def last(self) -> tuple[TensorDictBase, torch.Tensor]:
        self.sequences += self.buffer.horizon // self.buffer.seq_len
        self.buffer.columns["firsts"][self.buffer.horizon].copy_(self.firsts)
        return self.state, self.firsts

    def after(self, index: torch.Tensor) -> TensorDictBase:
        return self.buffer.post_states[index[:, 0], index[:, 1]]

    # the per-env forms replace the state and episode starts by updated copies: a carry handed out stays
    def before_steps(
        self, env_ids: torch.Tensor, t: torch.Tensor
    ) -> tuple[TensorDictBase, torch.Tensor]:
        seq_len, k = self.buffer.seq_len, self.seqs_per_state_reset
        starts_sequence = t % seq_len == 0
        if bool(starts_sequence.any()):
            ids, seq = env_ids[starts_sequence], t[starts_sequence] // seq_len
            if k > 0:  # each env's sequence number since training began decides
                reset = ids[(self.sequences + seq) % k == 0]
                if reset.numel():
                    state = self.state.clone()
                    state[reset] = self.initial_state(reset.numel())
                    self.state = state
            self.buffer.states[ids, seq] = self.state[ids]
        firsts = self.firsts[env_ids]
        self.buffer.data["firsts"][env_ids, t] = firsts
        return self.state[env_ids], firsts

    def after_steps(self, env_ids: torch.Tensor, t: torch.Tensor, carry: TensorDictBase) -> None:
        state = self.state.clone()
        state[env_ids] = carry
        self.state = state
        if self.buffer.episodic:
            self.buffer.post_states[env_ids, t] = carry
            data = self.buffer.data
            firsts = self.firsts.clone()
            firsts[env_ids] = data["terminated"][env_ids, t] | data["truncated"][env_ids, t]
            self.firsts = firsts

    def state_dict(self) -> dict[str, Any]:
        return {
            "state": self.state.to_dict(),
            "firsts": self.firsts.clone(),
            "sequences": self.sequences,
        }

    def load_state_dict(self, state: dict[str, Any] | None) -> None:
        if state is None:
            return
        device = self.buffer.data.device
        self.state = TensorDict(state["state"], batch_size=[self.buffer.num_envs]).to(device)
        self.firsts = state["firsts"].to(device)
        self.sequences = int(state["sequences"])


def slot_bytes(
    observation_space: spaces.Space,
    action_shape: tuple[int, ...],
    action_dtype: torch.dtype,
    episodic: bool,
) -> int:
    """Bytes of one :class:`RolloutBuffer` slot (one env, one step)."""
    obs = zeros_like_space(observation_space, [1])
    obs_bytes = sum(
        t.nbytes for t in (obs.values(True, True) if isinstance(obs, TensorDictBase) else [obs])
    )
    return (
        obs_bytes * (1 + episodic)
        + math.prod(action_shape) * action_dtype.itemsize
        + MIN_SLOT_BYTES
        + 2 * episodic
    )


def _buffer_size_error(
    num_envs: int, horizon: int, need: int, problem: str, buffers: int = 1
) -> ValueError:
    what = "a rollout buffer" if buffers == 1 else f"{buffers} rollout buffers (collect_mode='overlap')"
    return ValueError(
        f"hparam num_envs, horizon: {what} of num_envs={num_envs} envs x "
        f"(horizon={horizon} + 1) steps need{'s' if buffers == 1 else ''} about {need} bytes ({need / 2**30:.1f} GiB); "
        f"{problem}. Use fewer envs or a shorter horizon"
    )


def check_buffer_fits(
    num_envs: int, horizon: int, device: torch.device, slot_bytes: int, buffers: int = 1
) -> None:
    """A ``ValueError`` when ``buffers`` buffers of ``num_envs x (horizon + 1)`` slots of
    ``slot_bytes`` bytes are larger than the whole memory of ``device``."""
    need = buffers * num_envs * (horizon + 1) * slot_bytes
    total = device_memory(device)
    if total is not None and need > total:
        raise _buffer_size_error(
            num_envs,
            horizon,
            need,
            f"{device} has {total} bytes ({total / 2**30:.1f} GiB) in all",
            buffers,
        )


@contextlib.contextmanager
def buffer_allocation(num_envs: int, horizon: int, slot_bytes: int | None) -> Iterator[None]:
    """Re-raise a failed allocation as a ``ValueError`` naming ``num_envs``, ``horizon`` and the
    bytes of a buffer of ``slot_bytes`` per slot (``None``: the envs' own allocation)."""
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
            raise ValueError(
                f"hparam num_envs: building num_envs={num_envs} envs ran out of memory "
                f"({reason}). Use fewer envs"
            ) from err
        need = num_envs * (horizon + 1) * slot_bytes
        raise _buffer_size_error(
            num_envs, horizon, need, f"allocating memory failed ({reason})"
        ) from err


def make_rollout_buffer(
    env: Env,
    policy: Policy,
    num_envs: int,
    horizon: int,
    device: torch.device,
    *,
    seq_len: int = 1,
    buffers: int = 1,
) -> RolloutBuffer:
    """The :class:`RolloutBuffer` of ``env``'s spaces and ``policy``'s raw actions and state, on
    ``device``; ``seq_len``: steps per training sequence (1: transitions). A ``ValueError`` when
    ``buffers`` such buffers (2 with ``collect_mode="overlap"``) could never fit."""
    dist, space = policy.distribution_cls, env.action_space
    action_shape, action_dtype = tuple(dist.raw_action_shape(space)), dist.raw_action_dtype(space)
    slot = slot_bytes(env.observation_space, action_shape, action_dtype, env.episodic)
    check_buffer_fits(num_envs, horizon, device, slot, buffers=buffers)
    with buffer_allocation(num_envs, horizon, slot):
        return RolloutBuffer(
            env.observation_space,
            action_shape,
            action_dtype,
            num_envs,
            horizon,
            device=device,
            episodic=env.episodic,
            state_example=policy.initial_state(num_envs),
            seq_len=seq_len,
        )


@functools.lru_cache(maxsize=16)
def discount_matrix(t_len: int, c: float, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """``D[k, t] = c^(k - t)`` for ``k >= t``, else 0 (``[T, T]``; cached, do not modify):
    ``x @ D`` is the discounted sum of the future, ``x @ D.T`` that of the past."""
    steps = torch.arange(t_len, device=device, dtype=torch.float64)
    lag = steps[:, None] - steps[None, :]  # k - t
    return torch.where(lag >= 0, c ** lag.clamp(min=0), 0.0).to(dtype)


def compute_gae(
    rewards: torch.Tensor,
    values: torch.Tensor,
    *,
    gamma: float,
    gae_lambda: float,
    terminated: torch.Tensor | None = None,
    truncated: torch.Tensor | None = None,
    final_values: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Generalised advantage estimation over ``[N, T]`` rollouts: ``(advantages, returns)``, each
    ``[N, T]``, with ``returns = advantages + values[:, :T]``.

    Args:
        rewards: ``[N, T]`` rewards.
        values: ``[N, T + 1]`` values of the observations at ``0..T`` (``T``: the last obs).
        gamma: Discount factor.
        gae_lambda: GAE's lambda.
        terminated: ``[N, T]`` bool: a true terminal state at step ``t`` (no bootstrap).
        truncated: ``[N, T]`` bool: the episode was cut at step ``t``; ``final_values[:, t]``
            is bootstrapped.
        final_values: ``[N, T]`` values of ``final_obs`` (only read where ``truncated``).
    """
    n, t_len = rewards.shape
    next_values = values[:, 1:]
    if truncated is not None and final_values is not None:
        next_values = torch.where(truncated, final_values, next_values)
    if terminated is not None:
        next_values = next_values.masked_fill(terminated, 0.0)
    deltas = rewards + gamma * next_values - values[:, :-1]
    c = gamma * gae_lambda
    if terminated is None and truncated is None:
        # infinite horizon: ONE [N, T] @ [T, T] matmul instead of T sequential steps
        advantages = deltas @ discount_matrix(t_len, c, rewards.dtype, rewards.device)
        return advantages, advantages + values[:, :-1]
    done = (
        terminated if truncated is None else truncated if terminated is None else terminated | truncated
    )
    # A_t = delta_t + c * (1 - done_t) * A_{t+1}, backwards over time-major copies
    carry = ((~done).to(rewards.dtype) * c).t().contiguous()
    deltas_tm = deltas.t().contiguous()
    advantages_tm = torch.empty_like(deltas_tm)
    last = torch.zeros(n, dtype=rewards.dtype, device=rewards.device)
    for t in range(t_len - 1, -1, -1):
        last = torch.addcmul(deltas_tm[t], carry[t], last, out=advantages_tm[t])
    advantages = advantages_tm.t()
    return advantages, advantages + values[:, :-1]


def minibatches(
    samples: TensorDict,
    num_minibatches: int,
    *,
    num_passes: int = 1,
    seq_len: int,
    shuffle: bool,
    normalize_advantages: Literal["minibatch", "rollout"] | None,
    dist: DistContext,
    generator: torch.Generator,
) -> Iterator[TensorDict]:
    """``num_passes`` passes (epochs, ``num_sgd_iters``) over ``samples``, each in ``num_minibatches``
    equal minibatches (a divisor of ``S``).

    Args:
        samples: The training samples (:meth:`RolloutBuffer.training_samples`), ``[S]``, of
            ``seq_len`` steps each (1 for transitions).
        shuffle: Draw the minibatches from a fresh random permutation (from ``generator``).
        normalize_advantages: Normalise the advantages (:func:`normalized_advantages`) over each
            minibatch of each pass (``"minibatch"``), over all of ``samples`` once, before the
            passes (``"rollout"``), or not (``None``); with moments over all ranks of ``dist``
            (the run's :class:`~rl8.ppo.distributed.DistContext`).
    """
    if normalize_advantages == "rollout" and samples.batch_size[0] * seq_len > 1:
        samples = samples.clone(recurse=False)  # the advantages below replace a key
        samples["advantages"] = normalized_advantages(samples["advantages"], 1, dist)
    size = samples.batch_size[0] // num_minibatches
    for _ in range(num_passes):
        order = (
            torch.randperm(samples.batch_size[0], device=samples.device, generator=generator)
            if num_minibatches > 1 and shuffle
            else None
        )
        # the advantages of the whole pass, in its order: their moments are taken per minibatch
        advantages = samples["advantages"] if order is None else samples["advantages"][order]
        if normalize_advantages == "minibatch" and samples.batch_size[0] * seq_len > num_minibatches:
            advantages = normalized_advantages(advantages, num_minibatches, dist)
        if "advantage_weights" in samples.keys():
            weights = samples["advantage_weights"]
            advantages = advantages * (weights if order is None else weights[order])
        for j in range(num_minibatches):
            rows = slice(j * size, (j + 1) * size)
            # each minibatch gathered on its own, as rsl_rl does: a copy of the whole shuffled
            # batch per pass was freed and allocated again every pass (page faults, docs/performance.md)
            minibatch = samples[rows] if order is None else samples[order[rows]]
            minibatch["advantages"] = advantages[rows]
            yield minibatch


def normalized_advantages(
    advantages: torch.Tensor, num_minibatches: int, dist: DistContext
) -> torch.Tensor:
    """Each of the ``num_minibatches`` consecutive minibatches of ``advantages`` centred and
    divided by its sample std (+ 1e-8); in data-parallel training (``dist``) the moments of
    minibatch ``j`` cover every rank's minibatch ``j`` (ONE all-reduce per pass)."""
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
