"""The Memory task: cue on the first step only, answer on the last, reward for recall."""

from __future__ import annotations

import pytest
import torch

from rl8.envs import Memory
from rl8.envs.base import validate_step_output


def play(env, episodes, policy):
    """Run ``episodes`` episodes; return the per-env returns and the per-step outputs."""
    obs = env.reset(seed=0)
    returns = torch.zeros(env.num_envs)
    memory = torch.zeros(env.num_envs, dtype=torch.int64)
    outs = []
    for _ in range(episodes * (env.params["delay"] + 1)):
        cue_shown = obs[:, : env.num_cues].sum(1) > 0
        memory = torch.where(cue_shown, obs[:, : env.num_cues].argmax(1), memory)
        out = env.step(policy(obs, memory))
        validate_step_output(out, env)
        returns += out["rewards"].squeeze(1)
        outs.append(out)
        obs = out["obs"]
    return returns, outs


@pytest.mark.parametrize("delay,num_cues", [(4, 2), (0, 3), (2, 5)])
def test_remembering_policy_scores_one_per_episode(delay, num_cues):
    env = Memory(16, delay=delay, num_cues=num_cues)
    returns, _ = play(env, 6, lambda obs, memory: memory)
    assert torch.equal(returns, torch.full((16,), 6.0))


@pytest.mark.parametrize("num_cues", [2, 4])
def test_constant_policy_scores_chance(num_cues):
    env = Memory(2000, num_cues=num_cues)
    returns, _ = play(env, 3, lambda obs, memory: torch.zeros(2000, dtype=torch.int64))
    assert returns.mean().item() / 3 == pytest.approx(1 / num_cues, abs=0.03)


def test_observations_and_episode_length():
    delay, k, n = 3, 2, 32
    env = Memory(n, delay=delay, num_cues=k)
    obs = env.reset(seed=1)
    assert obs.shape == (n, k + 1) and obs.dtype == torch.float32
    seen_cues = set()
    for episode in range(3):
        for t in range(delay + 1):
            if t == 0:
                assert torch.equal(obs[:, :k].sum(1), torch.ones(n))  # one-hot cue
                seen_cues.update(obs[:, :k].argmax(1).tolist())
            else:
                assert not obs[:, :k].any()
            assert torch.equal(obs[:, k], torch.full((n,), float(t == delay)))
            out = env.step(torch.zeros(n, dtype=torch.int64))
            ended = t == delay
            assert out["terminated"].all().item() == ended
            assert out["terminated"].any().item() == ended
            assert not out["truncated"].any()
            if ended:
                assert not out["final_obs"].any()
            else:
                assert torch.equal(out["final_obs"], out["obs"])
                assert not out["rewards"].any()
            obs = out["obs"]
    assert seen_cues == {0, 1}


def test_config_seeding_and_errors():
    env = Memory(4)
    assert env.params == {"delay": 4}
    env.reset(config={"delay": 1})
    zeros = torch.zeros(4, dtype=torch.int64)
    ends = [env.step(zeros)["terminated"].all().item() for _ in range(4)]
    assert ends == [False, True, False, True]
    with pytest.raises(KeyError, match="'delay'"):
        env.reset(config={"num_cues": 3})
    with pytest.raises(ValueError, match="num_cues"):
        Memory(4, num_cues=1)
    a, b = Memory(64), Memory(64)
    assert torch.equal(a.reset(seed=2), b.reset(seed=2))
    assert not torch.equal(a.reset(seed=2), a.reset(seed=3))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_steps_without_host_sync():
    env = Memory(64, device="cuda")
    env.reset(seed=0)
    action = torch.randint(0, 2, (64,), device="cuda")
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        for _ in range(12):
            out = env.step(action)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    validate_step_output(out, env)
    assert out["obs"].device.type == "cuda" and out["final_obs"].device.type == "cuda"
