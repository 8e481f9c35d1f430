"""rl8._resolve.env_target: the one rule for env specs (dotted path or gymnasium id, rl8 or gymnasium)."""

from __future__ import annotations

import gymnasium
import pytest

from rl8._resolve import env_target
from rl8.checkpoint import CheckpointError
from rl8.envs import CartPole, GymnasiumEnv


def make_cartpole():
    """A gymnasium maker named by a dotted path."""
    return gymnasium.make("CartPole-v1")


@pytest.mark.parametrize("spec", [CartPole, "rl8.envs.CartPole", "rl8.envs.cartpole.CartPole"])
def test_rl8_env_classes_and_their_dotted_paths(spec):
    assert env_target(spec) == (CartPole, False)


@pytest.mark.parametrize("spec", ["CartPole-v1", "ALE/Pong-v5", "Mod.Env-v0"])
def test_gymnasium_ids_stay_strings(spec):
    # upper-case start or a slash: a gymnasium id, never imported
    assert env_target(spec) == (spec, True)


def test_gymnasium_makers_and_factories():
    assert env_target(make_cartpole) == (make_cartpole, True)
    assert env_target(f"{__name__}.make_cartpole") == (make_cartpole, True)
    factory = GymnasiumEnv.make_factory("CartPole-v1")
    assert env_target(factory) == (factory, True)


def test_a_file_cannot_name_a_plain_function_as_env():
    with pytest.raises(CheckpointError, match="trust_code=True"):
        env_target(f"{__name__}.make_cartpole", source="ck.pt")
    assert env_target(f"{__name__}.make_cartpole", source="ck.pt", trust_code=True).gymnasium


def test_anything_else_is_a_type_error_naming_the_field():
    with pytest.raises(TypeError, match=r"env: expected an rl8.Env subclass.*got 3"):
        env_target(3)
