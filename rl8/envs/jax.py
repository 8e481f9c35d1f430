"""JAX simulators as rl8 envs: gymnax (:class:`GymnaxEnv`) and MuJoCo Playground's MJX tasks
(:class:`PlaygroundEnv`); tensors cross by DLPack (``docs/simulators_jax.md``)."""

from __future__ import annotations

import dataclasses
from abc import abstractmethod
from typing import Any

import numpy as np
import torch
from gymnasium import spaces
from tensordict import TensorDictBase

from rl8.envs.base import Env, new_tensordict

__all__ = [
    "JaxEnv",
    "GymnaxEnv",
    "PlaygroundEnv",
    "make_gymnax_env",
    "make_playground_env",
    "jax_device",
]


def jax_device(device: torch.device) -> Any:
    """The JAX device of torch ``device`` (``cpu``, or ``cuda:i`` -> GPU ``i``); ``ValueError`` if none."""
    import jax  # optional (rl8[gymnax], rl8[playground])

    platform = {"cpu": "cpu", "cuda": "gpu"}.get(device.type)
    try:
        found = jax.devices(platform) if platform else []
    except RuntimeError:
        found = []
    if (device.index or 0) >= len(found):
        raise ValueError(
            f"device: JAX has no device for torch device {str(device)!r} (JAX's devices: "
            f"{jax.devices()}); install jax[cuda12] for CUDA, or pass device='cpu'"
        )
    return found[device.index or 0]


def seed_key(seed: int) -> Any:
    """A ``jax.random.PRNGKey`` of the 64-bit int ``seed`` (both 32-bit halves kept)."""
    import jax.numpy as jnp  # optional

    if isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed < 2**64:
        raise ValueError(f"seed: expected an int in [0, 2**64), got {seed!r}")
    return jnp.array([seed >> 32, seed & 0xFFFFFFFF], dtype=jnp.uint32)


