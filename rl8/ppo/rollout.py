"""The rollout loops, functions of the objects they fill (a collection mode runs them on its own
copies), and the training env: how it is built, its hyper-parameters, its checkpoint state."""

from __future__ import annotations

import contextlib
import inspect
from collections.abc import Callable, Mapping
from typing import Any

import torch
from tensordict import TensorDict, TensorDictBase

from rl8.envs.base import Env, ReadyEnvs, validate_step_output
from rl8.envs.gymnasium import GymnasiumEnv, GymnasiumEnvFactory
from rl8.envs.rsl_rl import RslRlEnv, is_rsl_rl_env
from rl8.envs.tasks import is_task_spec, make_task_env
from rl8.envs.torch_vector import TorchVectorEnv
from rl8.policies.policy import Policy
from rl8.ppo.buffer import RolloutBuffer, RolloutCarry
from rl8.ppo.distributed import current_roles
from rl8.ppo.hparams import HParams
from rl8.ppo.resolve import (
    check_not_made_gymnasium_env,
    describe,
    env_target,
    is_built_env,
    is_dotted_path,
)

__all__ = [
    "env_hparams",
    "env_state",
    "given_env",
    "load_env_state",
    "make_env",
    "rank_hparams",
    "rollout",
    "rollout_ready_envs",
    "second_instance_problem",
]


@torch.no_grad()
def rollout(
    policy: Policy,
    env: Env,
    buffer: RolloutBuffer,
    carry: RolloutCarry,
    obs: torch.Tensor | TensorDictBase,
    *,
    generator: torch.Generator,
    deterministic: bool = False,
    autocast: contextlib.AbstractContextManager | None = None,
    check_first_step: bool = False,
    rollout_step: Callable[..., Any] | None = None,
) -> torch.Tensor | TensorDictBase:
    """Step ``env`` ``buffer.horizon`` times from ``obs``, filling ``buffer``; returns the
    observations after the last step.

    Args:
        policy: Acts through :meth:`Policy.rollout_step <rl8.Policy.rollout_step>`.
        env: The batched env, ``buffer.num_envs`` copies.
        buffer: Filled in place; column ``horizon``: the last observation and its value.
        carry: The policy's carry from step to step (:class:`~rl8.ppo.buffer.RolloutCarry`).
        obs: The envs' current observations (after a reset or the previous rollout).
        generator: Draws the sampled actions.
        deterministic: Take the distributions' modes instead of sampling.
        autocast: Mixed-precision context of the policy's forward passes (``None``: none).
        check_first_step: Validate the first step's output against the step contract.
        rollout_step: Called instead of ``policy.rollout_step`` with the same arguments (the
            compiled step of ``compile=True``); ``None``: the policy's.
    """
    to_env_action, space, columns = (
        policy.distribution_cls.to_env_action,
        env.action_space,
        buffer.columns,
    )
    rollout_step = rollout_step or policy.rollout_step
    kept: dict[str, list[torch.Tensor]] = {key: [] for key in buffer.stacked}  # stacked once at the end
    with autocast or contextlib.nullcontext(), policy.rollout():
        for t in range(buffer.horizon):
            if "obs" in kept:
                kept["obs"].append(obs)
            else:
                columns["obs"][t].copy_(obs)
            dist, value, policy_carry = rollout_step(obs, *carry.before_step(t))
            # written into the buffer rows (the env gets row t: it must not keep it)
            actions, _ = dist.sample_with_log_prob(
                generator, deterministic=deterministic, out=(columns["actions"][t], columns["logp"][t])
            )
            out = env.step(to_env_action(actions, space))
            if check_first_step and t == 0:
                validate_step_output(out, env)
            if env.episodic:  # the flags the output has, and final_obs with the truncated flag
                for key in ("terminated", "truncated"):
                    if key in out.keys():
                        columns[key][t].copy_(out[key])
                if "truncated" in out.keys():
                    columns["final_obs"][t].copy_(out["final_obs"])
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
    policy: Policy,
    env: ReadyEnvs,
    buffer: RolloutBuffer,
    carry: RolloutCarry,
    obs: torch.Tensor | TensorDictBase,
    *,
    generator: torch.Generator,
    deterministic: bool = False,
    autocast: contextlib.AbstractContextManager | None = None,
    check_first_step: bool = False,
    rollout_step: Callable[..., Any] | None = None,
) -> torch.Tensor | TensorDictBase:
    """:func:`rollout` for an env whose sub-envs step at their own pace
    (:class:`~rl8.envs.base.ReadyEnvs`, none stepping): the envs that are ready are acted on
    with ONE batched forward pass while the others step, each row filled at its env's own step
    index, until every env has made ``horizon`` steps. The arguments are :func:`rollout`'s.
    """
    to_env_action, space, data = policy.distribution_cls.to_env_action, env.action_space, buffer.data
    rollout_step = rollout_step or policy.rollout_step
    n, horizon = buffer.num_envs, buffer.horizon
    device = data.device
    steps = torch.zeros(
        n, dtype=torch.long, device=device
    )  # each env's own step index; < horizon: stepping
    carries: TensorDictBase | None = None  # each env's carry after its step in flight
    stepping = 0  # envs with a step in flight (a count on the host: no device sync per loop)

    def act(env_ids: torch.Tensor, t: torch.Tensor, env_obs: torch.Tensor | TensorDictBase) -> None:
        nonlocal carries, stepping
        dist, value, policy_carry = rollout_step(env_obs, *carry.before_steps(env_ids, t))
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
        obs = obs.to(device)
        data["obs"][:, 0] = obs
        act(torch.arange(n, device=device), steps.clone(), obs)
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
            data["obs"][env_ids, t] = out[
                "obs"
            ]  # at column horizon: the last obs of the envs that are done
            going = t < horizon
            if bool(going.any()):
                act(env_ids[going], t[going], out["obs"][going])
        # column horizon: every env's last obs and its (bootstrap) value
        last_obs = data["obs"][:, horizon]
        data["values"][:, horizon] = policy.rollout_value(last_obs, *carry.last())
    return last_obs.clone()


