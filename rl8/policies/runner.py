"""The one episode runner: :func:`run_policy`, a policy acting in a batched env step after
step, as ``rl8 eval``, :func:`rl8.training.video.record_video` and :meth:`rl8.PPO.evaluate`
run it; the caller keeps what it needs from each step and stops when it has enough."""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import torch
from tensordict import TensorDictBase

from rl8.envs.base import Env
from rl8.policies.policy import Policy

__all__ = ["PolicyStep", "done_flags", "run_policy"]

Observations = torch.Tensor | TensorDictBase


@dataclass(frozen=True)
class PolicyStep:
    """One env step of :func:`run_policy`.

    Attributes:
        obs: The observations ``[N, ...]`` the policy acted on (on the policy's device).
        actions: The env actions ``[N, ...]`` taken (on the env's device).
        out: The env's :meth:`~rl8.Env.step` output (``obs``, ``rewards``, ``terminated``...).
        rewards: ``[N]`` rewards of this step (``out["rewards"][:, 0]``).
        done: ``[N]`` bool, True where the step ended an episode (``terminated`` or
            ``truncated``); ``None`` for envs that never end episodes.
    """

    obs: Observations
    actions: torch.Tensor | TensorDictBase
    out: TensorDictBase
    rewards: torch.Tensor
    done: torch.Tensor | None


def done_flags(out: TensorDictBase) -> torch.Tensor | None:
    """``[N]`` bool, ``terminated | truncated`` of an env's step output ``out`` (``None``: neither)."""
    done = None
    for key in ("terminated", "truncated"):
        flag = out.get(key, None)
        if flag is not None:
            done = flag[:, 0] if done is None else done | flag[:, 0]
    return done


def run_policy(
    policy: Policy | Callable[..., Any],
    env: Env,
    obs: Observations,
    *,
    num_steps: int | None = None,
    deterministic: bool = True,
    generator: torch.Generator | None = None,
) -> Iterator[PolicyStep]:
    """Run ``policy`` in ``env`` from the observations ``obs`` and yield a :class:`PolicyStep`
    per env step, without autograd; a recurrent state starts fresh and is reset for each env
    whose episode ended (``docs/videos.md``).

    Args:
        policy: A :class:`rl8.Policy` (its state between calls is not touched), or any
            callable ``policy(obs, deterministic=bool) -> env actions``, whose
            ``reset_state(mask=None)``, if any, is called before, during and after the run.
        env: The batched env, already reset.
        obs: Its observations ``[N, ...]`` from that reset.
        num_steps: Env steps at most (per env); ``None``: until the caller stops iterating.
        deterministic: Act with the distributions' modes (``False``: sample actions).
        generator: Random generator of an :class:`rl8.Policy`'s sampling (``None``: global).
    """
    if isinstance(policy, Policy):  # its recurrent state is kept here, the policy's own left alone
        device, reset_state, state = policy.device, None, policy.initial_state(env.num_envs)

        def act(obs: Observations, firsts: torch.Tensor) -> torch.Tensor:
            nonlocal state
            dist, state = policy.actor_step(obs, state, firsts)  # the actor's groups suffice
            return policy.to_env_action(
                dist.deterministic_sample() if deterministic else dist.sample(generator)
            )
    else:
        device, reset_state = getattr(policy, "device", None), getattr(policy, "reset_state", None)

        def act(obs: Observations, firsts: torch.Tensor) -> Any:
            if reset_state is not None and bool(firsts.any()):
                reset_state(firsts)
            return policy(obs, deterministic=deterministic)

    if reset_state is not None:
        reset_state()
    firsts = torch.zeros(env.num_envs, dtype=torch.bool, device=device)
    try:
        for _ in itertools.count() if num_steps is None else range(num_steps):
            if device is not None and obs.device != torch.device(device):
                obs = obs.to(device)
            with torch.no_grad():
                actions = act(obs, firsts)
                if isinstance(actions, (torch.Tensor, TensorDictBase)) and actions.device != env.device:
                    actions = actions.to(env.device)
                out = env.step(actions)
            done = done_flags(out)
            yield PolicyStep(obs, actions, out, out["rewards"][:, 0], done)
            if done is not None:
                firsts = done if device is None else done.to(device)
            obs = out["obs"]
    finally:
        if reset_state is not None:
            reset_state()  # the run's state must not leak into later calls
