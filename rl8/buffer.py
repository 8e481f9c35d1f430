"""The preallocated rollout buffer and generalised advantage estimation.

Layout (docs/ppo.md): a :class:`~tensordict.TensorDict` of batch size ``[num_envs, horizon + 1]``.
Index ``t`` holds the observation at ``t`` and the action, log-probability, value and reward
taken there; column ``horizon`` holds the last observation and its value.
"""

from __future__ import annotations

import functools

import torch
from gymnasium import spaces
from tensordict import TensorDict, TensorDictBase

from .spaces import zeros_like_space

__all__ = ["RolloutBuffer", "compute_gae"]


class RolloutBuffer:
    """Storage for one collect, allocated once and written in place.

    Args:
        observation_space: Space of one observation.
        action_shape: Per-sample shape of the raw actions the distribution produces.
        action_dtype: Dtype of the raw actions.
        num_envs: Number of envs (first batch dim).
        horizon: Steps per collect (the second batch dim is ``horizon + 1``).
        device: Device of the storage.
        episodic: Also store ``terminated``, ``truncated`` and ``final_obs``.
        state_example: For recurrent models, the initial state of ``num_envs`` envs (a
            TensorDict ``[num_envs]``); adds the recurrent storage below.
        seq_len: Recurrent models: steps per training sequence (divides ``horizon``).

    Tensors are stored time-major (``[horizon + 1, num_envs, ...]`` in memory) and held in
    :attr:`data` as ``[num_envs, horizon + 1, ...]`` transposed views, so every per-step view
    is contiguous (Dict observations are stored env-major); flatten with ``reshape``.

    :attr:`columns` maps each key to its ``horizon + 1`` per-step views (``[num_envs, ...]``;
    ``[num_envs, 1]`` for rewards and flags), which the rollout loop writes into.

    Keys of :attr:`data`: ``obs``, ``actions``, ``logp``, ``values``, ``rewards``, and for
    episodic envs ``terminated``, ``truncated`` (bool) and ``final_obs``; for recurrent
    models ``firsts`` (bool: an episode starts at that step, the state is reset before it).
    Recurrent models also get :attr:`states` (``[num_envs, horizon // seq_len]``: the state
    before each sequence's first step) and, for episodic envs, :attr:`post_states`
    (``[num_envs, horizon]``: the state after each step, to value ``final_obs``).
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
        self.num_envs = num_envs
        self.horizon = horizon
        self.episodic = episodic
        shape = [num_envs, horizon + 1]

        def steps_first(tail: tuple[int, ...] = (), dtype: torch.dtype = torch.float32) -> torch.Tensor:
            # [num_envs, horizon + 1, *tail] stored step by step: the rollout loop writes one
            # contiguous row per step instead of num_envs scattered elements
            return torch.zeros((horizon + 1, num_envs, *tail), dtype=dtype, device=device).transpose(0, 1)

        def obs_like() -> torch.Tensor | TensorDictBase:
            if isinstance(observation_space, spaces.Dict):
                return zeros_like_space(observation_space, shape, device=device)
            return zeros_like_space(observation_space, [horizon + 1, num_envs], device=device).transpose(0, 1)

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
        self.seq_len = seq_len
        self.states: TensorDictBase | None = None
        self.post_states: TensorDictBase | None = None
        if state_example is not None:
            data["firsts"] = steps_first(dtype=torch.bool)
            zeros = state_example.unsqueeze(1).to(device)
            self.states = zeros.expand(num_envs, horizon // seq_len).clone().zero_()
            if episodic:
                self.post_states = zeros.expand(num_envs, horizon).clone().zero_()
        self.data = TensorDict(data, batch_size=shape, device=device)
        # Per-step views, made once: writing through them costs a copy and no indexing.
        # rewards/terminated/truncated columns keep a trailing dim of 1, like env outputs.
        keep_dim = {"rewards", "terminated", "truncated"}
        self.columns = {
            key: [
                value[:, t : t + 1] if key in keep_dim else value[:, t]
                for t in range(horizon + 1)
            ]
            for key, value in self.data.items()
        }

    def __getitem__(self, key: str) -> torch.Tensor | TensorDictBase:
        return self.data[key]

    def training_samples(self, advantages: torch.Tensor, returns: torch.Tensor) -> TensorDict:
        """The collected steps as training samples, one row per sample: a TensorDict
        ``[num_envs * horizon]`` of transitions, or for recurrent models (``seq_len``) one
        ``[num_envs * horizon / seq_len]`` of sequences of ``seq_len`` consecutive steps of
        one env.

        Keys: ``obs``, ``actions``, ``logp``, ``values`` (as collected), ``advantages`` and
        ``returns`` (the given ``[num_envs, horizon]`` tensors), and for recurrent models
        ``state`` (the state before each sequence) and ``firsts``.
        """
        h, seq_len = self.horizon, self.seq_len
        columns = {key: self.data[key][:, :h] for key in ("obs", "actions", "logp", "values")}
        columns.update(advantages=advantages, returns=returns)
        if self.states is not None:
            columns["firsts"] = self.data["firsts"][:, :h]
        samples = {key: _as_rows(value, seq_len) for key, value in columns.items()}
        if self.states is not None:
            samples["state"] = self.states.reshape(-1)
        return TensorDict(samples, batch_size=[self.num_envs * h // seq_len], device=self.data.device)

    def time_major(self, key: str) -> torch.Tensor | None:
        """The contiguous ``[horizon + 1, num_envs, ...]`` storage behind ``data[key]`` (the
        same memory, steps first), or ``None`` for Dict observations (stored env-major)."""
        value = self.data[key]
        if not isinstance(value, torch.Tensor):
            return None
        steps = value.transpose(0, 1)
        return steps if steps.is_contiguous() else None


def _as_rows(x: torch.Tensor | TensorDictBase, seq_len: int) -> torch.Tensor | TensorDictBase:
    """``[num_envs, T, ...]`` -> ``[num_envs * T, ...]`` transitions (``seq_len == 1``) or
    ``[num_envs * T / seq_len, seq_len, ...]`` sequences of consecutive steps of one env."""
    if isinstance(x, TensorDictBase):
        return x.reshape(-1) if seq_len == 1 else x.reshape(-1, seq_len)
    if seq_len == 1:
        return x.reshape(-1, *x.shape[2:])
    return x.reshape(-1, seq_len, *x.shape[2:])


@functools.lru_cache(maxsize=16)
def discount_matrix(t_len: int, c: float, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """``D[k, t] = c^(k - t)`` for ``k >= t``, else 0 (``[T, T]``; cached, do not modify).

    For ``x`` of shape ``[N, T]``, ``x @ D`` is the discounted sum of the future,
    ``sum_{k >= t} c^(k - t) x_k``, and ``x @ D.T`` the discounted sum of the past,
    ``sum_{k <= t} c^(t - k) x_k``: each a whole recursion over time in one matmul.
    """
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
    """Generalised advantage estimation over ``[num_envs, T]`` rollouts.

    Args:
        rewards: ``[N, T]`` rewards.
        values: ``[N, T + 1]`` values of the observations at ``0..T`` (``T``: the last obs).
        gamma: Discount factor.
        gae_lambda: GAE's lambda.
        terminated: ``[N, T]`` bool: the episode ended in a true terminal state at step ``t``;
            nothing is bootstrapped after it.
        truncated: ``[N, T]`` bool: the episode was cut at step ``t`` (time limit); the value
            of the observation before the auto-reset, ``final_values[:, t]``, is bootstrapped.
        final_values: ``[N, T]`` values of ``final_obs`` (only read where ``truncated``).

    Returns:
        ``(advantages, returns)``, each ``[N, T]``; ``returns = advantages + values[:, :T]``.
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
        # Infinite horizon: A_t = sum_{k >= t} c^(k - t) delta_k with one constant c, which is
        # ONE [N, T] @ [T, T] matmul instead of T sequential steps (512 x 32: ~15 us, not ~250).
        advantages = deltas @ discount_matrix(t_len, c, rewards.dtype, rewards.device)
        return advantages, advantages + values[:, :-1]
    done = terminated if truncated is None else truncated if terminated is None else terminated | truncated
    # A_t = delta_t + c * (1 - done_t) * A_{t+1}, swept backwards over time-major copies so
    # each step is one fused op writing a contiguous row.
    carry = ((~done).to(rewards.dtype) * c).t().contiguous()
    deltas_tm = deltas.t().contiguous()
    advantages_tm = torch.empty_like(deltas_tm)
    last = torch.zeros(n, dtype=rewards.dtype, device=rewards.device)
    for t in range(t_len - 1, -1, -1):
        last = torch.addcmul(deltas_tm[t], carry[t], last, out=advantages_tm[t])
    advantages = advantages_tm.t()
    return advantages, advantages + values[:, :-1]
