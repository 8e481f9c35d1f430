"""rl8.ppo.resolve.env_target: the one rule for env specs (dotted path or gymnasium id, rl8 or
gymnasium); gymnasium ids read from a file must be in gymnasium's registry."""

from __future__ import annotations

import gymnasium
import pytest

from rl8 import PPO
from rl8.envs import CartPole, GymnasiumEnv
from rl8.io.checkpoint import CheckpointError
from rl8.ppo.resolve import env_target, resolve_env


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


@pytest.mark.parametrize("spec", ["CartPole-v1", "CartPole", "gymnasium:CartPole-v1", "ALE/Pong-v5"])
def test_gymnasium_ids_of_a_file_that_gymnasium_registered_are_kept(spec):
    # an id without version is made at its latest; "module:" of a module imported already imports
    # nothing; ALE ids are registered by rl8's Atari preset
    assert resolve_env(spec, source="ck.pt") == spec


@pytest.mark.parametrize(
    "spec, words",
    [
        (
            "NoSuchEnv-v0",
            "'NoSuchEnv-v0', a gymnasium id that is not in gymnasium's registry of this process",
        ),
        (
            "rl8_no_such_module:Env-v0",
            "makes gymnasium import the module 'rl8_no_such_module'; rl8 refused",
        ),
    ],
)
def test_gymnasium_ids_of_a_file_that_gymnasium_did_not_register_are_refused(spec, words):
    with pytest.raises(CheckpointError, match=words):
        resolve_env(spec, source="ck.pt")
    assert resolve_env(spec, source="ck.pt", trust_code=True) == spec  # trust_code lets gymnasium try


class Unregistered(gymnasium.Env):
    """A gymnasium env that no id names."""

    observation_space = gymnasium.spaces.Box(-1.0, 1.0, (1,))
    action_space = gymnasium.spaces.Discrete(2)


@pytest.mark.parametrize(
    "make, hparams, what, form",
    [
        (
            lambda: gymnasium.make("CartPole-v1"),
            {"num_envs": 8},
            "a gymnasium env made already (one env, as gymnasium.make makes it)",
            "PPO('CartPole-v1', num_envs=8)",
        ),
        (
            lambda: gymnasium.make("CartPole-v1"),
            {},
            "a gymnasium env made already (one env, as gymnasium.make makes it)",
            "PPO('CartPole-v1', num_envs=256)",  # PPO's default
        ),
        (
            lambda: gymnasium.make_vec("CartPole-v1", num_envs=4),
            {},
            "a gymnasium vector env of numpy arrays (4 envs, as gymnasium.make_vec makes it; rl8 takes "
            "a vector env made already only when it is torch-batched, with a device)",
            "PPO('CartPole-v1', num_envs=4)",
        ),
        (
            lambda: gymnasium.make_vec("Pendulum-v1", num_envs=3, vectorization_mode="sync"),
            {},
            "a gymnasium vector env of numpy arrays (3 envs,",
            "PPO('Pendulum-v1', num_envs=3)",
        ),
        (
            Unregistered,
            {"num_envs": 4},
            "a gymnasium env made already",
            "PPO(make_one_env, num_envs=4), make_one_env a function or class that makes one env",
        ),
    ],
    ids=["make", "make-default-num-envs", "make_vec", "make_vec-sync", "no-id"],
)
def test_a_gymnasium_env_made_already_gets_the_form_ppo_takes(make, hparams, what, form):
    env = make()
    with pytest.raises(TypeError) as error:
        PPO(env, **hparams)
    message = str(error.value)
    assert message.startswith(f"env: got {what}")
    assert message.endswith(
        f"; rl8 makes and batches gymnasium envs itself: {form} (gymnasium.make's arguments: "
        "env_kwargs={'env_kwargs': {...}}; docs/gymnasium.md)"
    )
    env.close()
