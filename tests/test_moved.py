"""rl8.moved: the module paths of rl8 1.x and of its earlier layouts import with a warning naming
the new one, and names rl8 has not point to what to use (docs/migrating.md)."""

from __future__ import annotations

import importlib
import re
import sys

import pytest

import rl8
from rl8.moved import MOVED, NOT_IN_RL8


@pytest.mark.parametrize("old", sorted(MOVED))
def test_every_old_module_path_imports_with_a_warning_naming_the_new_one(old, monkeypatch):
    monkeypatch.delitem(sys.modules, old, raising=False)
    with pytest.warns(
        DeprecationWarning, match=rf"{old} is now {MOVED[old][0]}.* see docs/migrating.md"
    ):
        module = importlib.import_module(old)
    new = [importlib.import_module(n) for n in MOVED[old]]
    assert module.__all__, old
    for name in module.__all__:  # every public name of the new modules, the same object
        assert any(getattr(module, name) is getattr(n, name, None) for n in new), (old, name)
    with pytest.raises(AttributeError, match="has no attribute 'nope'"):
        module.nope
    monkeypatch.delitem(sys.modules, old)


@pytest.mark.parametrize("name", sorted(NOT_IN_RL8))
def test_names_rl8_has_not_are_import_and_attribute_errors_saying_what_to_use(name):
    pointer = f": {NOT_IN_RL8[name]} (docs/migrating.md)"
    with pytest.raises(ImportError) as error:
        exec(f"from rl8 import {name}", {})
    assert str(error.value) == f"cannot import name {name!r} from 'rl8'{pointer}"
    with pytest.raises(AttributeError) as error:
        getattr(rl8, name)
    assert str(error.value) == f"module 'rl8' has no attribute {name!r}{pointer}"
    assert not hasattr(rl8, name)


@pytest.mark.parametrize(
    "name, pointer",
    [
        (
            "evaluate_policy",
            "Stable-Baselines3's evaluate_policy(model, env) is, in rl8, Trainer(algo).eval()",
        ),
        (
            "evaluate_policy",
            "algo.evaluate() (the same stats, not logged) or the command `rl8 eval RUN_ID_OR_FILE",
        ),
        ("make_vec_env", "make_vec_env('CartPole-v1', n_envs=4) is rl8.PPO('CartPole-v1', num_envs=4)"),
        ("Algorithm", "rl8 1.0's Algorithm(env_cls, **config) is rl8.PPO(env, **hparams)"),
        (
            "TrainConfig",
            "rl8 1.0's TrainConfig.from_file(path).build().run() is the command `rl8 train path.yaml`",
        ),
    ],
)
def test_the_names_of_the_issue_point_to_rl8s_way(name, pointer):
    with pytest.raises(ImportError, match=re.escape(pointer)):
        exec(f"from rl8 import {name}", {})


def test_other_names_rl8_has_not_keep_pythons_errors():
    with pytest.raises(ImportError, match=r"^cannot import name 'Nope' from 'rl8' \("):
        from rl8 import Nope  # noqa: F401
    with pytest.raises(AttributeError, match=r"^module 'rl8' has no attribute 'Nope'$"):
        rl8.Nope


def test_rl8_1_0_0s_paths_import_their_classes(monkeypatch):
    for old in ("rl8.conditions", "rl8.trainers", "rl8.env"):
        monkeypatch.delitem(sys.modules, old, raising=False)
    with pytest.warns(DeprecationWarning, match="rl8.training.conditions"):
        from rl8.conditions import HitsUpperBound
    with pytest.warns(DeprecationWarning, match="rl8.training.trainer and rl8.training.config"):
        from rl8.trainers import Trainer
    with pytest.warns(DeprecationWarning, match="rl8.envs.base and rl8.envs.dummy"):
        from rl8.env import DiscreteDummyEnv, Env
    from rl8 import Env as new_env
    from rl8.envs import DiscreteDummyEnv as new_dummy
    from rl8.training.conditions import HitsUpperBound as new_bound
    from rl8.training.trainer import Trainer as new_trainer

    assert (HitsUpperBound, Trainer, Env, DiscreteDummyEnv) == (
        new_bound,
        new_trainer,
        new_env,
        new_dummy,
    )


def test_a_1_0_0_name_rl8_has_not_says_what_to_use_through_its_old_module(monkeypatch):
    monkeypatch.delitem(sys.modules, "rl8.algorithms", raising=False)
    with pytest.warns(DeprecationWarning, match="rl8.ppo.algorithm"):
        algorithms = importlib.import_module("rl8.algorithms")
    with pytest.raises(AttributeError, match=re.escape(f"'Algorithm': {NOT_IN_RL8['Algorithm']}")):
        algorithms.Algorithm


@pytest.mark.parametrize(
    "path", ["rl8.overlap", "rl8.actors", "rl8.finite", "rl8.rollout", "rl8.checkpoint"]
)
def test_the_paths_of_unreleased_layouts_are_gone(path):
    with pytest.raises(ModuleNotFoundError, match=f"No module named '{path}'"):
        importlib.import_module(path)
