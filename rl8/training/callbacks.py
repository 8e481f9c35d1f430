"""Callbacks: your code after every training step of :meth:`rl8.Trainer.run`, a plain callable
``callback(trainer, stats)`` or a :class:`Callback`. A callback may read and add stats (logged,
seen by the stop conditions), return ``True`` to stop the run, or raise to fail it (see
``docs/trainer.md#callbacks``)."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Union

if TYPE_CHECKING:
    from rl8.training.trainer import Trainer

__all__ = ["Callback", "CallbackLike", "as_callbacks"]


class Callback:
    """A callback with one method per moment of :meth:`rl8.Trainer.run`; override those you need.
    Each returns ``True`` to stop the run after this step."""

    def on_step(self, trainer: Trainer, stats: dict[str, float]) -> bool | None:
        """After every training step (and its evaluation), before the stats are logged and the
        stop conditions checked.

        Args:
            trainer: The Trainer that runs.
            stats: The step's stats (:class:`rl8.TrainStats`; entries added are logged).
        """
        return None

    def on_eval(self, trainer: Trainer, stats: dict[str, float]) -> bool | None:
        """After :meth:`on_step`, on the steps that evaluated (every ``steps_per_eval``).

        Args:
            trainer: The Trainer that runs.
            stats: The step's stats, ``eval/*`` included.
        """
        return None

    def __call__(self, trainer: Trainer, stats: dict[str, float]) -> bool | None:
        """:meth:`on_step`, then :meth:`on_eval` when ``stats`` hold an evaluation's stats."""
        stop = bool(self.on_step(trainer, stats))
        if any(str(key).startswith("eval/") for key in stats):
            stop = bool(self.on_eval(trainer, stats)) or stop
        return stop


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
