"""Built-in batched environments and the gymnasium adapter.

Each env lives in a module of its own; they are imported lazily so that ``import rl8`` stays
fast and gymnasium's vector machinery is only loaded when used.
"""

from __future__ import annotations

import importlib
from typing import Any

_ENVS = {
    "CartPole": "rl8.envs.cartpole",
    "Pendulum": "rl8.envs.pendulum",
    "DiscreteDummyEnv": "rl8.envs.dummy",
    "ContinuousDummyEnv": "rl8.envs.dummy",
    "Memory": "rl8.envs.memory",
    "Catch": "rl8.envs.catch",
    "GymnasiumEnv": "rl8.envs.gymnasium",
    "EnvWorkerDied": "rl8.envs.workers",
    "EnvStepTimeout": "rl8.envs.workers",
    "PoolEnv": "rl8.envs.pool",
    "PoolWorkerDied": "rl8.envs.pool",
    "RslRlEnv": "rl8.envs.rsl_rl",
    "TorchVectorEnv": "rl8.envs.torch_vector",
}

__all__ = sorted(_ENVS)


def __getattr__(name: str) -> Any:
    if name in _ENVS:
        return getattr(importlib.import_module(_ENVS[name]), name)
    raise AttributeError(f"module 'rl8.envs' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_ENVS))
