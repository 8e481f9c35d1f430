"""Recurrent models: shapes, reset semantics, sequence == step-by-step, BPTT, config errors."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from gymnasium import spaces
from tensordict import TensorDict

from rl8.policies.distributions import Categorical, Normal
from rl8.policies.models import Model
from rl8.policies.recurrent import GRUModel, LSTMModel, RecurrentModel

MODELS = [LSTMModel, GRUModel]
OBS = spaces.Box(-1.0, 1.0, (5,), np.float32)
DISCRETE = spaces.Discrete(3)
BOX = spaces.Box(-1.0, 1.0, (2,), np.float32)
B, T = 4, 7


def make(model_cls, obs_space=OBS, action_space=DISCRETE, dist=Categorical, **config):
    torch.manual_seed(0)
    config = {"hidden_size": 8, "encoder_hiddens": (6,), **config}
    return model_cls(obs_space, action_space, dist, **config)


def random_state(model, batch=B):
    """A non-zero state, so resets are visible."""
    state = model.initial_state(batch)
    return state.apply(lambda x: torch.randn_like(x))


def run_steps(model, obs, state, firsts):
    """Reference: one T=1 call per step, chaining the state (what collection does)."""
    params, values = [], []
    for t in range(obs.shape[1]):
        p, v, state = model(obs[:, t : t + 1], state, firsts[:, t : t + 1])
        params.append(p)
        values.append(v)
    return torch.cat(params, 1), torch.cat(values, 1), state


def assert_same(a, b):
    torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


def assert_same_state(a, b):
    assert set(a.keys()) == set(b.keys())
    for k in a.keys():
        assert_same(a[k], b[k])


@pytest.mark.parametrize("model_cls", MODELS)
def test_is_a_recurrent_model(model_cls):
    model = make(model_cls)
    assert isinstance(model, RecurrentModel) and isinstance(model, Model)
    assert model.recurrent is True and model_cls.recurrent is True


@pytest.mark.parametrize("model_cls", MODELS)
@pytest.mark.parametrize(
    "action_space, dist, param_size",
    [(DISCRETE, Categorical, 3), (BOX, Normal, 4)],
    ids=["discrete", "box"],
)
def test_shapes(model_cls, action_space, dist, param_size):
    model = make(model_cls, action_space=action_space, dist=dist, num_layers=2)
    assert dist.param_size(action_space) == param_size
    state = model.initial_state(B)
    firsts = torch.zeros(B, T, dtype=torch.bool)
    params, values, new_state = model(torch.randn(B, T, 5), state, firsts)
    assert params.shape == (B, T, param_size) and params.dtype == torch.float32
    assert values.shape == (B, T) and values.dtype == torch.float32
    assert new_state.batch_size == torch.Size([B])
    for k in state.keys():
        assert new_state[k].shape == state[k].shape == (B, 2, 8)
        assert new_state[k].dtype == torch.float32
    assert model.value(torch.randn(B, T, 5), state, firsts).shape == (B, T)


@pytest.mark.parametrize("model_cls", MODELS)
def test_dict_observations(model_cls):
    space = spaces.Dict(
        {
            "pos": spaces.Box(-1.0, 1.0, (2, 3), np.float32),
            "kind": spaces.Discrete(4),
            "action_mask": spaces.MultiBinary(3),
        }
    )
    model = make(model_cls, obs_space=space)
    obs = TensorDict(
        {
            "pos": torch.randn(B, T, 2, 3),
            "kind": torch.randint(0, 4, (B, T)),
            "action_mask": torch.ones(B, T, 3, dtype=torch.bool),
        },
        batch_size=[B, T],
    )
    firsts = torch.zeros(B, T, dtype=torch.bool)
    firsts[:, 0] = True
    params, values, state = model(obs, model.initial_state(B), firsts)
    assert params.shape == (B, T, 3) and values.shape == (B, T)
    # Step by step with TensorDict obs gives the same.
    p2, v2, s2 = run_steps(model, obs, model.initial_state(B), firsts)
    assert_same(params, p2)
    assert_same(values, v2)
    assert_same_state(state, s2)


def test_discrete_observations():
    model = make(GRUModel, obs_space=spaces.Discrete(6), encoder_hiddens=())
    obs = torch.randint(0, 6, (B, T))
    params, values, _ = model(obs, model.initial_state(B), torch.zeros(B, T, dtype=torch.bool))
    assert params.shape == (B, T, 3) and values.shape == (B, T)


@pytest.mark.parametrize("model_cls", MODELS)
def test_initial_state_is_zeros_batch_first(model_cls):
    model = make(model_cls, num_layers=3)
    state = model.initial_state(5, device="cpu")
    assert isinstance(state, TensorDict)
    assert state.batch_size == torch.Size([5])
    expected_keys = {"h", "c"} if model_cls is LSTMModel else {"h"}
    assert set(state.keys()) == expected_keys
    for k in expected_keys:
        assert state[k].shape == (5, 3, 8)
        assert state[k].dtype == torch.float32
        assert state[k].device == torch.device("cpu")
        assert torch.count_nonzero(state[k]) == 0
    # Batch dim first: the state can live in (and be indexed from) a per-env buffer.
    buffer = model.initial_state(5).expand(2, 5).clone()  # e.g. [num_seqs, num_envs]
    buffer[1] = random_state(model, 5)
    assert_same_state(buffer[1][torch.tensor([0, 3])], buffer[1][[0, 3]])


@pytest.mark.parametrize("model_cls", MODELS)
def test_firsts_reset_the_row_before_that_step(model_cls):
    """A row with firsts[:, t] = True equals running it from the initial state starting at t."""
    model = make(model_cls, num_layers=2)
    obs = torch.randn(B, T, 5)
    state = random_state(model)
    firsts = torch.zeros(B, T, dtype=torch.bool)
    firsts[1, 0] = True
    firsts[2, 3] = True
    firsts[3, 2] = firsts[3, 5] = True
    params, values, new_state = model(obs, state, firsts)

    def alone(row, start, row_state):
        s = row_state if row_state is not None else model.initial_state(1)
        return model(obs[row : row + 1, start:], s, torch.zeros(1, T - start, dtype=torch.bool))

    # Row 0: no reset -> runs from the given state.
    p, v, s = alone(0, 0, state[0:1])
    assert_same(params[0:1], p)
    assert_same(values[0:1], v)
    assert_same_state(new_state[0:1], s)
    # Row 1: reset at step 0 -> the given state is ignored.
    p, v, s = alone(1, 0, None)
    assert_same(params[1:2], p)
    assert_same(values[1:2], v)
    # Row 2: reset at step 3 -> steps 3.. equal a fresh run from step 3; steps 0..2 used the state.
    p, v, s = alone(2, 3, None)
    assert_same(params[2:3, 3:], p)
    assert_same(values[2:3, 3:], v)
    assert_same_state(new_state[2:3], s)
    p, _, _ = alone(2, 0, state[2:3])
    assert_same(params[2:3, :3], p[:, :3])
    assert not torch.allclose(params[2:3, 3:], p[:, 3:], atol=1e-7)  # the reset mattered
    # Row 3: two resets -> the last one decides the tail.
    p, v, s = alone(3, 5, None)
    assert_same(params[3:4, 5:], p)
    assert_same_state(new_state[3:4], s)
    # The reset only touched its own row.
    p, _, _ = alone(0, 0, state[0:1])
    assert_same(params[0:1], p)


@pytest.mark.parametrize("model_cls", MODELS)
def test_fast_path_equals_step_loop(model_cls):
    """The one-call fast path and the per-step loop give identical results."""
    model = make(model_cls, num_layers=2)
    obs = torch.randn(B, T, 5)
    state = random_state(model)
    firsts = torch.zeros(B, T, dtype=torch.bool)
    firsts[[0, 2], 0] = True  # resets at step 0 only: the fast path
    x = model._encode(obs)
    y_fast, s_fast = model._run(x, state, firsts, [0])
    y_slow, s_slow = model._run(x, state, firsts, list(range(T)))
    y_seg, s_seg = model._run(x, state, firsts, [0, 3, 4])
    assert_same(y_fast, y_slow)
    assert_same(y_fast, y_seg)
    assert_same_state(s_fast, s_slow)
    assert_same_state(s_fast, s_seg)
    # With resets inside the sequence the segmented path equals the per-step loop.
    firsts[1, 4] = firsts[3, 2] = True
    y_slow, s_slow = model._run(x, state, firsts, list(range(T)))
    y_seg, s_seg = model._run(x, state, firsts, [0, 2, 4])
    assert_same(y_seg, y_slow)
    assert_same_state(s_seg, s_slow)
    params, _, new_state = model(obs, state, firsts)  # forward picks the segments itself
    assert_same(params, model.distribution_params(model.pi(y_slow)))
    assert_same_state(new_state, s_slow)


@pytest.mark.parametrize("model_cls", MODELS)
@pytest.mark.parametrize("resets", ["none", "start", "inside"])
def test_sequence_equals_step_by_step(model_cls, resets):
    """What PPO relies on: collection steps one at a time, training replays the sequence."""
    model = make(model_cls, num_layers=2)
    obs = torch.randn(B, T, 5)
    state = random_state(model)
    firsts = torch.zeros(B, T, dtype=torch.bool)
    if resets != "none":
        firsts[[1, 3], 0] = True
    if resets == "inside":
        firsts[0, 2] = firsts[2, 6] = firsts[3, 4] = True
    p_seq, v_seq, s_seq = model(obs, state, firsts)
    p_step, v_step, s_step = run_steps(model, obs, state, firsts)
    assert_same(p_seq, p_step)
    assert_same(v_seq, v_step)
    assert_same_state(s_seq, s_step)
    assert_same(model.value(obs, state, firsts), v_seq)
    # Splitting the sequence in two chained calls also gives the same.
    p1, _, s1 = model(obs[:, :3], state, firsts[:, :3])
    p2, _, s2 = model(obs[:, 3:], s1, firsts[:, 3:])
    assert_same(torch.cat([p1, p2], 1), p_seq)
    assert_same_state(s2, s_seq)


@pytest.mark.parametrize("model_cls", MODELS)
def test_gradients_flow_through_time(model_cls):
    model = make(model_cls)
    obs = torch.randn(B, T, 5, requires_grad=True)
    firsts = torch.zeros(B, T, dtype=torch.bool)
    params, values, _ = model(obs, model.initial_state(B), firsts)
    (params[:, -1].sum() + values[:, -1].sum()).backward()
    assert obs.grad[:, 0].abs().sum() > 0  # the first step's input reaches the last output
    for name, p in model.named_parameters():
        assert p.grad is not None, name
    assert model.encoder[0].weight.grad.abs().sum() > 0

    # A reset inside the sequence cuts the path from earlier steps (for that row only).
    obs.grad = None
    firsts[0, 3] = True
    params, _, _ = model(obs, model.initial_state(B), firsts)
    params[:, -1].sum().backward()
    assert torch.count_nonzero(obs.grad[0, :3]) == 0
    assert obs.grad[0, 3:].abs().sum() > 0
    assert obs.grad[1, 0].abs().sum() > 0


@pytest.mark.parametrize("model_cls", MODELS)
def test_gaussian_learned_log_std(model_cls):
    model = make(model_cls, action_space=BOX, dist=Normal, init_log_std=-0.5)
    assert isinstance(model.log_std, torch.nn.Parameter)
    assert model.log_std.shape == (2,)
    params, _, _ = model(
        torch.randn(B, T, 5), model.initial_state(B), torch.zeros(B, T, dtype=torch.bool)
    )
    assert params.shape == (B, T, 4)
    torch.testing.assert_close(params[..., 2:], torch.full((B, T, 2), -0.5))
    params[..., 2:].sum().backward()
    assert model.log_std.grad is not None and model.log_std.grad.abs().sum() > 0
    # State-dependent std: the head outputs both, no log_std parameter.
    model = make(model_cls, action_space=BOX, dist=Normal, state_dependent_std=True)
    assert not hasattr(model, "log_std")
    assert model.pi.out_features == 4
    # A categorical model has no log_std.
    assert not hasattr(make(model_cls), "log_std")


@pytest.mark.parametrize("model_cls", MODELS)
def test_initialisation(model_cls):
    model = make(model_cls, hidden_size=16)
    for name, p in model.rnn.named_parameters():
        if name.startswith("bias"):
            assert torch.count_nonzero(p) == 0, name
        else:  # orthogonal: rows or columns orthonormal
            m = p.detach()
            gram = m.T @ m if m.shape[0] >= m.shape[1] else m @ m.T
            torch.testing.assert_close(gram, torch.eye(gram.shape[0]), atol=1e-4, rtol=0)
    assert torch.count_nonzero(model.pi.bias) == 0
    # Policy head gain 0.01, value head gain 1: singular values equal the gain.
    torch.testing.assert_close(
        torch.linalg.svdvals(model.pi.weight.detach()), torch.full((3,), 0.01), atol=1e-5, rtol=0
    )
    torch.testing.assert_close(
        torch.linalg.svdvals(model.vf.weight.detach()), torch.ones(1), atol=1e-5, rtol=0
    )


def test_autocast_keeps_state_dtype():
    model = make(LSTMModel)
    state = model.initial_state(B)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        _, _, new_state = model(torch.randn(B, T, 5), state, torch.zeros(B, T, dtype=torch.bool))
    assert all(new_state[k].dtype == torch.float32 for k in new_state.keys())


@pytest.mark.parametrize(
    "config, field, expected, given",
    [
        ({"hidden_size": 0}, "hidden_size", "must be an int >= 1", "0"),
        ({"hidden_size": 2.5}, "hidden_size", "must be an int >= 1", "2.5"),
        ({"num_layers": 0}, "num_layers", "must be an int >= 1", "0"),
        ({"num_layers": True}, "num_layers", "must be an int >= 1", "True"),
        ({"encoder_hiddens": (8, 0)}, "encoder_hiddens", "expected a sequence of ints >= 1", "(8, 0)"),
        ({"activation": "nope"}, "activation", "expected one of", "'nope'"),
    ],
)
@pytest.mark.parametrize("model_cls", MODELS)
def test_config_errors_name_the_field(model_cls, config, field, expected, given):
    with pytest.raises(ValueError) as info:
        model_cls(OBS, DISCRETE, Categorical, **config)
    message = str(info.value)
    assert field in message and expected in message and given in message


def test_mismatched_shapes_raise():
    model = make(GRUModel)
    with pytest.raises(ValueError, match="same B and T"):
        model(torch.randn(B, T, 5), model.initial_state(B + 1), torch.zeros(B, T, dtype=torch.bool))


def test_config_is_recorded():
    model = make(LSTMModel, encoder_hiddens=[6, 6], num_layers=2)
    assert model.config["hidden_size"] == 8
    assert model.config["num_layers"] == 2
    assert model.config["encoder_hiddens"] == (6, 6)


def test_custom_recurrent_model_default_value():
    """RecurrentModel.value defaults to forward(...)[1]."""

    class Counter(RecurrentModel):
        def initial_state(self, batch_size, device="cpu"):
            return TensorDict({"n": torch.zeros(batch_size, 1)}, batch_size=[batch_size], device=device)

        def forward(self, obs, state, firsts):
            n, values = state["n"], []
            for t in range(obs.shape[1]):
                n = torch.where(firsts[:, t : t + 1], 0.0, n) + 1
                values.append(n)
            values = torch.cat(values, 1)
            params = torch.zeros(*values.shape, 3)
            return params, values, TensorDict({"n": n}, batch_size=state.batch_size)

    model = Counter(OBS, DISCRETE, Categorical)
    firsts = torch.tensor([[False, False, True, False]])
    values = model.value(torch.zeros(1, 4, 5), model.initial_state(1), firsts)
    assert values.tolist() == [[1.0, 2.0, 1.0, 2.0]]
