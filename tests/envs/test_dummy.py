"""The 1-D dummy envs: dynamics, rewards, shapes, config and the aliasing rule."""

from __future__ import annotations

import pytest
import torch

from rl8.envs import ContinuousDummyEnv, DiscreteDummyEnv
from rl8.envs.base import validate_step_output


def toward_origin(env, x: torch.Tensor) -> torch.Tensor:
    if isinstance(env, DiscreteDummyEnv):
        step = env.params["step_size"]
        return torch.where(x > step / 2, 0, torch.where(x < -step / 2, 2, 1)).squeeze(1)
    return (-x / env.params["step_size"]).clamp(-1, 1)


@pytest.mark.parametrize("cls", [DiscreteDummyEnv, ContinuousDummyEnv])
@pytest.mark.parametrize("config", [None, {"bounds": 2.0, "step_size": 0.25}])
def test_policy_toward_origin_reaches_it(cls, config):
    n = 64
    env = cls(n)
    x = env.reset(config=config, seed=0)
    bounds, step = env.params["bounds"], env.params["step_size"]
    assert x.shape == (n, 1) and x.dtype == torch.float32 and x.abs().max() <= bounds
    assert x.abs().max() > bounds / 2
    max_steps = int(bounds / step) + 1
    for _ in range(max_steps):
        out = env.step(toward_origin(env, x))
        validate_step_output(out, env)
        x = out["obs"]
        assert torch.equal(out["rewards"], -x.abs())
    assert x.abs().max() < step
    for _ in range(5):  # and stays there
        x = env.step(toward_origin(env, x))["obs"]
        assert x.abs().max() < step


@pytest.mark.parametrize("cls", [DiscreteDummyEnv, ContinuousDummyEnv])
def test_shapes_dtypes_and_clamping(cls):
    env = cls(6)
    env.reset(seed=1)
    outward = torch.where(env.x.squeeze(1) > 0, 2, 0) if cls is DiscreteDummyEnv else env.x.sign() * 5
    for _ in range(15):
        out = env.step(outward)
    validate_step_output(out, env)
    assert set(out.keys()) == {"obs", "rewards"}
    assert out["obs"].shape == (6, 1) and out["obs"].dtype == torch.float32
    assert out["rewards"].shape == (6, 1) and out["rewards"].dtype == torch.float32
    assert torch.equal(out["obs"].abs(), torch.ones(6, 1))  # clamped to the bounds
    assert not cls.episodic


def test_exact_moves():
    env = DiscreteDummyEnv(3)
    env.reset()
    env.x = torch.zeros(3, 1)
    out = env.step(torch.tensor([0, 1, 2]))
    torch.testing.assert_close(out["obs"], torch.tensor([[-0.1], [0.0], [0.1]]))
    torch.testing.assert_close(out["rewards"], torch.tensor([[-0.1], [0.0], [-0.1]]))
    env.x = torch.zeros(3, 1)
    out = env.step(torch.tensor([[2], [2], [0]]))  # [N, 1] actions are accepted too
    torch.testing.assert_close(out["obs"], torch.tensor([[0.1], [0.1], [-0.1]]))
    cont = ContinuousDummyEnv(3)
    cont.reset()
    cont.x = torch.zeros(3, 1)
    out = cont.step(torch.tensor([[-0.5], [3.0], [0.2]]))
    torch.testing.assert_close(out["obs"], torch.tensor([[-0.05], [0.1], [0.02]]))


@pytest.mark.parametrize("cls", [DiscreteDummyEnv, ContinuousDummyEnv])
def test_returned_tensors_are_not_mutated_later(cls):
    env = cls(4)
    first = env.reset(seed=0)
    kept = first.clone()
    discrete = cls is DiscreteDummyEnv
    out = env.step(torch.full((4,), 2) if discrete else torch.ones(4, 1))
    obs, rewards = out["obs"].clone(), out["rewards"].clone()
    env.step(torch.zeros(4, dtype=torch.int64) if discrete else -torch.ones(4, 1))
    assert torch.equal(first, kept)
    assert torch.equal(out["obs"], obs) and torch.equal(out["rewards"], rewards)


@pytest.mark.parametrize("cls", [DiscreteDummyEnv, ContinuousDummyEnv])
def test_seeding_and_config_errors(cls):
    a, b = cls(8), cls(8)
    assert torch.equal(a.reset(seed=3), b.reset(seed=3))
    assert not torch.equal(a.reset(seed=3), a.reset(seed=4))
    assert len(set(a.reset(seed=5).squeeze(1).tolist())) == 8
    with pytest.raises(KeyError, match="'bounds', 'step_size'"):
        a.reset(config={"bound": 2.0})
    with pytest.raises(ValueError, match="step_size"):
        a.reset(config={"step_size": -1.0})


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_steps_without_host_sync():
    for cls, action in (
        (DiscreteDummyEnv, torch.randint(0, 3, (64,), device="cuda")),
        (ContinuousDummyEnv, torch.rand(64, 1, device="cuda") * 4 - 2),
    ):
        env = cls(64, device="cuda")
        env.reset(seed=0)
        torch.cuda.synchronize()
        torch.cuda.set_sync_debug_mode("error")
        try:
            for _ in range(20):
                out = env.step(action)
        finally:
            torch.cuda.set_sync_debug_mode("default")
        validate_step_output(out, env)
        assert out["obs"].device.type == "cuda"


def test_step_output_is_the_contract_tensordict():
    """Env.step_output (tensordict's unchecked constructor) gives what TensorDict(...) gives."""
    from tensordict import TensorDict

    env = DiscreteDummyEnv(4)
    obs, rewards = torch.randn(4, 1), torch.randn(4, 1)
    nested = {"pos": torch.randn(4, 2), "mask": torch.ones(4, 3, dtype=torch.bool)}
    out = env.step_output({"obs": obs, "rewards": rewards, "nested": nested})
    expected = TensorDict(
        {"obs": obs, "rewards": rewards, "nested": nested}, batch_size=[4], device="cpu"
    )
    assert type(out) is TensorDict and out.batch_size == (4,) and out.device == torch.device("cpu")
    assert set(out.keys(include_nested=True)) == set(expected.keys(include_nested=True))
    assert out["obs"] is obs and out["rewards"] is rewards  # no copies
    assert (out == expected).all()
    assert isinstance(out["nested"], TensorDict) and out["nested"].batch_size == (4,)
    validate_step_output(env.step(torch.tensor([0, 1, 2, 1])), env)
