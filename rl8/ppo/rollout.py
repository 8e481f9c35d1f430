"""The rollout loop: step batched envs with a policy and fill a rollout buffer.

:func:`rollout` is the body of :meth:`rl8.PPO.collect`, as a function of the objects it works on
(policy, env, buffer, carry, generator) so that a collection mode can run it on its own copies
(for example in a background thread, with a copy of the policy).

:func:`rollout_ready_envs` fills the same buffer from an env whose sub-envs step at their own
pace (:class:`rl8.envs.base.ReadyEnvs`, e.g. the worker pool :class:`rl8.envs.PoolEnv`): it acts on
whichever envs are ready, so rows of the buffer fill at different speeds.
"""

from __future__ import annotations

import contextlib

import torch
from tensordict import TensorDictBase

from rl8.envs.base import Env, ReadyEnvs, validate_step_output
from rl8.policies.policy import Policy
from rl8.ppo.buffer import RolloutBuffer, RolloutCarry

__all__ = ["rollout", "rollout_ready_envs"]


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
        carry: The policy's carry from step to step (:class:`~rl8.ppo.buffer.RolloutCarry`).
        obs: The envs' current observations (after a reset or the previous rollout).
        generator: Draws the sampled actions.
        deterministic: Take the distributions' modes instead of sampling.
        autocast: Mixed-precision context of the policy's forward passes (``None``: none).
        check_first_step: Validate the first step's output against the step contract
            (:func:`rl8.envs.base.validate_step_output`).

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


@torch.no_grad()
def rollout_ready_envs(
    policy: Policy, env: ReadyEnvs, buffer: RolloutBuffer, carry: RolloutCarry,
    obs: torch.Tensor | TensorDictBase, *, generator: torch.Generator, deterministic: bool = False,
    autocast: contextlib.AbstractContextManager | None = None, check_first_step: bool = False,
) -> torch.Tensor | TensorDictBase:
    """Fill every row of ``buffer`` with ``buffer.horizon`` steps of its env, acting on the
    envs as they get ready.

    Every env starts the collect with an action for ``obs``. Then, until every env has made
    ``horizon`` steps: take the step outputs of the ready envs (``env.recv`` with the env's
    ``min_batch_size``, ``max_batch_size`` and ``max_wait_s``), write each into its env's row
    at that env's own step index, and act on those envs that still have steps to make with
    ONE batched forward pass, while the other envs keep stepping. An env that has made its
    ``horizon`` steps is not stepped again in this collect: its last observation is column
    ``horizon`` (valued at the end with every other env's), and the next collect starts by
    sending its action. Each row therefore holds its env's own consecutive transitions, as
    :func:`rollout` gives them, so GAE, the bootstrapping of truncated episodes and the
    recurrent states (through the carry's per-env forms,
    :meth:`~rl8.ppo.buffer.RolloutCarry.before_steps`) work unchanged.

    Args:
        policy: Acts through :meth:`Policy.rollout_step <rl8.Policy.rollout_step>`.
        env: A batched env with the :class:`~rl8.envs.base.ReadyEnvs` interface, ``buffer.num_envs``
            sub-envs, none of them stepping.
        buffer: Filled in place, as by :func:`rollout`.
        carry: The policy's carry from step to step (:class:`~rl8.ppo.buffer.RolloutCarry`).
        obs: The envs' current observations (after a reset or the previous rollout).
        generator: Draws the sampled actions.
        deterministic: Take the distributions' modes instead of sampling.
        autocast: Mixed-precision context of the policy's forward passes (``None``: none).
        check_first_step: Validate the first step output received against the step contract.

    Returns:
        The observations after each env's last step (column ``horizon``).
    """
    to_env_action, space, data = policy.distribution_cls.to_env_action, env.action_space, buffer.data
    n, horizon = buffer.num_envs, buffer.horizon
    device = data.device
    steps = torch.zeros(n, dtype=torch.long, device=device)  # each env's own step index
    carries: TensorDictBase | None = None  # each env's carry after its step in flight
    stepping = 0  # envs with an action sent and no output received yet

    def act(env_ids: torch.Tensor, t: torch.Tensor, env_obs: torch.Tensor | TensorDictBase) -> None:
        """Sample the actions of envs ``env_ids`` at their steps ``t`` and send them."""
        nonlocal carries, stepping
        data["obs"][env_ids, t] = env_obs
        dist, value, policy_carry = policy.rollout_step(env_obs, *carry.before_steps(env_ids, t))
        actions, logp = dist.sample_with_log_prob(generator, deterministic=deterministic)
        data["actions"][env_ids, t] = actions
        data["logp"][env_ids, t] = logp
        data["values"][env_ids, t] = value.to(data["values"].dtype)
        if policy_carry is not None:
            if carries is None:
                carries = policy_carry[:1].expand(n).clone()
            carries[env_ids] = policy_carry
        env.send(env_ids, to_env_action(actions, space))
        stepping += env_ids.numel()

    with autocast or contextlib.nullcontext(), policy.rollout():
        act(torch.arange(n, device=device), steps.clone(), obs.to(device))
        while stepping:
            env_ids, out = env.recv(env.min_batch_size, env.max_batch_size, env.max_wait_s)
            stepping -= env_ids.numel()
            if check_first_step:
                validate_step_output(out, env, batch_size=env_ids.numel())
                check_first_step = False
            env_ids, out = env_ids.to(device), out.to(device)
            t = steps[env_ids]
            data["rewards"][env_ids, t] = out["rewards"][:, 0]
            if env.episodic:
                for key in ("terminated", "truncated"):
                    if key in out.keys():
                        data[key][env_ids, t] = out[key][:, 0]
                if "truncated" in out.keys():
                    data["final_obs"][env_ids, t] = out["final_obs"]
            carry.after_steps(env_ids, t, None if carries is None else carries[env_ids])
            t = t + 1
            steps[env_ids] = t
            going = t < horizon
            done = ~going
            if bool(done.any()):  # column horizon: the last obs of the envs that are done
                data["obs"][env_ids[done], t[done]] = out["obs"][done]
            if bool(going.any()):
                act(env_ids[going], t[going], out["obs"][going])
        # column horizon: every env's last obs and its (bootstrap) value
        last_obs = data["obs"][:, horizon]
        data["values"][:, horizon] = policy.rollout_value(last_obs, *carry.last_steps())
    return last_obs.clone()
