"""Gymnasium's numpy data as rl8's tensors, and actions back (``docs/gymnasium.md``)."""

from __future__ import annotations

import warnings
from collections.abc import Callable
from typing import Any

import numpy as np
import torch
from gymnasium import spaces
from tensordict import TensorDict, TensorDictBase

from rl8.envs.base import new_tensordict
from rl8.envs.spaces import check_space, space_dtype

__all__ = ["GymnasiumConverter", "rows", "set_rows"]

_ACTION_MASK = "action_mask"
# A tree mirrors a (possibly nested) Dict space: a dict of trees for Dict, a leaf otherwise.
_Tree = Any


def _map(tree: _Tree, fn: Callable[..., Any], *data: Any) -> Any:
    """Apply ``fn(leaf, *leaf_data)`` over a tree, returning a nested dict for Dict nodes."""
    if isinstance(tree, dict):
        return {key: _map(sub, fn, *(d[key] for d in data)) for key, sub in tree.items()}
    return fn(tree, *data)


def _convert_obs_space(space: spaces.Space, *, top: bool = True) -> tuple[spaces.Space, _Tree]:
    """The space of the tensors rl8 gets (float Boxes as float32, a top-level ``action_mask``
    as bool), and the tree of their numpy dtypes."""
    if isinstance(space, spaces.Dict):
        converted, tree = {}, {}
        for key, sub in space.spaces.items():
            if top and key == _ACTION_MASK:
                if not isinstance(sub, (spaces.MultiBinary, spaces.Box)):
                    raise TypeError(
                        f"observation_space[{key!r}]: an action mask must be a MultiBinary or a "
                        f"Box of 0/1, got {sub}"
                    )
                converted[key] = spaces.Box(0, 1, tuple(sub.shape), np.bool_)
                tree[key] = np.dtype(np.bool_)
            else:
                converted[key], tree[key] = _convert_obs_space(sub, top=False)
        return spaces.Dict(converted), tree
    is_float = isinstance(space, spaces.Box) and np.issubdtype(space.dtype, np.floating)
    if is_float and space.dtype != np.float32:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # "precision lowered by casting" is what we want
            low, high = space.low.astype(np.float32), space.high.astype(np.float32)
            space = spaces.Box(low, high, space.shape, np.float32)
    return space, torch.empty(0, dtype=space_dtype(space)).numpy().dtype


def _action_tree(space: spaces.Space) -> _Tree:
    """The torch dtypes of the numpy actions gymnasium wants (a tree for Dict spaces)."""
    if isinstance(space, spaces.Dict):
        return {key: _action_tree(sub) for key, sub in space.spaces.items()}
    return torch.from_numpy(np.zeros((), dtype=space.dtype)).dtype


def rows(value: Any, index: np.ndarray | int) -> Any:
    """Rows ``index`` of a batch of numpy arrays (a tree for Dict spaces)."""
    if isinstance(value, dict):
        return {key: rows(sub, index) for key, sub in value.items()}
    return value[index]


def set_rows(dst: Any, index: np.ndarray | int, value: Any) -> None:
    """Write ``value`` (``[K, ...]``, a tree for Dict spaces) into rows ``index`` of ``dst``."""
    if isinstance(dst, dict):
        for key, sub in dst.items():
            set_rows(sub, index, value[key])
    else:
        dst[index] = value


