"""What the ``rl8`` commands share: names given on the command line (imported from the working
folder), the env a checkpoint or policy file names, a saved policy with its env."""

from __future__ import annotations

import argparse
import contextlib
from collections.abc import Iterator, Mapping
from typing import Any

from rl8.training.config_file import ConfigError, assign, parse_assignment

__all__ = [
    "canonical_env",
    "config_errors",
    "import_given",
    "policy_and_env",
    "same_env",
    "stored_env_kwargs",
    "unregistered",
]


@contextlib.contextmanager
def config_errors(
    prefix: str = "", errors: tuple[type[Exception], ...] = (ValueError,)
) -> Iterator[None]:
    """Raise the block's ``errors`` (exception types) as a one-line :class:`ConfigError`: ``prefix``,
    then their message (a ``KeyError``'s unquoted, ``Trainer.run``'s without its name)."""
    try:
        yield
    except errors as exc:
        message = str(exc.args[0]) if isinstance(exc, KeyError) and exc.args else str(exc)
        raise ConfigError(prefix + message.replace("Trainer.run: ", "")) from None


def import_given(name: Any, field: str) -> None:
    """Import a dotted path given on the command line or in a config file (never one read from
    a file) with the working folder on ``sys.path`` (``--env myenv.Reach`` beside ``myenv.py``);
    gymnasium ids and registered names are left alone. ``field`` names it in errors."""
    from rl8 import registry
    from rl8.ppo.resolve import import_user_path, is_dotted_path

    if is_dotted_path(name) and registry.lookup(name) is None:
        import_user_path(name, field=field, search_working_dir=True)


def unregistered(stored: str, trust_code: bool) -> bool:
    """Whether a file's env name is a dotted path that this process's registry lacks (and that
    ``--trust-code`` does not import)."""
    from rl8 import registry
    from rl8.ppo.resolve import is_dotted_path

    return is_dotted_path(stored) and not trust_code and registry.lookup(stored) is None


def same_env(given: str, stored: str, *, source: Any, trust_code: bool) -> bool:
    """Whether ``--env`` names the env a file stores: the same class, or one of the same name when
    the stored class is not registered here (a script's ``__main__.Reach``)."""
    if given == stored:
        return True
    if unregistered(stored, trust_code):
        return given.rpartition(".")[2] == stored.rpartition(".")[2]
    return canonical_env(given) == canonical_env(stored, source=source, trust_code=trust_code)


def canonical_env(spec: str, *, source: Any = None, trust_code: bool = False) -> str:
    """One name for a class (``rl8.envs.CartPole`` for ``rl8.envs.cartpole.CartPole``); a spec
    read from a file (``source``) is checked for its kind first."""
    from rl8.io.checkpoint import CheckpointError
    from rl8.ppo.resolve import env_spec_string, env_target

    try:
        return env_spec_string(env_target(spec, source=source, trust_code=trust_code).target) or spec
    except CheckpointError:
        raise
    except (ValueError, ImportError):
        return spec


def policy_and_env(
    args: argparse.Namespace, make: Any, num_envs: int = 1
) -> tuple[Any, Any, str, dict[str, Any]]:
    """The saved policy named on the command line, the env of ``num_envs`` envs that
    ``make(spec, env_kwargs)`` builds for it (spaces checked, an env with only the observation
    groups the actor reads accepted too; refused before it is built when one
    step of its envs could not fit in memory), the env spec used and the env config (stored, then
    ``--env-config``)."""
    import gymnasium
    import torch

    from rl8.envs.spaces import space_dtype, space_shape
    from rl8.io.checkpoint import CheckpointError
    from rl8.io.export import check_env_spaces, policy_from_dict, read_policy
    from rl8.policies.policy import check_memory
    from rl8.ppo.buffer import slot_bytes
    from rl8.ppo.resolve import spec_from_env_info

    # first: a module of yours may also define the policy's model class
    with config_errors(
        f"cannot import {args.env if args.env else args.model_cls!r}: ", (ImportError, ValueError)
    ):
        import_given(args.env, "--env")
        import_given(args.model_cls, "--model-cls")
    info = read_policy(args.policy, tracking_uri=args.tracking_uri)
    policy = policy_from_dict(
        info,
        map_location="cpu",
        source=args.policy,
        trust_code=args.trust_code,
        model_cls=args.model_cls,
    )
    env_info = info.get("env") or {}
    if not isinstance(env_info, Mapping):
        raise CheckpointError(
            f"{args.policy}: the stored env must be a dict, got {type(env_info).__name__}"
        )
    spec = args.env or spec_from_env_info(env_info, source=args.policy, trust_code=args.trust_code)
    if not spec:
        raise ConfigError("the policy does not name its env; pass --env (e.g. --env rl8.envs.CartPole)")
    config = dict(env_info.get("env_config") or {})
    for text in args.env_config or []:
        path, value = parse_assignment(text, "--env-config")
        assign(config, path, value)
    env_kwargs = stored_env_kwargs(args, env_info)
    space = policy.action_space
    step = slot_bytes(policy.observation_space, space_shape(space), space_dtype(space), False)
    try:
        check_memory(
            f"{num_envs} envs (--num-envs)", num_envs * step, torch.device("cpu"), "Use fewer envs"
        )
        env = make(spec, env_kwargs)
    except (ValueError, TypeError, KeyError, ImportError, gymnasium.error.Error) as exc:
        raise ConfigError(f"cannot build env {spec!r}: {exc}") from None
    try:
        check_env_spaces(
            env,
            policy.observation_space,
            policy.action_space,
            what=f"the env {args.env or env_info.get('spec')!r}",
            source=args.policy,
            actor_space=policy.actor_observation_space,
        )
    except ValueError as exc:
        env.close()
        raise ConfigError(str(exc)) from None
    return policy, env, spec, config


def stored_env_kwargs(args: argparse.Namespace, env_info: Mapping[str, Any]) -> Any:
    """The stored env's arguments (the names inside checked) when the env used is the stored one,
    else ``None``: they belong to that env."""
    from rl8.ppo.resolve import check_stored_env_kwargs, env_target

    if not args.env:
        return env_info.get("env_kwargs")
    stored = env_info.get("spec")
    if not stored or not same_env(args.env, stored, source=args.policy, trust_code=args.trust_code):
        return None
    check_stored_env_kwargs(
        env_target(args.env).target,
        env_info.get("env_kwargs"),
        source=args.policy,
        trust_code=args.trust_code,
    )
    return env_info.get("env_kwargs")
