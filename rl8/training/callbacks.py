"""Callbacks: your code after every training step of :meth:`rl8.Trainer.run`, a plain callable
``callback(trainer, stats)`` or a :class:`Callback` (see ``docs/trainer.md#callbacks``)."""

from __future__ import annotations

import warnings
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol

__all__ = [
    "STOP",
    "Callback",
    "CallbackLike",
    "RunningTrainer",
    "as_callbacks",
    "asks_to_stop",
    "run_callbacks",
]

#: What a callback returns to stop the run after this step (``rl8.STOP``, the string ``"stop"``).
STOP = "stop"


def asks_to_stop(answer: Any, callback: Any) -> bool:
    """Whether a callback's ``answer`` asks to stop: only :data:`STOP`. A bool (Stable-Baselines3
    callbacks return ``True`` to go on) is ignored with a warning, once."""
    if isinstance(answer, str) and answer == STOP:
        return True
    if answer is not None and type(answer).__name__ in ("bool", "bool_"):
        warnings.warn(
            f"the callback {callback_name(callback)} returned {answer!r}, "
            f'which rl8 ignores: return rl8.STOP ("stop") to stop the run, None to go on',
            UserWarning,
            stacklevel=5,
        )
    return False


class RunningTrainer(Protocol):
    """What a callback is handed: the :class:`rl8.Trainer` that runs (these are the parts of
    it that callbacks use most; every public attribute and method of the Trainer is there)."""

    algo: Any  #: the :class:`rl8.PPO` being trained
    tracker: Any  #: the :class:`rl8.tracking.Tracker` of the MLflow run
    metadata: dict[str, Any]  #: stored in every checkpoint

    @property
    def checkpoint_dir(self) -> Path: ...

    def save_checkpoint(self, path: Any = None) -> Path: ...


class Callback:
    """A callback with one method per moment of :meth:`rl8.Trainer.run`; override those you need.
    Each returns :data:`STOP` to stop the run after this step (``None``: go on)."""

    def on_step(self, trainer: RunningTrainer, stats: dict[str, float]) -> str | None:
        """After every training step (and its evaluation) of the running ``trainer``, before its
        ``stats`` (:class:`rl8.TrainStats`; entries added are logged) are logged and the stop
        conditions checked."""
        return None

    def on_eval(self, trainer: RunningTrainer, stats: dict[str, float]) -> str | None:
        """After :meth:`on_step`, on the steps that evaluated (every ``steps_per_eval``): the
        step's ``stats`` include ``eval/*``."""
        return None

    def __call__(self, trainer: RunningTrainer, stats: dict[str, float]) -> str | None:
        """:meth:`on_step`, then :meth:`on_eval` when ``stats`` hold an evaluation's stats."""
        stop = asks_to_stop(self.on_step(trainer, stats), self)
        if any(str(key).startswith("eval/") for key in stats):
            stop = asks_to_stop(self.on_eval(trainer, stats), self) or stop
        return STOP if stop else None


#: What :meth:`rl8.Trainer.run` takes as a callback.
CallbackLike = Callback | Callable[[RunningTrainer, dict[str, float]], Any]


def as_callbacks(callbacks: CallbackLike | Sequence[CallbackLike] | None) -> list[CallbackLike]:
    """``Trainer.run``'s ``callbacks`` as a list; a ``TypeError`` for one that is not callable."""
    if callbacks is None:
        return []
    if callable(callbacks) or isinstance(callbacks, (str, bytes, Mapping)):
        callbacks = [callbacks]  # type: ignore[list-item]
    out = list(callbacks)  # type: ignore[arg-type]
    for i, callback in enumerate(out):
        if not callable(callback):
            raise TypeError(
                f"Trainer.run: callbacks[{i}] must be a callable callback(trainer, stats) or a "
                f"rl8.training.callbacks.Callback, got {callback!r}"
            )
    return out


def callback_name(callback: CallbackLike) -> str:
    """How messages name ``callback``: its ``__name__``, else its repr."""
    return getattr(callback, "__name__", None) or repr(callback)


def run_callbacks(
    callbacks: Sequence[CallbackLike], trainer: RunningTrainer, stats: dict[str, float], evaluated: bool
) -> CallbackLike | None:
    """Run every callback on a step's ``stats`` (a :class:`Callback`'s ``on_eval`` too when the
    step ``evaluated``); the first that asked to stop, or ``None``."""
    stop = None
    for callback in callbacks:
        if isinstance(callback, Callback):
            asked = asks_to_stop(callback.on_step(trainer, stats), callback)
            if evaluated:
                asked = asks_to_stop(callback.on_eval(trainer, stats), callback) or asked
        else:
            asked = asks_to_stop(callback(trainer, stats), callback)
        if asked and stop is None:
            stop = callback
    return stop
