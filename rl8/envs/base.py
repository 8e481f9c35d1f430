"""The batched environment contract (:class:`Env`, ``docs/envs.md``) and the validation of what
an env returns."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping
from typing import Any, ClassVar

import numpy as np
import torch
from gymnasium import spaces
from tensordict import TensorDict, TensorDictBase

from rl8.envs.episodes import EpisodeRecords
from rl8.envs.spaces import space_dtype, space_shape
from rl8.fields import check_int

__all__ = [
    "Env",
    "EnvOutputError",
    "ReadyEnvs",
    "validate_step_output",
    "validate_reset_output",
    "validate_log",
    "find_nonfinite",
]


class EnvOutputError(ValueError):
    """An env returned data that breaks the step contract (missing key, shape, dtype, NaN)."""


class Env(ABC):
    """A batch of ``num_envs`` environments simulated together on one device.

    Subclasses set :attr:`observation_space` and :attr:`action_space` to the spaces of ONE
    environment and implement :meth:`reset` and :meth:`step` (``docs/envs.md``).

    Args:
        num_envs: Number of environments simulated in parallel (the batch size), >= 1.
        horizon: Steps PPO collects per env between updates, or ``None``; envs may use it.
        device: Torch device the env's tensors live on.

    Attributes:
        max_num_envs: Class attribute; the largest ``num_envs`` supported (``None``: no limit).
        max_horizon: Class attribute; the largest ``horizon`` supported (``None``: no limit).
        episodic: Class attribute; ``True`` for envs whose ``step`` ends (and auto-resets)
            episodes, returning ``terminated``/``truncated``; ``False`` for infinite horizons.
        metadata: Class attribute; ``render_fps`` is the frame rate of videos of :meth:`render`.
        single_instance: ``True`` for an env whose simulator runs once per process (Isaac Lab):
            rl8 then never builds a second one (evaluation runs on the training envs).
    """

    observation_space: spaces.Space
    action_space: spaces.Space
    max_num_envs: ClassVar[int | None] = None
    max_horizon: ClassVar[int | None] = None
    episodic: ClassVar[bool] = False
    metadata: ClassVar[dict[str, Any]] = {"render_fps": 30}
    single_instance: ClassVar[bool] = False

    def __init__(
        self, num_envs: int, /, horizon: int | None = None, *, device: torch.device | str = "cpu"
    ) -> None:
        cls = type(self).__name__
        num_envs = check_int(f"{cls}: num_envs", num_envs, 1)
        if horizon is not None:
            if isinstance(horizon, bool) or not isinstance(horizon, int) or horizon < 1:
                raise ValueError(f"{cls}: horizon must be an int >= 1 or None, got {horizon!r}")
        limits = (("num_envs", num_envs, self.max_num_envs), ("horizon", horizon, self.max_horizon))
        for name, value, limit in limits:
            if limit is not None and value is not None and value > limit:
                raise ValueError(f"{cls}: {name} must be <= max_{name}={limit}, got {value}")
        self.num_envs = num_envs
        self.horizon = horizon
        self.device = torch.device(device)

    @abstractmethod
    def reset(
        self, *, config: dict[str, Any] | None = None, seed: int | None = None
    ) -> torch.Tensor | TensorDictBase:
        """Reset every sub-env and return the first observations, ``[num_envs, *obs_shape]``.

        Args:
            config: Env parameters to use from now on (``{"gravity": 9.8}``); ``None`` keeps
                the current ones. An unknown key is an error.
            seed: Seed of the env's random number generator; ``None`` continues its stream.
        """

    @abstractmethod
    def step(self, action: torch.Tensor | TensorDictBase) -> TensorDictBase:
        """Advance every sub-env by one step and return the step contract's TensorDict.

        Args:
            action: A batch of actions, see :mod:`rl8.envs.spaces` for shapes and dtypes.
        """

    def step_output(self, entries: dict[str, Any]) -> TensorDict:
        """The TensorDict :meth:`step` returns of ``entries`` (on :attr:`device`, ``[num_envs, ...]``),
        built without ``TensorDict``'s per-entry checks."""
        return new_tensordict(entries, torch.Size([self.num_envs]), self.device)

    def make_generator(self) -> torch.Generator:
        """A random generator on the env's device, seeded from torch's global RNG (so
        ``torch.manual_seed`` reproduces a run)."""
        generator = torch.Generator(device=self.device)
        generator.manual_seed(int(torch.randint(0, 2**62, (1,)).item()))
        return generator

    @property
    def name(self) -> str:
        """The env's name in messages: its class name, unless a subclass says more
        (``GymnasiumEnv(CartPole-v1)``) or sets ``self.name``."""
        return vars(self).get("name") or type(self).__name__

    @name.setter
    def name(self, value: str) -> None:
        vars(self)["name"] = value

    def render(self, index: int = 0) -> np.ndarray:
        """Return an RGB frame (``uint8``, ``[height, width, 3]``) of sub-env ``index``."""
        raise NotImplementedError(f"{type(self).__name__} does not implement render()")

    def close(self) -> None:
        """Release resources (subprocesses, windows). The default does nothing."""

    def pop_episode_records(self) -> EpisodeRecords | None:
        """The episodes that ended since the last call as the env records them itself, forgotten
        (``docs/envs.md``); ``None`` (the default): the env keeps no records."""
        return None

    def pop_log(self) -> dict[str, torch.Tensor]:
        """The simulator's own per-episode values since the last call (the reward and
        termination terms of Isaac Lab's and mjlab's ``extras["log"]``), forgotten: 0-d tensors
        on the env's device by the simulator's names, which PPO's collect reports as ``env/``
        stats (``docs/simulators.md``); ``{}`` (the default): the env logs none."""
        return {}

    def state_dict(self) -> dict[str, Any] | None:
        """The env's simulation state, for checkpoints; ``None``: it cannot be saved (PPO then
        resets the env on resume). The default saves the tensor, generator and plain attributes."""
        state: dict[str, Any] = {}
        for key, value in vars(self).items():
            if key in ("num_envs", "horizon", "device"):
                continue
            if isinstance(value, torch.Generator):
                state[key] = {"__generator__": value.get_state()}
            elif isinstance(value, torch.Tensor):
                state[key] = value.detach().clone()
            elif _kind(value) is not None:
                state[key] = dict(value) if isinstance(value, dict) else value
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore what :meth:`state_dict` returned; only its own entries, each of the same
        sort, are accepted (a ``ValueError`` names any other).

        Args:
            state: The env state read from a checkpoint.
        """
        own = self.state_dict()
        if own is None:
            raise ValueError(
                f"env state: {type(self).__name__}.state_dict() is None, so it cannot "
                "restore a stored state"
            )
        if not isinstance(state, dict):
            raise ValueError(f"env state: expected a dict, got {type(state).__name__}")
        for key, value in state.items():
            if key not in own:
                raise ValueError(
                    f"env state: {key!r} is not an entry of {type(self).__name__}'s "
                    f"state; expected some of {sorted(own)}"
                )
            expected = _kind(own[key])
            if _kind(value) != expected:
                raise ValueError(f"env state: {key!r} must be {expected}, got {_sort_of(value)}")
            current = getattr(self, key)
            if isinstance(current, torch.Generator):
                current.set_state(value["__generator__"])
            elif isinstance(value, torch.Tensor):
                setattr(self, key, value.to(self.device))
            else:
                setattr(self, key, dict(value) if isinstance(value, dict) else value)

    def apply_config(self, config: dict[str, Any] | None, allowed: dict[str, Any]) -> dict[str, Any]:
        """``allowed`` updated with ``config`` (a new dict); an unknown key raises ``KeyError``.

        Args:
            config: User-given parameters, or ``None``.
            allowed: The env's current parameters; its keys are the only allowed keys.
        """
        merged = dict(allowed)
        for key, value in (config or {}).items():
            if key not in allowed:
                raise KeyError(
                    f"{type(self).__name__}.reset: unknown config key {key!r}; "
                    f"allowed keys: {sorted(allowed)}"
                )
            merged[key] = value
        return merged

    def _apply_reset_args(self, config: dict[str, Any] | None, seed: int | None) -> None:
        """The built-in envs' ``reset(config, seed)``: ``self._set_params`` and ``self._generator``."""
        if config:
            self._set_params(self.apply_config(config, self.params))
        if seed is not None:
            self._generator.manual_seed(seed)

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(num_envs={self.num_envs}, horizon={self.horizon}, "
            f"device={self.device})"
        )


