"""The modules of rl8 1.0.0 (the released layout), still importable in rl8 2.x:
``from rl8.conditions import HitsUpperBound`` works with a ``DeprecationWarning`` naming the new
path (``rl8.training.conditions``); see ``docs/migrating.md``. Removed in rl8 3.0.

And the names that users of rl8 1.0 and of Stable-Baselines3 import from rl8, which rl8 2.x has
not (:data:`NOT_IN_RL8`): ``from rl8 import Algorithm`` is an ImportError, ``rl8.Algorithm`` an
AttributeError, each saying what to use instead."""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.util
import sys
import types
import warnings
from typing import Any

__all__ = ["MOVED", "NOT_IN_RL8", "install", "missing_name_pointer"]

#: rl8 1.0.0's modules (the released layout) -> the modules their public names live in now
#: (searched in this order). 1.0.0's names that rl8 2.x has not are :data:`NOT_IN_RL8`.
MOVED: dict[str, tuple[str, ...]] = {
    "rl8.algorithms": ("rl8.ppo.algorithm", "rl8.ppo.hparams"),
    "rl8.conditions": ("rl8.training.conditions",),
    "rl8.distributions": ("rl8.policies.distributions",),
    "rl8.env": ("rl8.envs.base", "rl8.envs.dummy"),
    "rl8.models": ("rl8.policies.models", "rl8.policies.recurrent"),
    "rl8.schedulers": ("rl8.ppo.schedules",),
    "rl8.trainers": ("rl8.training.trainer", "rl8.training.config"),
}

#: Names that rl8 does not have, which users of rl8 1.0 and of Stable-Baselines3 look for in it,
#: and what to use instead.
NOT_IN_RL8: dict[str, str] = {
    "Algorithm": "rl8 1.0's Algorithm(env_cls, **config) is rl8.PPO(env, **hparams)",
    "AlgorithmConfig": "rl8 1.0's AlgorithmConfig is rl8.HParams (PPO's hyper-parameters)",
    "RecurrentAlgorithm": (
        "rl8 1.0's RecurrentAlgorithm is rl8.PPO(env, model_cls=rl8.LSTMModel) (or rl8.GRUModel)"
    ),
    "RecurrentTrainer": "rl8 1.0's RecurrentTrainer is rl8.Trainer (of a PPO with a recurrent model_cls)",
    "TrainConfig": (
        "rl8 1.0's TrainConfig.from_file(path).build().run() is the command `rl8 train path.yaml`, "
        "or rl8.Trainer(rl8.PPO(env, **hparams), **options).run(...) (the options: rl8.TrainerConfig)"
    ),
    "evaluate_policy": (
        "Stable-Baselines3's evaluate_policy(model, env) is, in rl8, Trainer(algo).eval() (a "
        "deterministic rollout in an eval env; its stats, eval/episodes/return_mean among them, "
        "logged to MLflow), algo.evaluate() (the same stats, not logged) or the command "
        "`rl8 eval RUN_ID_OR_FILE --episodes 10` (each episode's return and their mean)"
    ),
    "make_vec_env": (
        "Stable-Baselines3's make_vec_env('CartPole-v1', n_envs=4) is rl8.PPO('CartPole-v1', "
        "num_envs=4): rl8 makes and batches the envs itself"
    ),
}


def missing_name_pointer(name: str) -> str:
    """``": <what to use instead>"`` for a name of :data:`NOT_IN_RL8`, else ``""``: the end of
    the error of ``rl8.<name>`` and ``from rl8 import <name>``."""
    return f": {NOT_IN_RL8[name]} (docs/migrating.md)" if name in NOT_IN_RL8 else ""


class _Finder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Makes each old module a module whose attributes are read from the new ones; refuses the
    names of :data:`NOT_IN_RL8` as modules of rl8, saying what to use instead."""

    def find_spec(self, fullname: str, path: Any, target: Any = None) -> Any:
        package, _, name = fullname.rpartition(".")
        if package == "rl8" and name in NOT_IN_RL8:
            # ``from rl8 import name``, rl8 having no attribute ``name``, imports the module
            # rl8.<name>: its ImportError is what the statement raises
            raise ImportError(
                f"cannot import name {name!r} from 'rl8'{missing_name_pointer(name)}", name="rl8"
            )
        return importlib.util.spec_from_loader(fullname, self) if fullname in MOVED else None

    def create_module(self, spec: Any) -> types.ModuleType:
        new = MOVED[spec.name]
        warnings.warn(
            f"{spec.name} is now {' and '.join(new)} (rl8 2.0; see docs/migrating.md); the old "
            "path goes away in rl8 3.0",
            DeprecationWarning,
            stacklevel=2,
        )  # warnings skips importlib's frames
        module = types.ModuleType(spec.name, f"Moved to {', '.join(new)}.")

        def __getattr__(name: str) -> Any:
            for where in new:
                found = getattr(importlib.import_module(where), name, module)
                if found is not module:
                    return found
            raise AttributeError(
                f"module {spec.name!r} (now {' and '.join(new)}) has no attribute {name!r}"
                f"{missing_name_pointer(name)}"
            )

        module.__getattr__ = __getattr__  # type: ignore[method-assign]
        module.__all__ = sorted(
            {n for w in new for n in getattr(importlib.import_module(w), "__all__", ())}
        )
        return module

    def exec_module(self, module: types.ModuleType) -> None:
        pass


def install() -> None:
    """Let the old module paths be imported, and :data:`NOT_IN_RL8`'s names be refused with what
    to use instead (done by ``import rl8``)."""
    if not any(isinstance(f, _Finder) for f in sys.meta_path):
        sys.meta_path.append(_Finder())