class JaxEnv(Env):
    """An episodic batched env whose reset and step are pure JAX functions of a batch of
    states, compiled once (``jax.jit``) and run on the JAX device matching :attr:`device`.
    Subclasses set the spaces (``Box`` or ``Discrete`` actions; ``Box`` or ``Dict`` of ``Box``
    observations) and implement :meth:`reset_batch` and :meth:`step_batch`.

    Args:
        num_envs: Number of environments simulated in parallel.
        horizon: Steps PPO collects per env between updates (unused), or ``None``.
        device: Torch device; JAX must have the same one (:func:`jax_device`).
    """

    episodic = True

    def __init__(
        self, num_envs: int, /, horizon: int | None = None, *, device: torch.device | str = "cpu"
    ) -> None:
        import jax  # optional

        super().__init__(num_envs, horizon, device=device)
        self.jax_device = jax_device(self.device)
        self.params: Any = None
        self.sim_state: Any = None
        self.key = jax.device_put(seed_key(int(torch.randint(0, 2**62, (1,)).item())), self.jax_device)
        self.reset_jit = jax.jit(self.batched_reset)
        self.step_jit = jax.jit(self.batched_step)

    @abstractmethod
    def reset_batch(self, keys: Any, params: Any) -> tuple[Any, Any]:
        """``(state, obs)`` of ``num_envs`` fresh episodes, a pure JAX function of ``keys``,
        ``[num_envs, 2]`` uint32 random keys, and ``params``, the env parameters (a pytree)."""

    @abstractmethod
    def step_batch(self, keys: Any, state: Any, action: Any, params: Any) -> tuple[Any, dict[str, Any]]:
        """``(state, out)``: one step of every env, finished ones reset (a pure JAX function);
        ``out`` holds the step contract's keys, ``[num_envs, ...]`` of any float/bool-like dtype.

        ``keys`` and ``params`` are :meth:`reset_batch`'s, ``state`` the batch of states and
        ``action`` ``[num_envs, *shape]`` actions, clipped to a ``Box``'s bounds.
        """

    @property
    def max_episode_steps(self) -> int | None:
        """Steps after which an episode is truncated (``None``: unknown); evaluations run this long."""
        return None

    def configure(self, config: dict[str, Any] | None) -> Any:
        """The parameters :meth:`reset` uses given its ``config`` (default: none accepted)."""
        self.apply_config(config, {})
        return self.params

    def batched_reset(self, key: Any, params: Any) -> tuple[Any, Any, Any]:
        import jax

        key, sub = jax.random.split(key)
        state, obs = self.reset_batch(jax.random.split(sub, self.num_envs), params)
        return key, state, self.cast_obs(obs)

    def batched_step(
        self, key: Any, state: Any, action: Any, params: Any
    ) -> tuple[Any, Any, dict[str, Any]]:
        """:meth:`step_batch` with keys split from ``key``, in the step contract's dtypes and shapes."""
        import jax
        import jax.numpy as jnp

        key, sub = jax.random.split(key)
        if isinstance(self.action_space, spaces.Box):
            action = jnp.clip(action, self.action_space.low, self.action_space.high)
        state, out = self.step_batch(jax.random.split(sub, self.num_envs), state, action, params)
        column = (self.num_envs, 1)
        return (
            key,
            state,
            {
                "obs": self.cast_obs(out["obs"]),
                "final_obs": self.cast_obs(out["final_obs"]),
                "rewards": jnp.reshape(out["rewards"], column).astype(jnp.float32),
                "terminated": jnp.reshape(out["terminated"], column).astype(bool),
                "truncated": jnp.reshape(out["truncated"], column).astype(bool),
            },
        )

    def cast_obs(self, obs: Any) -> Any:
        """``obs`` (an array, or a dict of arrays for a ``Dict`` space) in the space's dtypes."""
        space = self.observation_space
        if isinstance(space, spaces.Dict):
            return {name: obs[name].astype(sub.dtype) for name, sub in space.spaces.items()}
        return obs.astype(space.dtype)

    def to_torch(self, value: Any) -> torch.Tensor | TensorDictBase:
        """A JAX array (a dict of them: a TensorDict) as a torch tensor sharing its memory."""
        if isinstance(value, dict):
            tensors = {name: torch.from_dlpack(array) for name, array in value.items()}
            return new_tensordict(tensors, torch.Size([self.num_envs]), self.device)
        return torch.from_dlpack(value)

    def to_jax(self, action: torch.Tensor) -> Any:
        """A torch action batch as a JAX array: integers as int32 (a copy: JAX's default ints
        are 32-bit), floats sharing memory where XLA accepts the address (else JAX copies)."""
        import jax.numpy as jnp

        if not action.is_floating_point():
            action = action.to(torch.int32)
        return jnp.from_dlpack(action.contiguous())

    def reset(
        self, *, config: dict[str, Any] | None = None, seed: int | None = None
    ) -> torch.Tensor | TensorDictBase:
        """Reset every sub-env; ``seed``, in ``[0, 2**64)``, makes a new JAX key (``config``: see the
        subclass)."""
        import jax

        self.params = self.configure(config)
        if seed is not None:
            self.key = jax.device_put(seed_key(seed), self.jax_device)
        self.key, self.sim_state, obs = self.reset_jit(self.key, self.params)
        return self.to_torch(obs)

    def step(self, action: torch.Tensor | TensorDictBase) -> TensorDictBase:
        """Step every sub-env once with ``action`` (``[N]`` int64 or ``[N, *shape]`` float32)."""
        if self.sim_state is None:
            raise RuntimeError(f"{type(self).__name__}.step: call reset() first")
        self.key, self.sim_state, out = self.step_jit(
            self.key, self.sim_state, self.to_jax(action), self.params
        )
        return self.step_output({name: self.to_torch(value) for name, value in out.items()})

    def state_dict(self) -> dict[str, Any] | None:
        """The random key and the simulation state's arrays (copied to torch tensors)."""
        import jax

        if self.sim_state is None:
            return None
        leaves = jax.tree.leaves((self.key, self.sim_state))
        return {"leaves": [torch.from_dlpack(leaf).clone() for leaf in leaves]}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore :meth:`state_dict` into an env that was reset; a ``ValueError`` names a bad leaf."""
        import jax
        import jax.numpy as jnp

        own = self.state_dict()
        if own is None:
            raise ValueError(f"env state: reset {type(self).__name__} before loading its state")
        leaves = state.get("leaves") if isinstance(state, dict) else None
        if not isinstance(leaves, list) or len(leaves) != len(own["leaves"]):
            raise ValueError(
                f"env state: expected {{'leaves': a list of {len(own['leaves'])} tensors}}, "
                f"got {state!r:.200}"
            )
        for i, (value, expected) in enumerate(zip(leaves, own["leaves"])):
            if not isinstance(value, torch.Tensor) or (value.dtype, value.shape) != (
                expected.dtype,
                expected.shape,
            ):
                got = (
                    f"{value.dtype} {tuple(value.shape)}"
                    if isinstance(value, torch.Tensor)
                    else type(value).__name__
                )
                raise ValueError(
                    f"env state: leaf {i} must be a {expected.dtype} tensor of shape "
                    f"{tuple(expected.shape)}, got {got}"
                )
        arrays = [jax.device_put(jnp.array(t.cpu().numpy()), self.jax_device) for t in leaves]
        self.key, self.sim_state = jax.tree.unflatten(
            jax.tree.structure((self.key, self.sim_state)), arrays
        )


class GymnaxEnv(JaxEnv):
    """A gymnax environment (``gymnax.make(env_id)``), batched with ``jax.vmap``; config keys of
    :meth:`reset` are the fields of its ``EnvParams`` (``{"gravity": 12.0}``).

    ``num_envs``, ``horizon`` and ``device`` are :class:`JaxEnv`'s.

    Args:
        env_id: A gymnax env id (``gymnax.registered_envs``), e.g. ``"CartPole-v1"``.
        env_kwargs: Keyword arguments of ``gymnax.make``.
    """

    def __init__(
        self,
        num_envs: int,
        /,
        horizon: int | None = None,
        *,
        device: torch.device | str = "cpu",
        env_id: str,
        **env_kwargs: Any,
    ) -> None:
        import gymnax  # optional (rl8[gymnax])
        from gymnax.environments.spaces import gymnax_space_to_gym_space

        if env_id not in gymnax.registered_envs:
            raise ValueError(
                f"env_id: unknown gymnax env {env_id!r}; gymnax's envs: "
                f"{', '.join(gymnax.registered_envs)}"
            )
        self.env, params = gymnax.make(env_id, **env_kwargs)
        self.env_id = env_id
        self.observation_space = gymnax_space_to_gym_space(self.env.observation_space(params))
        self.action_space = gymnax_space_to_gym_space(self.env.action_space(params))
        super().__init__(num_envs, horizon, device=device)
        self.params = params

    @property
    def max_episode_steps(self) -> int | None:
        """gymnax's time limit, ``max_steps_in_episode``."""
        return int(self.params.max_steps_in_episode)

    def configure(self, config: dict[str, Any] | None) -> Any:
        """``EnvParams`` with the fields ``config`` names replaced."""
        current = {
            field.name: getattr(self.params, field.name) for field in dataclasses.fields(self.params)
        }
        return self.params.replace(**self.apply_config(config, current)) if config else self.params

    def reset_batch(self, keys: Any, params: Any) -> tuple[Any, Any]:
        import jax

        obs, state = jax.vmap(self.env.reset, in_axes=(0, None))(keys, params)
        return state, obs

    def step_batch(self, keys: Any, state: Any, action: Any, params: Any) -> tuple[Any, dict[str, Any]]:
        import jax

        obs, state, reward, terminated, truncated, info = jax.vmap(
            self.env.step, in_axes=(0, 0, 0, None)
        )(keys, state, action, params)
        return state, {
            "obs": obs,
            "final_obs": info["final_observation"],
            "rewards": reward,
            "terminated": terminated,
            "truncated": truncated,
        }


