"""The Atari preset: CleanRL's ``ppo_atari`` preprocessing for ``ALE/...`` gymnasium ids
(``docs/pixels.md``). Needs ale-py (``pip install -e ".[atari]"``)."""

from __future__ import annotations

import dataclasses
import numbers
from collections.abc import Mapping
from typing import Any

import gymnasium
import numpy as np

__all__ = ["AtariPreset", "ClipReward", "EpisodicLife", "FireReset", "is_atari_id", "make_atari"]

#: The key of a gymnasium env's keyword arguments that configures the preset.
PRESET_KEY = "atari_preset"


def is_atari_id(env: Any) -> bool:
    """Whether ``env`` is an ALE gymnasium id (``"ALE/Pong-v5"``), which gets the preset."""
    return isinstance(env, str) and env.startswith("ALE/")


@dataclasses.dataclass(frozen=True)
class AtariPreset:
    """The options of the Atari preset (``env_kwargs={"env_kwargs": {"atari_preset": {...}}}``).

    Args:
        training: ``True``: the training form; ``False``: whole games with the game's score
            (whatever ``terminal_on_life_loss`` and ``clip_rewards`` say).
        noop_max: At most this many (a random number of) no-op actions after each reset.
        frame_skip: Emulator frames per env step (observed: the max of the last two frames).
        screen_size: Side of the square observation, in pixels.
        grayscale: Gray (one channel) observations, else RGB.
        terminal_on_life_loss: Training: an episode ends when a life is lost (the game goes on).
        clip_rewards: Training: rewards become their sign (-1, 0, +1).
        fire_reset: Press FIRE after each reset; ``None``: in games that have FIRE.
        frame_stack: Frames stacked per observation (``[frame_stack, H, W]``); 1: none.
        repeat_action_probability: ALE's sticky actions (CleanRL runs without: 0.0).
    """

    training: bool = True
    noop_max: int = 30
    frame_skip: int = 4
    screen_size: int = 84
    grayscale: bool = True
    terminal_on_life_loss: bool = True
    clip_rewards: bool = True
    fire_reset: bool | None = None
    frame_stack: int = 4
    repeat_action_probability: float = 0.0

    def __post_init__(self) -> None:
        for name, low in (("noop_max", 0), ("frame_skip", 1), ("screen_size", 1), ("frame_stack", 1)):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < low:
                raise ValueError(f"atari_preset {name}: expected an int >= {low}, got {value!r}")
        if not self.grayscale and self.frame_stack > 1:
            raise ValueError(
                f"atari_preset grayscale, frame_stack: stacked RGB frames would be [frame_stack, H, W, 3], "
                f"which no encoder reads; use grayscale=True or frame_stack=1, got grayscale=False, "
                f"frame_stack={self.frame_stack}"
            )
        p = self.repeat_action_probability
        if isinstance(p, bool) or not isinstance(p, numbers.Real) or not 0.0 <= p <= 1.0:
            raise ValueError(
                f"atari_preset repeat_action_probability: expected a number in [0, 1], got {p!r}"
            )

    @classmethod
    def from_value(cls, value: Any) -> AtariPreset | None:
        """The preset of an ``atari_preset`` ``value``: ``None``/``True`` the defaults, ``False``
        none, a mapping those options."""
        if value is None or value is True:
            return cls()
        if value is False:
            return None
        if isinstance(value, AtariPreset):
            return value
        if isinstance(value, Mapping):
            names = [f.name for f in dataclasses.fields(cls)]
            unknown = sorted(set(value) - set(names))
            if unknown:
                raise ValueError(f"atari_preset: unknown options {unknown}; expected some of {names}")
            return cls(**value)
        raise TypeError(
            f"atari_preset: expected a bool, None or a dict of options, got {type(value).__name__}"
        )


class EpisodicLife(gymnasium.Wrapper):
    """An episode ends when a life is lost; ``reset`` then takes one no-op step, restarting only
    a game that is over (DQN's trick)."""

    def __init__(self, env: gymnasium.Env) -> None:
        super().__init__(env)
        self.lives = 0
        self.game_over = True

    def step(self, action: Any) -> tuple[Any, float, bool, bool, dict[str, Any]]:
        obs, reward, terminated, truncated, info = self.env.step(action)
        self.game_over = terminated or truncated
        lives = self.env.unwrapped.ale.lives()
        if 0 < lives < self.lives:
            terminated = True
        self.lives = lives
        return obs, reward, terminated, truncated, info

    def reset(self, **kwargs: Any) -> tuple[Any, dict[str, Any]]:
        if self.game_over:
            obs, info = self.env.reset(**kwargs)
        else:
            obs, _, terminated, truncated, info = self.env.step(0)
            if terminated or truncated:  # the no-op ended the game: start a new one
                obs, info = self.env.reset(**kwargs)
        self.game_over = False
        self.lives = self.env.unwrapped.ale.lives()
        return obs, info


class FireReset(gymnasium.Wrapper):
    """Press FIRE after each reset (games such as Breakout wait for it to launch the ball)."""

    def reset(self, **kwargs: Any) -> tuple[Any, dict[str, Any]]:
        self.env.reset(**kwargs)
        obs, _, terminated, truncated, info = self.env.step(1)
        if terminated or truncated:
            obs, info = self.env.reset(**kwargs)
        return obs, info


class ClipReward(gymnasium.RewardWrapper):
    """Rewards become their sign (-1, 0, +1): one scale of learning signal for every game."""

    def reward(self, reward: float) -> float:
        return float(np.sign(reward))


def make_atari(env_id: str, **kwargs: Any) -> gymnasium.Env:
    """One ALE env with the preset's wrappers (``ImportError`` without ale-py).

    Args:
        env_id: An ALE id such as ``"ALE/Pong-v5"``.
        **kwargs: Keyword arguments of ``gymnasium.make``, and ``atari_preset``: ``True`` or
            ``None`` (the default preset), ``False`` (none) or a dict of :class:`AtariPreset`
            options.
    """
    try:
        import ale_py
    except ImportError as err:
        raise ImportError(
            f"{env_id} needs ale-py: pip install ale-py opencv-python-headless (or pip install -e '.[atari]' in rl8's checkout)"
        ) from err
    gymnasium.register_envs(ale_py)
    kwargs = dict(kwargs)
    preset = AtariPreset.from_value(kwargs.pop(PRESET_KEY, None))
    if preset is None:
        return gymnasium.make(env_id, **kwargs)
    kwargs.setdefault("repeat_action_probability", preset.repeat_action_probability)
    env = gymnasium.make(env_id, frameskip=1, **kwargs)
    env = gymnasium.wrappers.RecordEpisodeStatistics(env)
    env = gymnasium.wrappers.AtariPreprocessing(
        env,
        noop_max=preset.noop_max,
        frame_skip=preset.frame_skip,
        screen_size=preset.screen_size,
        terminal_on_life_loss=False,
        grayscale_obs=preset.grayscale,
    )
    if preset.training and preset.terminal_on_life_loss:
        env = EpisodicLife(env)
    has_fire = "FIRE" in env.unwrapped.get_action_meanings()
    if preset.fire_reset or (preset.fire_reset is None and has_fire):
        env = FireReset(env)
    if preset.training and preset.clip_rewards:
        env = ClipReward(env)
    if preset.frame_stack > 1:
        env = gymnasium.wrappers.FrameStackObservation(env, preset.frame_stack)
    return env
