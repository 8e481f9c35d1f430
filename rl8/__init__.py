"""rl8: fast PPO for batched environments.

The public API::

    from rl8 import PPO, Trainer
    from rl8.conditions import HitsUpperBound
    from rl8.envs import CartPole

    Trainer(PPO(CartPole)).run(stop_conditions=[HitsUpperBound("episodes/return_mean", 475)])
"""

from __future__ import annotations

import importlib
from typing import Any

__version__ = "2.0.0.dev0"

# Imported lazily so that ``import rl8`` (and the ``rl8`` command's start-up) stays fast.
_EXPORTS = {
    "Env": "rl8.env",
    "EnvOutputError": "rl8.env",
    "HParams": "rl8.hparams",
    "NonFiniteError": "rl8.ppo",
    "PPO": "rl8.ppo",
    "Policy": "rl8.policy",
    "Model": "rl8.models",
    "MLPModel": "rl8.models",
    "CNNModel": "rl8.encoders",
    "MultiInputModel": "rl8.encoders",
    "RecurrentModel": "rl8.recurrent",
    "LSTMModel": "rl8.recurrent",
    "GRUModel": "rl8.recurrent",
    "Distribution": "rl8.distributions",
    "Schedule": "rl8.schedules",
    "Trainer": "rl8.trainer",
    "TrainStats": "rl8.trainer",
    "TrainerConfig": "rl8.config",
    "load_policy": "rl8.export",
    "save_policy": "rl8.export",
    "record_video": "rl8.video",
    "register": "rl8.registry",
}

__all__ = sorted([*_EXPORTS, "__version__"])


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        return getattr(importlib.import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module 'rl8' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_EXPORTS))
