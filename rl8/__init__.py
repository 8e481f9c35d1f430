"""rl8: fast PPO for batched environments."""

from __future__ import annotations

from .env import Env, EnvOutputError

__version__ = "2.0.0.dev0"

__all__ = ["Env", "EnvOutputError", "__version__"]
