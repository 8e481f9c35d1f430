"""rl8.fields' shared checks."""

from __future__ import annotations

import numpy as np
import pytest

from rl8.envs import CartPole, Catch
from rl8.fields import check_entries, check_int
from rl8.policies.recurrent import LSTMModel


@pytest.mark.parametrize("value", [3, np.int64(3), np.int32(5)])
def test_check_int_returns_a_python_int(value):
    result = check_int("Catch: rows", value, 2)
    assert result == value and type(result) is int


@pytest.mark.parametrize(
    "value, given", [(1, "1"), (2.0, "2.0"), (True, "True"), ("3", "'3'"), (None, "None")]
)
def test_check_int_names_the_field_the_expected_and_the_given_value(value, given):
    with pytest.raises(ValueError) as info:
        check_int("model_config hidden_size", value, 2)
    assert str(info.value) == f"model_config hidden_size must be an int >= 2, got {given}"


def test_envs_and_models_say_the_same():
    """One check for envs and models: the message of the env's field and of the model's."""
    with pytest.raises(ValueError, match=r"^Catch: cols must be an int >= 2, got 0$"):
        Catch(2, cols=0)
    with pytest.raises(ValueError, match=r"^CartPole: num_envs must be an int >= 1, got 0$"):
        CartPole(0)
    env = CartPole(np.int64(2))  # numpy's ints are ints
    assert type(env.num_envs) is int
    with pytest.raises(ValueError, match=r"^model_config num_layers must be an int >= 1, got 0$"):
        LSTMModel(env.observation_space, env.action_space, None, num_layers=0)


def test_did_you_mean_names_the_close_choices_or_nothing():
    from rl8.fields import did_you_mean

    assert (
        did_you_mean("critic_hidens", ["hiddens", "critic_hiddens", "activation"])
        == "; did you mean 'critic_hiddens' or 'hiddens'?"
    )
    assert did_you_mean("gama", ["gamma", "lam"], n=1) == "; did you mean 'gamma'?"
    assert did_you_mean("zzz", ["gamma", "lam"]) == ""
    assert did_you_mean("n_steps", close=["horizon"]) == "; did you mean 'horizon'?"  # found otherwise


_ENTRIES = {
    "weight": ("a number >= 0", lambda v: isinstance(v, float) and v >= 0),
    "name": ("a str", lambda v: isinstance(v, str)),
}


@pytest.mark.parametrize(
    "value, match",
    [
        (
            {"wieght": 1.0, "name": "a"},
            r"^hparam x: unknown key 'wieght'; did you mean 'weight'\? \(expected keys among "
            r"\['weight', 'name'\]\), got \{'wieght': 1.0, 'name': 'a'\}$",
        ),
        ({"weight": 1.0}, r"^hparam x\['name'\]: missing \(expected a str\)$"),
        ({"weight": -1.0, "name": "a"}, r"^hparam x\['weight'\]: expected a number >= 0, got -1.0$"),
    ],
)
def test_check_entries_names_the_key_the_expected_and_the_given_value(value, match):
    with pytest.raises(ValueError, match=match):
        check_entries(value, "hparam x", _ENTRIES, required=["name"])


def test_check_entries_accepts_known_keys_with_valid_values():
    check_entries({"weight": 0.5}, "hparam x", _ENTRIES)  # no required key: "name" may be absent
    check_entries({"weight": 0.5, "name": "a"}, "hparam x", _ENTRIES, required=["name"])