class PlaygroundEnv(JaxEnv):
    """A MuJoCo Playground task (``mujoco_playground.registry.load(env_id)``), batched with
    ``jax.vmap``. An episode ends when the task says ``done`` (``terminated``) or after
    ``episode_length`` steps (``truncated``; :meth:`reset`'s only config key); finished envs
    restart from a fresh ``reset``. Observation groups (``state``, ``privileged_state``) make a
    ``Dict`` space; actions are ``Box(-1, 1)``, clipped.

    ``num_envs``, ``horizon`` and ``device`` are :class:`JaxEnv`'s.

    Args:
        env_id: A Playground env name (``registry.ALL_ENVS``), e.g. ``"CartpoleBalance"``.
        config_overrides: Entries of the task's config to change, flattened
            (``{"impl": "jax", "episode_length": 500}``); ``impl="jax"`` runs MJX in JAX,
            Playground's default for many tasks is MuJoCo Warp.
    """

    def __init__(
        self,
        num_envs: int,
        /,
        horizon: int | None = None,
        *,
        device: torch.device | str = "cpu",
        env_id: str,
        config_overrides: dict[str, Any] | None = None,
    ) -> None:
        from mujoco_playground import registry  # optional (rl8[playground])

        if env_id not in registry.ALL_ENVS:
            raise ValueError(
                f"env_id: unknown MuJoCo Playground env {env_id!r}; its envs: "
                f"{', '.join(registry.ALL_ENVS)}"
            )
        self.config = registry.get_default_config(env_id)
        self.env = registry.load(env_id, config=self.config, config_overrides=config_overrides)
        self.env_id = env_id
        self.action_repeat = int(self.config.action_repeat)
        sizes = self.env.observation_size

        def box(size):
            return spaces.Box(
                -np.inf, np.inf, (size,) if isinstance(size, int) else tuple(size), np.float32
            )

        self.observation_space = (
            spaces.Dict({k: box(v) for k, v in sizes.items()}) if isinstance(sizes, dict) else box(sizes)
        )
        self.action_space = spaces.Box(-1.0, 1.0, (self.env.action_size,), np.float32)
        super().__init__(num_envs, horizon, device=device)
        self.params = {"episode_length": int(self.config.episode_length)}

    @property
    def max_episode_steps(self) -> int | None:
        """The episode length, ``episode_length``."""
        return self.params["episode_length"]

    def configure(self, config: dict[str, Any] | None) -> Any:
        """``{"episode_length": steps}`` updated with ``config``."""
        params = self.apply_config(config, self.params)
        if isinstance(params["episode_length"], bool) or not isinstance(params["episode_length"], int):
            raise ValueError(f"config episode_length: expected an int, got {params['episode_length']!r}")
        return params

    def reset_batch(self, keys: Any, params: Any) -> tuple[Any, Any]:
        import jax
        import jax.numpy as jnp

        state = jax.vmap(self.env.reset)(keys)
        return (state, jnp.zeros(self.num_envs, jnp.int32)), state.obs

    def step_batch(self, keys: Any, state: Any, action: Any, params: Any) -> tuple[Any, dict[str, Any]]:
        import jax
        import jax.numpy as jnp

        sim, steps = state
        reward = 0.0
        for _ in range(self.action_repeat):
            sim = jax.vmap(self.env.step)(sim, action)
            reward = reward + sim.reward
        steps = steps + self.action_repeat
        terminated, truncated = sim.done > 0, steps >= params["episode_length"]
        done = terminated | truncated

        def restart(stepped: Any) -> Any:
            fresh = jax.vmap(self.env.reset)(keys)

            def pick(new, old):
                return jnp.where(jnp.reshape(done, done.shape + (1,) * (old.ndim - 1)), new, old)

            return jax.tree.map(lambda new, old: pick(new, old).astype(old.dtype), fresh, stepped)

        restarted = jax.lax.cond(done.any(), restart, lambda stepped: stepped, sim)
        out = {
            "obs": restarted.obs,
            "final_obs": sim.obs,
            "rewards": reward,
            "terminated": terminated,
            "truncated": truncated,
        }
        return (restarted, jnp.where(done, 0, steps)), out


def make_gymnax_env(
    task: str,
    num_envs: int,
    horizon: int | None,
    *,
    device: torch.device | str,
    seed: int | None = None,
    **env_kwargs: Any,
) -> Env:
    """The named task ``gymnax:<task>``: ``GymnaxEnv(num_envs, horizon, device=device,
    env_id=task, **env_kwargs)`` (:class:`GymnaxEnv` says what each argument means). ``seed``
    (PPO's ``env_seed``, the rank's) is not needed here: PPO's first reset seeds the env's JAX
    key with it."""
    return GymnaxEnv(num_envs, horizon, device=device, env_id=task, **env_kwargs)


def make_playground_env(
    task: str,
    num_envs: int,
    horizon: int | None,
    *,
    device: torch.device | str,
    seed: int | None = None,
    **env_kwargs: Any,
) -> Env:
    """The named task ``playground:<task>``: ``PlaygroundEnv(num_envs, horizon, device=device,
    env_id=task, **env_kwargs)`` (:class:`PlaygroundEnv` says what each argument means). ``seed``
    (PPO's ``env_seed``, the rank's) is not needed here: PPO's first reset seeds the env's JAX
    key with it."""
    return PlaygroundEnv(num_envs, horizon, device=device, env_id=task, **env_kwargs)
