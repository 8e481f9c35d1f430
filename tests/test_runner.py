"""The one episode runner (rl8.policies.runner.run_policy) for feedforward, recurrent and plain policies."""

from __future__ import annotations

import hparams
import pytest
import torch

from rl8 import PPO
from rl8.envs import CartPole, Pendulum
from rl8.policies.recurrent import GRUModel
from rl8.policies.runner import done_flags, run_policy

SMALL = {**hparams.SMALL, "num_envs": 4, "sgd_minibatch_size": 16}
GRU = dict(model_cls=GRUModel, model_config={"hidden_size": 8}, seq_len=4)


def reference_run(policy, env, obs, num_steps):
    """The documented way to run a policy by hand: call it, reset its state where episodes end."""
    policy.reset_state()
    actions, rewards, dones = [], [], []
    for _ in range(num_steps):
        action = policy(obs)
        out = env.step(action)
        done = out["terminated"][:, 0] | out["truncated"][:, 0]
        policy.reset_state(done)
        actions.append(action)
        rewards.append(out["rewards"][:, 0])
        dones.append(done)
        obs = out["obs"]
    policy.reset_state()
    return torch.stack(actions), torch.stack(rewards), torch.stack(dones)


def run(policy, env, obs, num_steps, **kwargs):
    steps = list(run_policy(policy, env, obs, num_steps=num_steps, **kwargs))
    return (
        torch.stack([s.actions for s in steps]),
        torch.stack([s.rewards for s in steps]),
        torch.stack([s.done for s in steps]),
        steps,
    )


def test_feedforward_policy_matches_the_reference_loop():
    policy = PPO(CartPole, **SMALL).policy
    config = {"max_episode_steps": 6}  # several episodes end within the run
    expected = reference_run(policy, env := CartPole(3), env.reset(config=config, seed=1), 20)
    actions, rewards, dones, steps = run(
        policy, env2 := CartPole(3), env2.reset(config=config, seed=1), 20
    )
    assert len(steps) == 20 and dones.any()
    assert torch.equal(actions, expected[0]) and torch.equal(rewards, expected[1])
    assert torch.equal(dones, expected[2])
    # each step acts on the observations the previous step returned
    assert all(torch.equal(a.out["obs"], b.obs) for a, b in zip(steps, steps[1:]))


def test_recurrent_policy_resets_its_state_where_episodes_end():
    policy = PPO(CartPole, **GRU, **SMALL).policy
    assert policy.recurrent
    config = {"max_episode_steps": 5}
    expected = reference_run(policy, env := CartPole(3), env.reset(config=config, seed=2), 17)
    actions, rewards, dones, _ = run(policy, env2 := CartPole(3), env2.reset(config=config, seed=2), 17)
    assert dones[:-1].any()  # states were reset in the middle of the run
    assert torch.equal(actions, expected[0]) and torch.equal(rewards, expected[1])
    # without the resets the actions differ: the test sees them
    policy.reset_state()
    env3 = CartPole(3)
    obs, unreset = env3.reset(config=config, seed=2), []
    for _ in range(17):
        unreset.append(policy(obs))
        obs = env3.step(unreset[-1])["obs"]
    policy.reset_state()
    assert not torch.equal(torch.stack(unreset), expected[0])


def test_sampled_actions_come_from_the_generator():
    policy = PPO(Pendulum, **SMALL).policy

    def sampled(seed):
        env = Pendulum(2)
        generator = torch.Generator().manual_seed(seed)
        return run(policy, env, env.reset(seed=0), 5, deterministic=False, generator=generator)[0]

    torch.manual_seed(0)
    first = sampled(7)
    torch.manual_seed(1)  # the global stream does not matter
    assert torch.equal(first, sampled(7))
    assert not torch.equal(first, sampled(8))
    env = Pendulum(2)
    assert not torch.equal(first, run(policy, env, env.reset(seed=0), 5)[0])  # modes differ


def test_plain_callable_policy_and_early_stop():
    calls = []

    class Pusher:
        """A policy that pushes right and records its reset_state calls."""

        def __call__(self, obs, deterministic=True):
            assert deterministic is False
            return torch.ones(obs.shape[0], dtype=torch.int64)

        def reset_state(self, mask=None):
            calls.append(None if mask is None else mask.tolist())

    env = CartPole(2)
    steps = run_policy(
        Pusher(), env, env.reset(config={"max_episode_steps": 3}, seed=0), deterministic=False
    )
    for t, step in enumerate(steps, start=1):  # no num_steps: until the caller stops
        assert step.actions.tolist() == [1, 1]
        if t == 5:
            break
    steps.close()
    # all at the start, both envs after their third step ended it, all at the end
    assert calls == [None, [True, True], None]


def test_envs_without_episodes_have_no_done_flags():
    from rl8.envs import DiscreteDummyEnv

    policy = PPO(DiscreteDummyEnv, **SMALL).policy
    env = DiscreteDummyEnv(2)
    steps = list(run_policy(policy, env, env.reset(), num_steps=3))
    assert len(steps) == 3 and all(s.done is None for s in steps)
    assert done_flags(steps[0].out) is None


def test_ppo_evaluate_runs_what_the_runner_runs():
    """PPO.evaluate's loop, as the runner runs it (its eval generator, its recurrent state)."""
    algo = PPO(Pendulum, **GRU, **SMALL)
    generator = torch.Generator().set_state(algo.eval_generator.get_state())
    torch.manual_seed(3)
    env = Pendulum(3)
    rewards = run(algo.policy, env, env.reset(), 8, deterministic=False, generator=generator)[1]
    torch.manual_seed(3)
    stats = algo.evaluate(Pendulum(3), num_steps=8, deterministic=False)
    assert float(stats["rollout/reward_sum_mean"]) == pytest.approx(
        float(rewards.sum(0).mean()), rel=1e-5
    )
