"""Policy.predict: numpy or torch, one observation or a batch, Dict observations, recurrent state."""

from __future__ import annotations

import gymnasium
import numpy as np
import pytest
import torch
from gymnasium import spaces

from rl8 import LSTMModel, Policy, load_policy, save_policy

BOX4 = spaces.Box(-1.0, 1.0, (4,), np.float32)


def _policy(observation_space=BOX4, action_space=spaces.Discrete(3), **kwargs) -> Policy:
    torch.manual_seed(0)
    return Policy(observation_space, action_space, model_config={"hiddens": (16,)}, **kwargs)


def _observations(n: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).uniform(-1, 1, (n, 4)).astype(np.float32)


def test_predict_one_numpy_observation_plays_a_gymnasium_episode(tmp_path):
    env = gymnasium.make("CartPole-v1", max_episode_steps=50)
    save_policy(_policy(env.observation_space, env.action_space), tmp_path / "policy.pt")
    policy = load_policy(tmp_path / "policy.pt")
    obs, _ = env.reset(seed=0)
    steps, done = 0, False
    while not done:
        action, state = policy.predict(obs)
        assert action.shape == () and action.dtype == np.int64 and state is None
        assert env.action_space.contains(action)
        obs, _, terminated, truncated, _ = env.step(action)
        steps, done = steps + 1, terminated or truncated
    assert steps > 0


def test_predict_batch_matches_single_observations_and_the_batched_call():
    policy = _policy()
    obs = _observations(5)
    actions, _ = policy.predict(obs)
    assert isinstance(actions, np.ndarray) and actions.shape == (5,)
    assert [int(policy.predict(row)[0]) for row in obs] == actions.tolist()
    assert actions.tolist() == policy(torch.from_numpy(obs)).tolist()


def test_predict_takes_torch_tensors_lists_and_other_dtypes():
    policy = _policy()
    obs = _observations(3)
    expected, _ = policy.predict(obs)
    np.testing.assert_array_equal(policy.predict(torch.from_numpy(obs))[0], expected)
    np.testing.assert_array_equal(policy.predict(obs.astype(np.float64))[0], expected)
    np.testing.assert_array_equal(policy.predict(obs.tolist())[0], expected)


def test_predict_samples_when_not_deterministic():
    policy = _policy()
    obs = np.zeros((2000, 4), np.float32)
    torch.manual_seed(1)
    sampled, _ = policy.predict(obs, deterministic=False)
    assert len(np.unique(sampled)) == 3
    assert len(np.unique(policy.predict(obs)[0])) == 1


def test_predict_wrong_shape_names_the_expected_and_given_shape():
    policy = _policy()
    with pytest.raises(ValueError, match=r"obs: expected shape \(4,\) .* or \(B, 4\) .*got \(3,\)"):
        policy.predict(np.zeros(3, np.float32))
    with pytest.raises(ValueError, match=r"got \(2, 5\)"):
        policy.predict(np.zeros((2, 5), np.float32))


DICT_SPACE = spaces.Dict({"obs": BOX4, "action_mask": spaces.MultiBinary(3)})


def test_predict_dict_observations_one_or_a_batch_with_an_action_mask():
    policy = _policy(DICT_SPACE)
    obs = _observations(4)
    mask = np.array([[1, 0, 0], [0, 1, 0], [0, 0, 1], [0, 1, 0]], np.int8)
    actions, _ = policy.predict({"obs": obs, "action_mask": mask})
    assert actions.tolist() == [0, 1, 2, 1]
    one, _ = policy.predict({"obs": obs[2], "action_mask": mask[2]})
    assert one.shape == () and int(one) == 2


def test_predict_dict_observation_errors_name_the_entry():
    policy = _policy(DICT_SPACE)
    with pytest.raises(
        ValueError,
        match=r"expected the keys \['action_mask', 'obs'\], got \['obs'\] \(missing \['action_mask'\]\)",
    ):
        policy.predict({"obs": np.zeros(4, np.float32)})
    with pytest.raises(ValueError, match=r"obs\['action_mask'\]: expected shape \(3,\) .*got \(2,\)"):
        policy.predict({"obs": np.zeros(4, np.float32), "action_mask": np.ones(2)})
    with pytest.raises(ValueError, match="same size in every entry"):
        policy.predict({"obs": np.zeros((2, 4), np.float32), "action_mask": np.ones(3)})


def test_predict_box_actions_are_clipped_into_the_space_and_keep_its_dtype():
    space = spaces.Box(-0.1, 0.1, (2,), np.float64)
    policy = _policy(action_space=space)
    with torch.no_grad():  # push the means far beyond the bounds
        policy.model.pi[-1].bias.fill_(50.0)
    actions, _ = policy.predict(_observations(8), deterministic=False)
    assert actions.dtype == np.float64 and actions.shape == (8, 2)
    assert all(space.contains(a) for a in actions)
    np.testing.assert_array_equal(actions, 0.1)


def test_predict_discrete_with_a_start_returns_actions_of_the_space():
    space = spaces.Discrete(3, start=5)
    actions, _ = _policy(action_space=space).predict(_observations(50), deterministic=False)
    assert all(space.contains(a) for a in actions) and actions.min() >= 5


def _recurrent_policy() -> Policy:
    torch.manual_seed(0)
    return Policy(BOX4, spaces.Discrete(3), model_cls=LSTMModel, model_config={"hidden_size": 8})


def test_predict_threads_the_recurrent_state():
    policy = _recurrent_policy()
    obs = _observations(6)  # one episode of 6 steps
    state = None
    for t in range(6):
        action, state = policy.predict(obs[t], state=state)
        assert action.shape == () and tuple(state.batch_size) == (1,)
    # the state after 6 threaded steps is that of the model run on the whole sequence
    firsts = torch.zeros(1, 6, dtype=torch.bool)
    with torch.no_grad():
        _, _, expected = policy.model(torch.from_numpy(obs)[None], policy.initial_state(1), firsts)
    for key in expected.keys():
        torch.testing.assert_close(state[key], expected[key])
    with pytest.raises(AssertionError):  # and not the initial state
        torch.testing.assert_close(state["h"], policy.initial_state(1)["h"])


def test_predict_episode_start_resets_the_recurrent_state_of_those_envs():
    policy = _recurrent_policy()
    obs = _observations(2)
    _, state = policy.predict(obs)
    _, state = policy.predict(obs, state=state)
    _, reset = policy.predict(obs, state=state, episode_start=np.array([True, False]))
    _, fresh = policy.predict(obs)
    _, kept = policy.predict(obs, state=state)
    torch.testing.assert_close(reset["h"][0], fresh["h"][0])
    torch.testing.assert_close(reset["h"][1], kept["h"][1])


def test_predict_recurrent_state_of_another_batch_size_is_an_error():
    policy = _recurrent_policy()
    _, state = policy.predict(_observations(2))
    with pytest.raises(
        ValueError, match=r"state: expected the state of 3 env\(s\).*got batch size \[2\]"
    ):
        policy.predict(_observations(3), state=state)