class ReadyEnvs(ABC):
    """The asynchronous interface of a batched env whose sub-envs step at their own pace:
    :meth:`send` starts some sub-envs' steps and :meth:`recv` returns the outputs of those
    that finished; an :class:`Env` that also derives from it (:class:`rl8.envs.PoolEnv`) is
    collected by :func:`rl8.ppo.rollout.rollout_ready_envs` (``docs/collection.md``), which
    passes :meth:`recv` the attributes ``min_batch_size``, ``max_batch_size`` and ``max_wait_s``.
    """

    min_batch_size: int
    max_batch_size: int
    max_wait_s: float | None

    @abstractmethod
    def send(self, env_ids: torch.Tensor, actions: torch.Tensor | TensorDictBase) -> None:
        """Start one step of the sub-envs ``env_ids`` (``[K]`` int64, distinct, not stepping) with
        ``actions`` (``[K, ...]``, row ``k`` for sub-env ``env_ids[k]``); returns at once."""

    @abstractmethod
    def recv(
        self, min_batch_size: int, max_batch_size: int, max_wait_s: float | None
    ) -> tuple[torch.Tensor, TensorDictBase]:
        """``(env_ids, out)``: ``[K]`` int64 indices, increasing, of sub-envs whose step is
        done, and their step output (batch size ``[K]``).

        Args:
            min_batch_size: Sub-envs to wait for (or all those stepping, when fewer), >= 1.
            max_batch_size: The most sub-envs to return; the others stay ready for later.
            max_wait_s: The longest wait in seconds for ``min_batch_size`` sub-envs, after
                which the done ones are taken (else the first to finish); ``None``: no limit.
        """


