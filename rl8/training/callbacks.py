"""Callbacks: your code after every training step of :meth:`rl8.Trainer.run`.

A callback is either a plain callable ``callback(trainer, stats)`` or a :class:`Callback`
(``on_step`` after every step, ``on_eval`` after the steps that evaluated)::

    def log_every_10(trainer, stats):
        if stats["algorithm/steps"] % 10 == 0:
            print(stats["env/steps"], stats["episodes/return_mean"])

    trainer.run(max_env_steps=100_000, callbacks=[log_every_10])

What a callback can do, in order of the loop (``docs/trainer.md#callbacks``):

* read the step's stats (``eval/*`` included on evaluation steps) and the Trainer
  (``trainer.algo``, ``trainer.save_checkpoint()``...);
* add or change stats: ``stats["my/metric"] = 1.0`` is logged to MLflow with the step's other
  stats and seen by the stop conditions (which run after the callbacks);
* ask the run to stop: return ``True`` (the step is logged, the final checkpoint written, and
  :attr:`rl8.Trainer.stopped_by` stays ``None``; the summary names the callback);
* fail the run: an exception ends the MLflow run as ``FAILED`` and propagates, like any error
  in a training step.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Union

if TYPE_CHECKING:
    from rl8.training.trainer import Trainer

__all__ = ["Callback", "CallbackLike", "as_callbacks"]


class Callback:
    """A callback with one method per moment of :meth:`rl8.Trainer.run`; override those you need.

    Each method receives the Trainer and the step's stats (a mutable ``dict[str, float]``:
    entries you add are logged and seen by the stop conditions) and returns ``True`` to stop
    the run after this step (``None`` or ``False``: go on).
    """

    def on_step(self, trainer: Trainer, stats: dict[str, float]) -> bool | None:
        """After every training step (one collect and one update, and its evaluation if the
        step had one), before the stats are logged and the stop conditions checked.

        Args:
            trainer: The Trainer that runs.
            stats: The step's stats (:class:`rl8.TrainStats`).

        Returns:
            ``True`` to stop the run after this step.
        """
        return None

    def on_eval(self, trainer: Trainer, stats: dict[str, float]) -> bool | None:
        """After :meth:`on_step`, on the steps that evaluated (every ``steps_per_eval``): the
        ``eval/*`` stats are in ``stats``.

        Args:
            trainer: The Trainer that runs.
            stats: The step's stats, ``eval/*`` included.

        Returns:
            ``True`` to stop the run after this step.
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
    """``Trainer.run``'s ``callbacks`` as a list, each checked to be callable.

    Raises:
        TypeError: An entry is not callable (naming its index and value).
    """
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
