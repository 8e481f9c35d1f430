"""Callbacks: your code after every training step of :meth:`rl8.Trainer.run`, a plain callable
``callback(trainer, stats)`` or a :class:`Callback`. A callback may read and add stats (logged,
seen by the stop conditions), return :data:`STOP` (``"stop"``) to stop the run, or raise to fail
it (see ``docs/trainer.md#callbacks``)."""

from __future__ import annotations

import warnings
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Union

if TYPE_CHECKING:
    from rl8.training.trainer import Trainer

__all__ = ["STOP", "Callback", "CallbackLike", "as_callbacks", "asks_to_stop"]

#: What a callback returns to stop the run after this step (``rl8.STOP``, the string ``"stop"``).
STOP = "stop"


def asks_to_stop(answer: Any, callback: Any) -> bool:
    """Whether a callback's ``answer`` asks to stop: only :data:`STOP`. A bool (Stable-Baselines3
    callbacks return ``True`` to go on) is ignored with a warning, once."""
    if isinstance(answer, str) and answer == STOP:
        return True
    if answer is not None and type(answer).__name__ in ("bool", "bool_"):
        warnings.warn(f"the callback {getattr(callback, '__name__', None) or callback!r} returned {answer!r}, "
                      f"which rl8 ignores: return rl8.STOP (\"stop\") to stop the run, None to go on", UserWarning,
                      stacklevel=5)
    return False


class Callback:
    """A callback with one method per moment of :meth:`rl8.Trainer.run`; override those you need.
    Each returns :data:`STOP` to stop the run after this step (``None``: go on)."""

    def on_step(self, trainer: Trainer, stats: dict[str, float]) -> str | None:
        """After every training step (and its evaluation), before the stats are logged and the
        stop conditions checked.

        Args:
            trainer: The Trainer that runs.
            stats: The step's stats (:class:`rl8.TrainStats`; entries added are logged).
        """
        return None

    def on_eval(self, trainer: Trainer, stats: dict[str, float]) -> str | None:
        """After :meth:`on_step`, on the steps that evaluated (every ``steps_per_eval``).

        Args:
            trainer: The Trainer that runs.
            stats: The step's stats, ``eval/*`` included.
        """
        return None

    def __call__(self, trainer: Trainer, stats: dict[str, float]) -> str | None:
        """:meth:`on_step`, then :meth:`on_eval` when ``stats`` hold an evaluation's stats."""
        stop = asks_to_stop(self.on_step(trainer, stats), self)
        if any(str(key).startswith("eval/") for key in stats):
            stop = asks_to_stop(self.on_eval(trainer, stats), self) or stop
        return STOP if stop else None


#: What :meth:`rl8.Trainer.run` takes as a callback.
CallbackLike = Union[Callback, Callable[["Trainer", dict[str, float]], Any]]


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
