"""``rl8 eval``: run a saved policy (a policy file, a checkpoint or an MLflow run) and print its
episode returns."""

from __future__ import annotations

import argparse
import math
from typing import Any

from rl8.cli.common import policy_and_env
from rl8.training.config_file import ConfigError

__all__ = ["run"]


def run(args: argparse.Namespace) -> int:
    """``rl8 eval``: run the policy of ``args`` (the parsed command line) and print its episode
    returns; the exit status."""
    import torch

    from rl8.ppo.algorithm import make_env

    num_envs = args.num_envs or args.episodes
    policy, env, spec, config = policy_and_env(
        args,
        lambda spec, env_kwargs: make_env(spec, num_envs, None, device="cpu", env_kwargs=env_kwargs),
        num_envs,
    )
    try:
        obs = env.reset(config=config or None, seed=args.seed)
    except (ValueError, TypeError, KeyError) as exc:
        env.close()
        raise ConfigError(f"cannot evaluate in env {spec!r}: {exc}") from None
    deterministic = not args.stochastic
    if args.seed is not None:
        torch.manual_seed(args.seed)
    try:
        if env.episodic:
            _eval_episodes(policy, env, obs, args.episodes, args.max_steps or 100_000, deterministic)
        else:
            _eval_steps(policy, env, obs, args.max_steps or 1000, deterministic)
    finally:
        env.close()
    return 0


def _eval_episodes(
    policy: Any, env: Any, obs: Any, episodes: int, max_steps: int, deterministic: bool
) -> None:
    import torch

    from rl8.policies.runner import run_policy

    n = env.num_envs
    quota = math.ceil(episodes / n)  # episodes per env: no env's short episodes dominate
    ep_return = torch.zeros(n, dtype=torch.float64)
    ep_length = torch.zeros(n, dtype=torch.int64)
    done_per_env = [0] * n
    results: list[tuple[int, int, float, int]] = []  # (k-th episode of env, env, return, length)
    for step in run_policy(policy, env, obs, num_steps=max_steps, deterministic=deterministic):
        ep_return += step.rewards.double().cpu()
        ep_length += 1
        for i in step.done.nonzero()[:, 0].tolist():  # an episodic env's steps always say which ended
            if done_per_env[i] < quota:
                results.append((done_per_env[i], i, float(ep_return[i]), int(ep_length[i])))
            done_per_env[i] += 1
            ep_return[i] = 0.0
            ep_length[i] = 0
        if len(results) >= episodes:
            break
    results = sorted(results)[:episodes]
    returns = [r for _, _, r, _ in results]
    for k, (_, env_index, ret, length) in enumerate(results, start=1):
        print(f"episode {k}: return {ret:.6g}, length {length} (env {env_index})")
    if not returns:
        print(f"no episode ended within {max_steps} steps (raise --max-steps)")
        return
    mean = sum(returns) / len(returns)
    std = (sum((r - mean) ** 2 for r in returns) / len(returns)) ** 0.5
    note = f" (stopped at --max-steps {max_steps})" if len(returns) < episodes else ""
    print(f"mean return over {len(returns)} episodes: {mean:.6g} (std {std:.3g}){note}")


def _eval_steps(policy: Any, env: Any, obs: Any, steps: int, deterministic: bool) -> None:
    import torch

    from rl8.policies.runner import run_policy

    total = torch.zeros(env.num_envs, dtype=torch.float64)
    for step in run_policy(policy, env, obs, num_steps=steps, deterministic=deterministic):
        total += step.rewards.double().cpu()
    print(f"{type(env).__name__} does not end episodes: returns over {steps} steps per env")
    for i, ret in enumerate(total.tolist()):
        print(f"env {i}: return {ret:.6g}")
    print(f"mean return over {env.num_envs} envs: {float(total.mean()):.6g}")