class GymnasiumConverter:
    """numpy <-> torch for the gymnasium adapters: spaces, observations, step outputs, actions.
    Each observation leaf is copied once (the vector envs reuse their arrays), into a fresh
    array of the rl8 dtype; the CPU tensors sharing them are then moved to :attr:`device`.

    Args:
        observation_space: The gymnasium env's (single) observation space.
        action_space: Its (single) action space.
        num_envs: The batch size.
        device: Torch device of the tensors.
        label: The env's name, for messages.

    Attributes:
        observation_space: The space of the observation tensors (float Boxes as float32, a
            top-level ``action_mask`` as bool).
    """

    def __init__(
        self,
        observation_space: spaces.Space,
        action_space: spaces.Space,
        num_envs: int,
        device: torch.device,
        label: str,
    ) -> None:
        check_space(observation_space, field=f"{label} observation_space")
        check_space(action_space, field=f"{label} action_space")
        self.observation_space, self._np_tree = _convert_obs_space(observation_space)
        self._act_tree = _action_tree(action_space)
        if isinstance(observation_space, spaces.Dict) and _ACTION_MASK in observation_space.spaces:
            mask_shape = tuple(observation_space[_ACTION_MASK].shape)
            if isinstance(action_space, spaces.Discrete) and mask_shape != (int(action_space.n),):
                raise ValueError(
                    f"{label}: observation_space['action_mask'] has shape {mask_shape}, "
                    f"expected ({int(action_space.n)},) for the action space {action_space}"
                )
        self.num_envs = num_envs
        self.device = device

    def from_reset(self, obs: Any) -> torch.Tensor | TensorDictBase:
        """The numpy observations ``obs`` of a vector env's reset (a dict for Dict spaces) as tensors."""
        return self._obs_to_torch(self._fresh_obs(obs), self.num_envs)

    def from_step(
        self,
        obs: Any,
        rewards: np.ndarray,
        terminated: np.ndarray,
        truncated: np.ndarray,
        infos: dict[str, Any],
    ) -> TensorDictBase:
        """A vector env's step (``obs`` after the auto-reset; ``[num_envs]`` ``rewards``, bool
        ``terminated`` and ``truncated``; ``infos``, whose ``final_obs`` gives the last observations
        of the envs that ended an episode) as the step contract's TensorDict."""
        obs = self._fresh_obs(obs)
        final = _map(self._np_tree, lambda dtype, array: array.copy(), obs)
        mask = infos.get("_final_obs")
        if mask is not None:
            for i in np.flatnonzero(mask):  # a few rows per step: row writes beat np.stack
                set_rows(final, i, infos["final_obs"][i])
        return self._output(obs, final, rewards, terminated, truncated)

    def from_rows(
        self,
        obs: Any,
        final_obs: Any,
        rewards: np.ndarray,
        terminated: np.ndarray,
        truncated: np.ndarray,
    ) -> TensorDictBase:
        """The step output of ``K`` sub-envs from numpy arrays of their own (the pool's rows):
        ``obs``, ``rewards``, ``terminated`` and ``truncated`` as :meth:`from_step`'s, ``K`` rows
        each, and ``final_obs``, their observations before an auto-reset (else ``obs``)."""

        def cast(value: Any) -> Any:
            return _map(self._np_tree, lambda dtype, array: array.astype(dtype, copy=False), value)

        return self._output(cast(obs), cast(final_obs), rewards, terminated, truncated)

    def to_actions(self, action: torch.Tensor | TensorDictBase) -> Any:
        """A batch of env actions (a TensorDict for Dict spaces) as the numpy arrays gymnasium wants."""

        def leaf(dtype: torch.dtype, value: torch.Tensor) -> np.ndarray:
            if value.requires_grad:
                value = value.detach()
            # a copy of its own: PPO passes rows of its rollout buffer, which a gymnasium env
            # (or wrapper) that keeps its action array must not see change later
            return value.to(dtype).cpu().numpy().copy()

        return _map(self._act_tree, leaf, action)

    def _fresh_obs(self, obs: Any) -> Any:
        return _map(self._np_tree, lambda dtype, array: np.array(array, dtype=dtype), obs)

    def _output(
        self, obs: Any, final: Any, rewards: np.ndarray, terminated: np.ndarray, truncated: np.ndarray
    ) -> TensorDictBase:
        """The step output of ``len(rewards)`` envs from numpy arrays of their own in rl8's dtypes."""
        n = len(rewards)
        return new_tensordict(
            {
                "obs": self._obs_to_torch(obs, n),
                "rewards": self._to_torch(rewards.astype(np.float32).reshape(n, 1)),
                "terminated": self._to_torch(terminated.reshape(n, 1)),
                "truncated": self._to_torch(truncated.reshape(n, 1)),
                "final_obs": self._obs_to_torch(final, n),
            },
            torch.Size([n]),
            self.device,
        )

    def _to_torch(self, array: np.ndarray) -> torch.Tensor:
        """A CPU tensor sharing ``array``, moved to :attr:`device` (a copy unless on the CPU)."""
        return torch.from_numpy(array).to(self.device)

    def _obs_to_torch(self, obs: Any, n: int) -> torch.Tensor | TensorDict:
        tensors = _map(self._np_tree, lambda dtype, array: self._to_torch(array), obs)
        return (
            new_tensordict(tensors, torch.Size([n]), self.device)
            if isinstance(tensors, dict)
            else tensors
        )
