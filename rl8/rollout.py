"""The rollout loop: step batched envs with a policy and fill a rollout buffer.

:func:`rollout` is the body of :meth:`rl8.PPO.collect`, as a function of the objects it works on
(policy, env, buffer, carry, generator) so that a collection mode can run it on its own copies
(for example in a background thread, with a copy of the policy).
"""

from __future__ import annotations

import contextlib

import torch
from tensordict import TensorDictBase

from .buffer import RolloutBuffer, RolloutCarry
from .env import Env, validate_step_output
from .policy import Policy

__all__ = ["rollout"]


@torch.no_grad()
def rollout(
    policy: Policy, env: Env, buffer: RolloutBuffer, carry: RolloutCarry,
    obs: torch.Tensor | TensorDictBase, *, generator: torch.Generator, deterministic: bool = False,
    autocast: contextlib.AbstractContextManager | None = None, check_first_step: bool = False,
) -> torch.Tensor | TensorDictBase:
    """Step ``env`` ``buffer.horizon`` times from ``obs`` and fill every column of ``buffer``.

    Args:
        policy: Acts through :meth:`Policy.rollout_step <rl8.Policy.rollout_step>`.
        env: The batched env, ``buffer.num_envs`` copies.
        buffer: Filled in place: columns ``0..horizon - 1`` of the steps, column ``horizon``
            the last observation and its (bootstrap) value.
        carry: The policy's carry from step to step (:class:`~rl8.buffer.RolloutCarry`).
        obs: The envs' current observations (after a reset or the previous rollout).
        generator: Draws the sampled actions.
        deterministic: Take the distributions' modes instead of sampling.
        autocast: Mixed-precision context of the policy's forward passes (``None``: none).
        check_first_step: Validate the first step's output against the step contract
            (:func:`rl8.env.validate_step_output`).

    Returns:
        The observations after the last step (the next rollout starts from them).
    """
    to_env_action, space, columns = policy.distribution_cls.to_env_action, env.action_space, buffer.columns
    kept: dict[str, list[torch.Tensor]] = {key: [] for key in buffer.stacked}  # stacked once at the end
    with autocast or contextlib.nullcontext(), policy.rollout():
        for t in range(buffer.horizon):
            if "obs" in kept:
                kept["obs"].append(obs)
            else:
                columns["obs"][t].copy_(obs)
            dist, value, policy_carry = policy.rollout_step(obs, *carry.before_step(t))
            # written into the buffer rows (the env gets row t: it must not keep it)
            actions, _ = dist.sample_with_log_prob(
                generator, deterministic=deterministic, out=(columns["actions"][t], columns["logp"][t])
            )
            out = env.step(to_env_action(actions, space))
            if check_first_step and t == 0:
                validate_step_output(out, env)
            if env.episodic:
                buffer.write_episode_ends(t, out)
            carry.after_step(t, policy_carry)
            kept["values"].append(value)
            kept["rewards"].append(out["rewards"])
            obs = out["obs"]
        # column horizon: the last obs and its (bootstrap) value
        kept["values"].append(policy.rollout_value(obs, *carry.last()))
        if "obs" in kept:
            kept["obs"].append(obs)
        else:
            columns["obs"][buffer.horizon].copy_(obs)
        buffer.stack(kept)
    return obs