def _is_plain(value: Any) -> bool:
    return isinstance(value, (bool, int, float, str)) or value is None


def _sort_of(value: Any) -> str:
    """What a stored value is, for messages (``"a torch.float32 tensor"``, ``"a list"``)."""
    if isinstance(value, torch.Tensor):
        return f"a {value.dtype} tensor"
    return f"{value!r} ({type(value).__name__})" if _is_plain(value) else f"a {type(value).__name__}"


def _kind(value: Any) -> str | None:
    """What the default :meth:`Env.state_dict` stores ``value`` as, for messages; ``None``: nothing."""
    if isinstance(value, torch.Tensor):
        return f"a {value.dtype} tensor"
    if _is_plain(value):
        return "a bool, int, float, str or None"
    if isinstance(value, dict):
        inner = value.get("__generator__")
        if isinstance(inner, torch.Tensor) and inner.dtype == torch.uint8:
            return "a generator state ({'__generator__': uint8 tensor})"
        if all(_is_plain(v) for v in value.values()):
            return "a dict of plain values"
    return None


def _check_value(name: str, value: Any, space: spaces.Space, num_envs: int, where: str) -> None:
    """Check one observation-like value against ``space`` batched ``num_envs`` times."""
    if isinstance(space, spaces.Dict):
        if not isinstance(value, TensorDictBase):
            raise EnvOutputError(
                f"{where}: {name!r} must be a TensorDict for a Dict observation space, "
                f"got {type(value).__name__}"
            )
        for key, sub in space.spaces.items():
            if key not in value.keys():
                raise EnvOutputError(
                    f"{where}: missing key {name}[{key!r}]; expected keys "
                    f"{sorted(space.spaces)}, got {sorted(value.keys())}"
                )
            _check_value(f"{name}[{key!r}]", value[key], sub, num_envs, where)
        return
    if not isinstance(value, torch.Tensor):
        raise EnvOutputError(f"{where}: {name!r} must be a torch.Tensor, got {type(value).__name__}")
    expected = (num_envs, *space_shape(space))
    if tuple(value.shape) != expected:
        raise EnvOutputError(f"{where}: {name!r} has shape {tuple(value.shape)}, expected {expected}")
    want = space_dtype(space)
    # floats must have the buffer's dtype exactly (else a silent cast); integers any int dtype
    if want.is_floating_point != value.dtype.is_floating_point or (
        want.is_floating_point and value.dtype != want
    ):
        raise EnvOutputError(f"{where}: {name!r} has dtype {value.dtype}, expected {want}")


def new_tensordict(
    tensors: dict[str, Any], batch_size: torch.Size, device: torch.device | None
) -> TensorDict:
    """A TensorDict of tensors already on ``device``, built without the per-entry checks
    (tensordict 0.15's unchecked constructor)."""
    return TensorDict._new_unsafe(tensors, batch_size=batch_size, device=device)