def make_env(
    env: type[Env] | str | Callable[..., Any] | Any,
    num_envs: int,
    horizon: int | None,
    *,
    device: torch.device | str,
    env_kwargs: dict[str, Any] | None = None,
    seed: int | None = None,
) -> Env:
    """Build a batched env.

    Args:
        env: An :class:`Env` subclass (or a dotted path to one), a gymnasium id, a named task
            (``"mjlab:<task id>"``, :mod:`rl8.envs.tasks`), a built env or a factory of one
            (:func:`given_env`: then ``num_envs``, ``horizon`` and ``device`` are the env's), a
            callable returning a ``gymnasium.Env``, or a ``GymnasiumEnv.make_factory`` factory.
        num_envs: Number of parallel envs.
        horizon: PPO's horizon, handed to the env.
        device: Device of the env's tensors.
        env_kwargs: Extra keyword arguments of the env's constructor (of
            :class:`rl8.envs.GymnasiumEnv` for gymnasium envs, of the maker for a named task).
        seed: The seed of the env's simulation (PPO's :attr:`~rl8.PPO.env_seed`, the rank's),
            for a named task's maker (unless ``env_kwargs`` has one) and a factory that takes
            ``seed`` (:func:`given_env`); ``None``: theirs. Other envs are seeded at their
            first reset.
    """
    kwargs = dict(env_kwargs or {})
    if is_task_spec(env):
        if kwargs.get("seed") is None:
            kwargs["seed"] = seed
        return make_task_env(env, num_envs, horizon, device=device, **kwargs)
    built = given_env(env, kwargs, device=device, seed=seed)
    if built is not None:
        return built
    check_not_made_gymnasium_env(env, num_envs)
    target, gymnasium = env_target(env)
    if not gymnasium or isinstance(target, GymnasiumEnvFactory):
        return target(num_envs, horizon, device=device, **kwargs)
    return GymnasiumEnv(num_envs, horizon, device=device, env=target, **kwargs)


def given_env(
    env: Any,
    env_kwargs: Mapping[str, Any] | None = None,
    *,
    device: torch.device | str | None = None,
    seed: int | None = None,
) -> Env | None:
    """The rl8 env of an env given built, or made by a factory; ``None`` for a spec that rl8
    builds. A callable (not a class) is called once when ``env_kwargs`` is empty, with the
    keyword arguments ``device`` and ``seed`` among those its signature names (given here, not
    ``None``), else with none: a gymnasium env it returns is closed (the callable is then a
    gymnasium maker).

    Args:
        env: An :class:`Env`, an rsl_rl ``VecEnv`` (wrapped in :class:`~rl8.envs.rsl_rl.RslRlEnv`),
            a torch-batched gymnasium vector env (:class:`~rl8.envs.torch_vector.TorchVectorEnv`),
            a callable returning one of them, or any other env spec (``None`` is returned).
        env_kwargs: PPO's ``env_kwargs``; given, a callable is a gymnasium maker.
        device: The device a factory builds the env on (PPO's: the rank's under torchrun).
        seed: The seed a factory seeds the env's simulation with (PPO's ``env_seed``: the rank's).
    """
    if is_dotted_path(env):
        env = env_target(env).target
    if isinstance(env, (str, type, GymnasiumEnvFactory)):
        return None
    if callable(env) and not is_built_env(env) and not env_kwargs:
        env = env(**_factory_kwargs(env, {"device": device, "seed": seed}))
        if not is_built_env(env) and callable(getattr(env, "close", None)):
            env.close()
    if not is_built_env(env):
        return None
    if isinstance(env, Env):
        return env
    if is_rsl_rl_env(env):
        return RslRlEnv(env)
    check_not_made_gymnasium_env(env, env.num_envs)
    return TorchVectorEnv(env)


