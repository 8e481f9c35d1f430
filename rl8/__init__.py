"""rl8: fast PPO for batched environments (``Trainer(PPO(CartPole)).run()``; see docs/)."""

from __future__ import annotations

import importlib
from typing import Any

from rl8.moved import install as _install_moved_modules
from rl8.moved import missing_name_pointer as _missing_name_pointer
from rl8.version import __version__ as __version__

_install_moved_modules()  # rl8 1.x's module paths (rl8.conditions...), with a DeprecationWarning

# Imported lazily so that ``import rl8`` (and the ``rl8`` command's start-up) stays fast.
_EXPORTS = {
    "Env": "rl8.envs.base",
    "EnvOutputError": "rl8.envs.base",
    "HParams": "rl8.ppo.hparams",
    "NonFiniteError": "rl8.ppo.algorithm",
    "PPO": "rl8.ppo.algorithm",
    "Distillation": "rl8.ppo.distillation",
    "DistillationHParams": "rl8.ppo.distillation",
    "Policy": "rl8.policies.policy",
    "Model": "rl8.policies.models",
    "MLPModel": "rl8.policies.models",
    "CNNModel": "rl8.policies.encoders",
    "MultiInputModel": "rl8.policies.encoders",
    "RecurrentModel": "rl8.policies.recurrent",
    "LSTMModel": "rl8.policies.recurrent",
    "GRUModel": "rl8.policies.recurrent",
    "Distribution": "rl8.policies.distributions",
    "Schedule": "rl8.ppo.schedules",
    "Trainer": "rl8.training.trainer",
    "TrainStats": "rl8.training.trainer",
    "TrainerConfig": "rl8.training.config",
    "load_policy": "rl8.io.export",
    "save_policy": "rl8.io.export",
    "record_video": "rl8.training.video",
    "register": "rl8.registry",
    "sweep": "rl8.sweeps.study",
    "STOP": "rl8.training.callbacks",
}

__all__ = sorted([*_EXPORTS, "__version__"])


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        return getattr(importlib.import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module 'rl8' has no attribute {name!r}{_missing_name_pointer(name)}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_EXPORTS))
