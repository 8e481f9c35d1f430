"""The batched environment contract and the validation of what an env returns.

An :class:`Env` simulates ``num_envs`` copies of one environment at once, on one device. See
``docs/envs.md`` for a walk-through of writing one.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any, ClassVar

import numpy as np
import torch
from gymnasium import spaces
from tensordict import TensorDict, TensorDictBase

from rl8.envs.episodes import EpisodeRecords
from rl8.envs.spaces import space_dtype, space_shape

__all__ = [
    "Env", "EnvOutputError", "ReadyEnvs", "validate_step_output", "validate_reset_output", "find_nonfinite",
]


class EnvOutputError(ValueError):
    """An env returned data that breaks the step contract (missing key, shape, dtype, NaN)."""


class Env(ABC):
    """A batch of ``num_envs`` environments simulated together on one device.

    Subclasses set the class (or instance) attributes :attr:`observation_space` and
    :attr:`action_space` to the spaces of ONE environment (the batch dimension is implied)
    and implement :meth:`reset` and :meth:`step`.

    Two kinds of env exist:

    * **episodic** envs return ``terminated`` and/or ``truncated`` from :meth:`step` and reset
      the finished sub-envs themselves inside ``step`` (returning the observation before the
      reset as ``final_obs``);
    * **infinite-horizon** envs return neither; PPO resets all of them every
      ``horizons_per_env_reset`` collects.

    Args:
        num_envs: Number of environments simulated in parallel (the batch size), >= 1.
        horizon: Number of steps PPO collects per env between updates, or ``None`` when the
            env does not care. Envs may use it, e.g. to size their own state.
        device: Torch device the env's tensors live on.

    Attributes:
        max_num_envs: Class attribute; the largest ``num_envs`` the env supports (``None``:
            no limit).
        max_horizon: Class attribute; the largest ``horizon`` the env supports (``None``: no
            limit).
        episodic: Class attribute; ``True`` for envs that end episodes themselves (their
            ``step`` returns ``terminated``/``truncated``), ``False`` for infinite-horizon envs.
        metadata: Class attribute; ``render_fps`` is the frame rate (frames per second) of
            videos recorded from :meth:`render`.
    """

    observation_space: spaces.Space
    action_space: spaces.Space
    max_num_envs: ClassVar[int | None] = None
    max_horizon: ClassVar[int | None] = None
    episodic: ClassVar[bool] = False
    metadata: ClassVar[dict[str, Any]] = {"render_fps": 30}

    def __init__(
        self,
        num_envs: int,
        /,
        horizon: int | None = None,
        *,
        device: torch.device | str = "cpu",
    ) -> None:
        cls = type(self).__name__
        if isinstance(num_envs, bool) or not isinstance(num_envs, int) or num_envs < 1:
            raise ValueError(f"{cls}: num_envs must be an int >= 1, got {num_envs!r}")
        if self.max_num_envs is not None and num_envs > self.max_num_envs:
            raise ValueError(
                f"{cls}: num_envs must be <= max_num_envs={self.max_num_envs}, got {num_envs}"
            )
        if horizon is not None:
            if isinstance(horizon, bool) or not isinstance(horizon, int) or horizon < 1:
                raise ValueError(f"{cls}: horizon must be an int >= 1 or None, got {horizon!r}")
            if self.max_horizon is not None and horizon > self.max_horizon:
                raise ValueError(
                    f"{cls}: horizon must be <= max_horizon={self.max_horizon}, got {horizon}"
                )
        self.num_envs = num_envs
        self.horizon = horizon
        self.device = torch.device(device)

    @abstractmethod
    def reset(
        self, *, config: dict[str, Any] | None = None, seed: int | None = None
    ) -> torch.Tensor | TensorDictBase:
        """Reset every sub-env and return the first observations.

        Args:
            config: Env parameters to apply from now on (e.g. ``{"gravity": 9.8}``), for domain
                randomisation. ``None`` keeps the current ones. An unknown key is an error.
            seed: Seed of the env's random number generator; ``None`` continues the current
                stream.

        Returns:
            Observations of shape ``[num_envs, *observation_space.shape]`` (a TensorDict with
            batch size ``[num_envs]`` for ``Dict`` observation spaces).
        """

    @abstractmethod
    def step(self, action: torch.Tensor | TensorDictBase) -> TensorDictBase:
        """Advance every sub-env by one step.

        Args:
            action: A batch of actions, see :mod:`rl8.envs.spaces` for shapes and dtypes.

        Returns:
            A TensorDict with batch size ``[num_envs]``: ``obs`` and ``rewards`` (``[N, 1]``
            float) always; ``terminated``/``truncated`` (``[N, 1]`` bool) and ``final_obs``
            for episodic envs. See ``docs/envs.md``.
        """

    def step_output(self, entries: dict[str, Any]) -> TensorDict:
        """Wrap one step's tensors in the TensorDict that :meth:`step` returns.

        For the step of an env written in torch: ``entries`` are already on :attr:`device`
        with leading dim ``num_envs`` (``obs`` may be a dict for ``Dict`` spaces). It skips
        the per-entry checks of ``TensorDict(...)`` (about 2 us per step on a CPU, a visible
        share of a cheap env's step) when tensordict offers the unchecked constructor; PPO
        checks the first step output of every env against the contract anyway (keys, shapes,
        dtypes, see :func:`validate_step_output`).

        Args:
            entries: ``obs``, ``rewards`` and, for episodic envs, ``terminated``,
                ``truncated`` and ``final_obs`` (see :meth:`step`).
        """
        return new_tensordict(entries, torch.Size([self.num_envs]), self.device)

    def make_generator(self) -> torch.Generator:
        """A random generator on the env's device, seeded from torch's global RNG.

        Envs draw their randomness from their own generator (reseeded by ``reset(seed=...)``);
        seeding it from the global RNG makes ``torch.manual_seed`` reproduce a run.
        """
        generator = torch.Generator(device=self.device)
        generator.manual_seed(int(torch.randint(0, 2**62, (1,)).item()))
        return generator

    def render(self, index: int = 0) -> np.ndarray:
        """Return an RGB frame (``uint8``, ``[height, width, 3]``) of sub-env ``index``."""
        raise NotImplementedError(f"{type(self).__name__} does not implement render()")

    def close(self) -> None:
        """Release resources (subprocesses, windows). The default does nothing."""

    def pop_episode_records(self) -> EpisodeRecords | None:
        """The episodes that ended since the last call, as the env records them itself, and
        forget them.

        An env whose own account of episodes differs from the rewards and episode ends it
        returns (the Atari preset: whole games and their unclipped score, while PPO gets
        clipped rewards and an episode end at each lost life) returns it here: PPO logs it as
        ``env_episodes/{return_mean,length_mean,count}`` next to its own ``episodes/*``.
        :class:`rl8.envs.GymnasiumEnv` reports the records of a gymnasium
        ``RecordEpisodeStatistics`` wrapper in each sub-env's chain. PPO calls it once at the
        end of each collect (from the thread that steps the env); :meth:`reset` should forget
        the records not yet taken.

        Returns:
            ``None`` (the default): the env keeps no records of its own, and PPO logs no
            ``env_episodes/*``. An env that keeps records returns them at every call, as
            :class:`~rl8.envs.episodes.EpisodeRecords` with zero counts when no episode ended, so
            that every rank of a data-parallel job logs the same stats.
        """
        return None

    def state_dict(self) -> dict[str, Any] | None:
        """The env's simulation state, for checkpoints (``None``: the env cannot save it).

        The default saves every tensor attribute, the state of every ``torch.Generator``
        attribute and plain scalar/str/dict attributes, which covers envs written in pure
        torch. An env whose state lives elsewhere (subprocesses, a simulator) returns
        ``None``; PPO then resets it when training resumes from a checkpoint.
        """
        state: dict[str, Any] = {}
        for key, value in vars(self).items():
            if key in ("num_envs", "horizon", "device"):
                continue
            if isinstance(value, torch.Tensor):
                state[key] = value.detach().clone()
            elif isinstance(value, torch.Generator):
                state[key] = {"__generator__": value.get_state()}
            elif _is_plain(value):
                state[key] = value
            elif isinstance(value, dict) and all(_is_plain(v) for v in value.values()):
                state[key] = dict(value)
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore what :meth:`state_dict` returned.

        Only the entries this env's own :meth:`state_dict` produces are accepted, each of the
        same sort (a tensor of the same dtype, a generator state, a plain value): a stored
        state cannot set other attributes.

        Args:
            state: The env state read from a checkpoint.

        Raises:
            ValueError: The env cannot restore a state (its ``state_dict()`` is ``None``), or an
                entry is not one this env saves, or of another sort; the message names the key.
        """
        own = self.state_dict()
        if own is None:
            raise ValueError(f"env state: {type(self).__name__}.state_dict() is None, so it cannot "
                             "restore a stored state")
        if not isinstance(state, dict):
            raise ValueError(f"env state: expected a dict, got {type(state).__name__}")
        for key, value in state.items():
            if key not in own:
                raise ValueError(f"env state: {key!r} is not an entry of {type(self).__name__}'s "
                                 f"state; expected some of {sorted(own)}")
            expected = own[key]
            if isinstance(expected, torch.Tensor):
                if not isinstance(value, torch.Tensor) or value.dtype != expected.dtype:
                    raise ValueError(f"env state: {key!r} must be a {expected.dtype} tensor, got "
                                     f"{_sort_of(value)}")
                setattr(self, key, value.to(self.device))
            elif isinstance(expected, dict) and "__generator__" in expected:
                generator_state = value.get("__generator__") if isinstance(value, dict) else None
                if not isinstance(generator_state, torch.Tensor) or generator_state.dtype != torch.uint8:
                    raise ValueError(f"env state: {key!r} must be a generator state "
                                     f"({{'__generator__': uint8 tensor}}), got {_sort_of(value)}")
                getattr(self, key).set_state(generator_state)
            elif isinstance(expected, dict):
                if not (isinstance(value, dict) and all(_is_plain(v) for v in value.values())):
                    raise ValueError(f"env state: {key!r} must be a dict of plain values, got "
                                     f"{_sort_of(value)}")
                setattr(self, key, dict(value))
            else:
                if not _is_plain(value):
                    raise ValueError(f"env state: {key!r} must be a bool, int, float, str or None, "
                                     f"got {_sort_of(value)}")
                setattr(self, key, value)

    def apply_config(self, config: dict[str, Any] | None, allowed: dict[str, Any]) -> dict[str, Any]:
        """Merge ``config`` into ``allowed`` (the current parameters), rejecting unknown keys.

        Args:
            config: User-given parameters, or ``None``.
            allowed: The env's current parameters; its keys are the only allowed keys.

        Returns:
            A new dict with the merged parameters.
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

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(num_envs={self.num_envs}, horizon={self.horizon}, "
            f"device={self.device})"
        )


class ReadyEnvs(ABC):
    """The asynchronous interface of a batched env whose sub-envs step at their own pace.

    An :class:`Env` that also derives from this class (for example the worker pool of
    :class:`rl8.envs.PoolEnv`) lets the rollout loop act on whichever sub-envs are ready:
    :meth:`send` hands actions to some sub-envs, which then step while :meth:`recv` returns
    the step outputs of the sub-envs that finished, as they finish.
    :meth:`PPO.collect <rl8.PPO.collect>` then runs :func:`rl8.ppo.rollout.rollout_ready_envs`
    instead of :func:`rl8.ppo.rollout.rollout`. The ordinary :meth:`Env.step` of all sub-envs
    keeps working (send all, receive all, in env order) while no sub-env is stepping.

    Attributes:
        min_batch_size: The fewest sub-envs :meth:`recv` returns in the rollout loop (it takes
            fewer only after waiting ``max_wait_s``, or when fewer are stepping).
        max_batch_size: The most sub-envs :meth:`recv` returns in the rollout loop.
        max_wait_s: The longest wait, in seconds, for ``min_batch_size`` ready sub-envs
            before taking the ready ones; ``None``: no limit.
    """

    min_batch_size: int
    max_batch_size: int
    max_wait_s: float | None

    @abstractmethod
    def send(self, env_ids: torch.Tensor, actions: torch.Tensor | TensorDictBase) -> None:
        """Start one step of the sub-envs ``env_ids`` with ``actions``; returns at once.

        Args:
            env_ids: ``[K]`` int64, distinct indices in ``[0, num_envs)`` of sub-envs that are
                not stepping.
            actions: Their actions, ``[K, ...]`` (see :meth:`Env.step`), row ``k`` for sub-env
                ``env_ids[k]``.
        """

    @abstractmethod
    def recv(
        self, min_batch_size: int, max_batch_size: int, max_wait_s: float | None
    ) -> tuple[torch.Tensor, TensorDictBase]:
        """The step outputs of sub-envs whose step (started by :meth:`send`) is done.

        Waits until ``min_batch_size`` sub-envs are done (or all those stepping, when fewer
        are), or at most ``max_wait_s`` seconds, after which it takes the done ones if there
        are any (else it waits for the first).

        Args:
            min_batch_size: Sub-envs to wait for, >= 1.
            max_batch_size: The most sub-envs to return, >= ``min_batch_size``; the others
                stay ready for the next call.
            max_wait_s: The longest wait in seconds for ``min_batch_size`` sub-envs; ``None``:
                no limit.

        Returns:
            ``(env_ids, out)``: ``[K]`` int64 sub-env indices in increasing order and their
            step output, a TensorDict with batch size ``[K]`` as :meth:`Env.step` returns it
            (row ``k`` for sub-env ``env_ids[k]``).
        """


def _is_plain(value: Any) -> bool:
    """A value the default :meth:`Env.state_dict` saves as is."""
    return isinstance(value, (bool, int, float, str)) or value is None


def _sort_of(value: Any) -> str:
    """What a stored value is, for messages (``"a torch.float32 tensor"``, ``"a list"``)."""
    if isinstance(value, torch.Tensor):
        return f"a {value.dtype} tensor"
    return f"{value!r} ({type(value).__name__})" if _is_plain(value) else f"a {type(value).__name__}"


def _check_value(name: str, value: Any, space: spaces.Space, num_envs: int, where: str) -> None:
    """Check one observation-like value against ``space`` batched ``num_envs`` times.

    ``where`` starts every message (``"CartPole.step"``, ``"CartPole.reset"``).
    """
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
    # float values must have the buffer's dtype exactly (a float64 obs in a float32 space would
    # be cast silently); integer spaces accept any integer dtype
    if want.is_floating_point != value.dtype.is_floating_point or (
        want.is_floating_point and value.dtype != want
    ):
        raise EnvOutputError(f"{where}: {name!r} has dtype {value.dtype}, expected {want}")


def new_tensordict(
    tensors: dict[str, Any], batch_size: torch.Size, device: torch.device | None
) -> TensorDict:
    """A TensorDict of tensors already on ``device`` with the right batch size, built
    without the public constructor's per-entry checks when tensordict offers the unchecked
    constructor (tensordict 0.15: ``TensorDict._new_unsafe``), else with the public one."""
    if _new_unsafe is not None:
        return _new_unsafe(tensors, batch_size=batch_size, device=device)
    return TensorDict(tensors, batch_size=batch_size, device=device)


_new_unsafe = getattr(TensorDict, "_new_unsafe", None)


def validate_step_output(out: Any, env: Env, *, batch_size: int | None = None) -> None:
    """Check one ``step`` output against the contract; raise :class:`EnvOutputError` if broken.

    Checks the type, the batch size, the presence of ``obs`` and ``rewards``, the shape and
    dtype of every key (``rewards`` float32, float observations the space's dtype), that an
    episodic env returns both ``terminated`` and ``truncated``, and that ``final_obs`` comes
    with them.

    Args:
        out: What ``env.step`` returned (or :meth:`ReadyEnvs.recv`, for some of the envs).
        env: The env that returned it.
        batch_size: The number of envs ``out`` holds; ``None``: ``env.num_envs``.
    """
    name = type(env).__name__
    n = env.num_envs if batch_size is None else batch_size
    _check_step_container(out, name, n)
    keys = set(out.keys())
    _check_value("obs", out["obs"], env.observation_space, n, f"{name}.step")
    _check_step_column(out["rewards"], "rewards", torch.float32, name, n)
    for flag in ("terminated", "truncated"):
        if flag in keys:
            _check_step_column(out[flag], flag, torch.bool, name, n)
    _check_step_final_obs(out, keys, env, name, n)
    _check_step_episodic(keys, env, name, n)
    unknown = keys - {"obs", "rewards", "terminated", "truncated", "final_obs", "info"}
    if unknown:
        raise EnvOutputError(
            f"{name}.step: unknown keys {sorted(unknown)}; allowed: obs, rewards, terminated, "
            "truncated, final_obs, info"
        )


def _check_step_container(out: Any, name: str, n: int) -> None:
    """Check that ``out`` is a TensorDict of batch size ``(n,)`` with ``obs`` and ``rewards``."""
    if not isinstance(out, TensorDictBase):
        raise EnvOutputError(f"{name}.step must return a TensorDict, got {type(out).__name__}")
    if tuple(out.batch_size) != (n,):
        raise EnvOutputError(
            f"{name}.step: TensorDict batch_size is {tuple(out.batch_size)}, expected ({n},)"
        )
    keys = set(out.keys())
    for key in ("obs", "rewards"):
        if key not in keys:
            raise EnvOutputError(
                f"{name}.step: missing key {key!r}; the step output has keys {sorted(keys)}"
            )


def _check_step_column(value: torch.Tensor, key: str, dtype: torch.dtype, name: str, n: int) -> None:
    """Check that the step output ``key`` (``rewards``, ``terminated``, ``truncated``) is
    ``[n, 1]`` of ``dtype``."""
    if tuple(value.shape) != (n, 1):
        raise EnvOutputError(f"{name}.step: {key!r} has shape {tuple(value.shape)}, expected ({n}, 1)")
    if value.dtype != dtype:
        raise EnvOutputError(f"{name}.step: {key!r} has dtype {value.dtype}, expected {dtype}")


def _check_step_final_obs(out: TensorDictBase, keys: set, env: Env, name: str, n: int) -> None:
    """Check ``final_obs``: it comes with the episode flags, and ``truncated`` comes with it."""
    if "final_obs" in keys:
        if "terminated" not in keys and "truncated" not in keys:
            raise EnvOutputError(
                f"{name}.step: 'final_obs' is given without 'terminated' or 'truncated'"
            )
        _check_value("final_obs", out["final_obs"], env.observation_space, n, f"{name}.step")
    elif "truncated" in keys:
        raise EnvOutputError(
            f"{name}.step: 'truncated' is given without 'final_obs'; truncated steps bootstrap "
            "from the value of the observation before the auto-reset"
        )


def _check_step_episodic(keys: set, env: Env, name: str, n: int) -> None:
    """Check that an episodic env returns both flags and a non-episodic one neither."""
    has_flags = "terminated" in keys or "truncated" in keys
    if env.episodic and not has_flags:
        raise EnvOutputError(
            f"{name}.step: the env declares episodic=True but returned neither 'terminated' "
            "nor 'truncated'"
        )
    if env.episodic:
        for key in ("terminated", "truncated"):
            if key not in keys:
                raise EnvOutputError(
                    f"{name}.step: missing key {key!r}; an episodic env returns both "
                    f"'terminated' and 'truncated' ([{n}, 1] bool, all False where it never "
                    f"ends that way), got keys {sorted(keys)}"
                )
    if not env.episodic and has_flags:
        raise EnvOutputError(
            f"{name}.step: returned 'terminated'/'truncated' but the env declares "
            "episodic=False; set the class attribute episodic = True"
        )


def validate_reset_output(obs: Any, env: Env) -> None:
    """Check what ``env.reset`` returned; raise :class:`EnvOutputError` if it breaks the contract.

    The observations must be a tensor of shape ``[num_envs, *observation_space.shape]`` with
    the space's dtype (a TensorDict with batch size ``[num_envs]`` for ``Dict`` spaces).

    Args:
        obs: What ``env.reset`` returned.
        env: The env that returned it.
    """
    where = f"{type(env).__name__}.reset"
    n = env.num_envs
    if isinstance(obs, TensorDictBase) and tuple(obs.batch_size) != (n,):
        raise EnvOutputError(
            f"{where}: TensorDict batch_size is {tuple(obs.batch_size)}, expected ({n},)"
        )
    _check_value("obs", obs, env.observation_space, n, where)


def find_nonfinite(value: torch.Tensor | TensorDictBase, batch_dims: int = 1) -> torch.Tensor | None:
    """Indices over the first ``batch_dims`` dims where ``value`` holds NaN or inf.

    Args:
        value: A tensor or TensorDict whose leading ``batch_dims`` dims are batch dims.
        batch_dims: How many leading dims index envs (and time steps).

    Returns:
        ``None`` when everything is finite, else an int64 tensor of shape ``[K, batch_dims]``
        with the offending indices.
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