def validate_step_output(out: Any, env: Env, *, batch_size: int | None = None) -> None:
    """Check one ``step`` output against the contract of ``docs/envs.md`` (keys, batch size,
    shapes, dtypes, presence rules); raise :class:`EnvOutputError` if broken.

    Args:
        out: What ``env.step`` returned (or :meth:`ReadyEnvs.recv`, for some of the envs).
        env: The env that returned it.
        batch_size: The number of envs ``out`` holds; ``None``: ``env.num_envs``.
    """
    where = f"{type(env).__name__}.step"
    n = env.num_envs if batch_size is None else batch_size
    if not isinstance(out, TensorDictBase):
        raise EnvOutputError(f"{where} must return a TensorDict, got {type(out).__name__}")
    if tuple(out.batch_size) != (n,):
        raise EnvOutputError(
            f"{where}: TensorDict batch_size is {tuple(out.batch_size)}, expected ({n},)"
        )
    keys = set(out.keys())
    for key in ("obs", "rewards"):
        if key not in keys:
            raise EnvOutputError(
                f"{where}: missing key {key!r}; the step output has keys {sorted(keys)}"
            )
    _check_value("obs", out["obs"], env.observation_space, n, where)
    columns = {"rewards": torch.float32, "terminated": torch.bool, "truncated": torch.bool}
    for key, dtype in columns.items():
        value = out.get(key)
        if value is not None and tuple(value.shape) != (n, 1):
            raise EnvOutputError(f"{where}: {key!r} has shape {tuple(value.shape)}, expected ({n}, 1)")
        if value is not None and value.dtype != dtype:
            raise EnvOutputError(f"{where}: {key!r} has dtype {value.dtype}, expected {dtype}")
    flags = keys & {"terminated", "truncated"}
    if "final_obs" in keys:
        if not flags:
            raise EnvOutputError(f"{where}: 'final_obs' is given without 'terminated' or 'truncated'")
        _check_value("final_obs", out["final_obs"], env.observation_space, n, where)
    elif "truncated" in keys:
        raise EnvOutputError(
            f"{where}: 'truncated' is given without 'final_obs'; truncated steps bootstrap "
            "from the value of the observation before the auto-reset"
        )
    if flags and not env.episodic:
        raise EnvOutputError(
            f"{where}: returned 'terminated'/'truncated' but the env declares episodic=False; "
            "set the class attribute episodic = True"
        )
    if env.episodic and not flags:
        raise EnvOutputError(
            f"{where}: the env declares episodic=True but returned neither 'terminated' nor 'truncated'"
        )
    if env.episodic and len(flags) == 1:
        missing = ({"terminated", "truncated"} - flags).pop()
        raise EnvOutputError(
            f"{where}: missing key {missing!r}; an episodic env returns both 'terminated' and "
            f"'truncated' ([{n}, 1] bool, all False where it never ends that way), got keys "
            f"{sorted(keys)}"
        )
    unknown = keys - {"obs", "rewards", "terminated", "truncated", "final_obs", "info"}
    if unknown:
        raise EnvOutputError(
            f"{where}: unknown keys {sorted(unknown)}; allowed: obs, rewards, terminated, "
            "truncated, final_obs, info"
        )


def validate_reset_output(obs: Any, env: Env) -> None:
    """Check ``obs``, what ``env.reset`` returned, against ``[num_envs, *obs_shape]`` of the
    observation space; raise :class:`EnvOutputError` if it breaks the contract."""
    where = f"{type(env).__name__}.reset"
    n = env.num_envs
    if isinstance(obs, TensorDictBase) and tuple(obs.batch_size) != (n,):
        raise EnvOutputError(
            f"{where}: TensorDict batch_size is {tuple(obs.batch_size)}, expected ({n},)"
        )
    _check_value("obs", obs, env.observation_space, n, where)


def validate_log(log: Any, env: Env) -> dict[str, torch.Tensor]:
    """Check ``log``, what ``env.pop_log`` returned, against its contract (a dict of 0-d
    tensors by string name, on any device); return it, or raise :class:`EnvOutputError`
    naming the env, the value and what it should be."""
    where = f"{type(env).__name__}.pop_log"
    if not isinstance(log, Mapping):
        raise EnvOutputError(f"{where}: expected a dict of 0-d tensors, got {type(log).__name__}")
    for key, value in log.items():
        if not isinstance(key, str):
            raise EnvOutputError(f"{where}: expected string names, got {key!r} ({type(key).__name__})")
        if not isinstance(value, torch.Tensor) or value.dim() != 0:
            got = (
                f"shape {tuple(value.shape)}"
                if isinstance(value, torch.Tensor)
                else type(value).__name__
            )
            raise EnvOutputError(f"{where}: {key!r} must be a 0-d tensor, got {got} ({value!r})")
    return dict(log)


def find_nonfinite(value: torch.Tensor | TensorDictBase, batch_dims: int = 1) -> torch.Tensor | None:
    """``[K, batch_dims]`` int64 indices where ``value`` holds NaN or inf, or ``None``.

    Args:
        value: A tensor or TensorDict whose leading ``batch_dims`` dims are batch dims.
        batch_dims: How many leading dims index envs (and time steps).
    """
    tensors = value.values(True, True) if isinstance(value, TensorDictBase) else [value]
    bad = None
    for t in tensors:
        if not t.is_floating_point():
            continue
        b = ~torch.isfinite(t)
        if b.dim() > batch_dims:
            b = b.flatten(batch_dims).any(-1)
        bad = b if bad is None else bad | b
    if bad is None or not bool(bad.any()):
        return None
    return bad.nonzero()