def _factory_kwargs(factory: Callable[..., Any], offered: dict[str, Any]) -> dict[str, Any]:
    """The ``offered`` keyword arguments (those not ``None``) that ``factory`` names as
    parameters (a ``**kwargs`` is not enough: ``functools.partial(gymnasium.make, id)`` has one)."""
    try:
        parameters = inspect.signature(factory).parameters.values()
    except (TypeError, ValueError):  # a builtin without a signature: called with none
        return {}
    named = {p.name for p in parameters if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)}
    return {k: v for k, v in offered.items() if v is not None and k in named}


def env_hparams(env: Env, given: Mapping[str, Any]) -> dict[str, Any]:
    """``num_envs`` and ``device`` of the built ``env`` as hyper-parameters; a ``ValueError``
    when one of the ``given`` hyper-parameters says otherwise (``device="auto"`` agrees)."""
    for name, own in (("num_envs", env.num_envs), ("device", env.device)):
        value = given.get(name)
        if value is None or value == "auto":
            continue
        if name == "device":
            value = torch.device(value)
            agrees = value.type == own.type and (
                None in (value.index, own.index) or value.index == own.index
            )
        else:
            agrees = value == own
        if not agrees:
            raise ValueError(
                f"hparam {name}: the env {type(env).__name__} was built with {name}={own}, but {name}={value} "
                f"was given; leave {name} out (it is taken from the env) or give the env's"
            )
    return {"num_envs": env.num_envs, "device": str(env.device)}


def second_instance_problem(env: Env, spec: Any) -> str | None:
    """Why rl8 cannot build a second instance of the training ``env`` (for evaluations or
    videos) from ``spec`` (what it was built from, ``PPO(spec)``), or ``None`` when it can."""
    if env.single_instance:
        return (
            f"{type(env).__name__}.single_instance is True (its simulator runs once per process, "
            "as Isaac Lab's does)"
        )
    if is_built_env(spec):
        return f"the env was given built ({describe(spec)}), so rl8 cannot build another"
    return None


def rank_hparams(hp: HParams) -> HParams:
    """The run's hyper-parameters ``hp`` as this rank uses them: an actor steps its share of
    ``num_envs`` and never updates."""
    roles = current_roles()
    if roles is None or not roles.is_actor:
        return hp
    share = roles.actors_per_learner
    if hp.num_envs % share:
        raise ValueError(
            f"hparam num_envs: with {roles.actors} actors and {roles.learners} learners each learner "
            f"combines {share} actors' rollouts, so num_envs (the envs of one learner's batch) must "
            f"be a multiple of {share}, got {hp.num_envs}"
        )
    return hp.replace(num_envs=hp.num_envs // share, sgd_minibatch_size=None, num_minibatches=None)


def env_state(env: Env, obs: torch.Tensor | TensorDictBase | None) -> dict[str, Any]:
    """The checkpoint's ``obs`` and ``env`` (the env's ``state_dict``), or ``None``s."""
    env_state = env.state_dict() if obs is not None else None
    if env_state is None:
        return {"obs": None, "env": None}
    return {
        "obs": {"tensordict": obs.to_dict()} if isinstance(obs, TensorDictBase) else {"tensor": obs},
        "env": env_state,
    }


def load_env_state(
    env: Env, state: dict[str, Any], device: torch.device
) -> torch.Tensor | TensorDictBase | None:
    """Restore :func:`env_state` into ``env``; returns the observations to go on from, or None."""
    obs, env_state = state.get("obs"), state.get("env")
    # an env that saves no state (GymnasiumEnv) is reset, whatever the file holds
    if obs is None or env_state is None or env.state_dict() is None:
        return None
    env.load_state_dict(env_state)
    if "tensordict" in obs:
        return TensorDict(obs["tensordict"], batch_size=[env.num_envs]).to(device)
    return obs["tensor"].to(device)
