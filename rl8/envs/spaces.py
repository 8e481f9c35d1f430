"""Gymnasium spaces (one env's observation or action) as batched torch tensors. Actions, as a
policy hands them to ``Env.step``: ``[N]`` int64 for ``Discrete``, ``[N, *shape]`` int64 for
``MultiDiscrete`` (``nvec.shape``) and ``MultiBinary`` (0/1), ``[N, *shape]`` float32 for ``Box``."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import torch
from gymnasium import spaces
from tensordict import TensorDict

__all__ = [
    "SUPPORTED_SPACES",
    "check_space",
    "space_dtype",
    "space_shape",
    "zeros_like_space",
    "space_to_dict",
]

#: The gymnasium space classes rl8 supports as observation and action spaces (``Dict`` nested).
SUPPORTED_SPACES = (spaces.Box, spaces.Discrete, spaces.MultiDiscrete, spaces.MultiBinary, spaces.Dict)


def check_space(space: spaces.Space, *, field: str = "space") -> None:
    """Raise ``TypeError`` when ``space`` (or a sub-space of a ``Dict``) is not supported.

    Args:
        space: A gymnasium space describing one env's observation or action.
        field: What the space is, for the error message (e.g. ``"observation_space"``).
    """
    if isinstance(space, spaces.Dict):
        for key, sub in space.spaces.items():
            check_space(sub, field=f"{field}[{key!r}]")
        return
    if not isinstance(space, SUPPORTED_SPACES):
        names = ", ".join(s.__name__ for s in SUPPORTED_SPACES)
        raise TypeError(
            f"{field}: unsupported gymnasium space {type(space).__name__} ({space}); "
            f"rl8 supports {names}"
        )


def space_shape(space: spaces.Space) -> tuple[int, ...]:
    """Shape of one value of a non-``Dict`` space as a torch tensor (no batch dimension)."""
    if isinstance(space, spaces.Discrete):
        return ()
    if isinstance(space, spaces.MultiDiscrete):
        return tuple(space.nvec.shape)
    if isinstance(space, (spaces.Box, spaces.MultiBinary)):
        return tuple(space.shape)
    raise TypeError(f"space_shape: no tensor shape for {type(space).__name__}")


def space_dtype(space: spaces.Space) -> torch.dtype:
    """Torch dtype of the values of a non-``Dict`` space: int64 for Discrete, MultiDiscrete and
    MultiBinary; a Box's own dtype (float32 unless float64; uint8 images stay uint8)."""
    if isinstance(space, (spaces.Discrete, spaces.MultiDiscrete, spaces.MultiBinary)):
        return torch.int64
    if isinstance(space, spaces.Box):
        if np.issubdtype(space.dtype, np.floating):
            return torch.float64 if space.dtype == np.float64 else torch.float32
        return torch.from_numpy(np.zeros((), dtype=space.dtype)).dtype
    raise TypeError(f"space_dtype: no tensor dtype for {type(space).__name__}")


def zeros_like_space(
    space: spaces.Space,
    batch_size: Sequence[int],
    *,
    device: torch.device | str = "cpu",
    dtype: torch.dtype | None = None,
) -> torch.Tensor | TensorDict:
    """A zero-filled batch ``[*batch_size, *space_shape(space)]`` of values of ``space`` (a
    TensorDict for ``Dict`` spaces, whose ``action_mask`` is bool).

    Args:
        space: The space of one value.
        batch_size: Leading batch dimensions, e.g. ``[num_envs]``.
        device: Device to allocate on.
        dtype: Override the dtype of a non-``Dict`` space.
    """
    batch_size = list(batch_size)
    if isinstance(space, spaces.Dict):
        entries = {
            k: zeros_like_space(
                s, batch_size, device=device, dtype=torch.bool if k == "action_mask" else None
            )
            for k, s in space.spaces.items()
        }
        return TensorDict(entries, batch_size=batch_size, device=device)
    return torch.zeros(
        (*batch_size, *space_shape(space)), dtype=dtype or space_dtype(space), device=device
    )


def space_to_dict(space: spaces.Space) -> dict[str, Any]:
    """A supported space as a dict of tensors and plain values, as policy files and exported
    actors describe it (``TypeError`` for any other space)."""
    if isinstance(space, spaces.Box):
        return {
            "type": "Box",
            "low": torch.from_numpy(np.array(space.low, copy=True)),
            "high": torch.from_numpy(np.array(space.high, copy=True)),
            "shape": list(space.shape),
            "dtype": str(np.dtype(space.dtype)),
        }
    if isinstance(space, spaces.Discrete):
        return {"type": "Discrete", "n": int(space.n), "start": int(space.start)}
    if isinstance(space, spaces.MultiDiscrete):
        return {
            "type": "MultiDiscrete",
            "nvec": torch.from_numpy(np.array(space.nvec, dtype=np.int64)),
            "start": torch.from_numpy(np.array(space.start, dtype=np.int64)),
            "dtype": str(np.dtype(space.dtype)),
        }
    if isinstance(space, spaces.MultiBinary):
        n = space.n
        return {"type": "MultiBinary", "n": int(n) if np.isscalar(n) else [int(x) for x in n]}
    if isinstance(space, spaces.Dict):
        return {
            "type": "Dict",
            "spaces": [[key, space_to_dict(sub)] for key, sub in space.spaces.items()],
        }
    raise TypeError(f"cannot save a {type(space).__name__} space ({space}) in a policy file")
