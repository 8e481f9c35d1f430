"""Signals during :meth:`rl8.Trainer.run`: SIGUSR1 asks for a checkpoint, SIGINT/SIGTERM for a
checkpoint and a stop. Handlers only set flags; the Trainer acts on them between steps, after
every rank of a data-parallel run agreed on them with one small collective."""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Callable, Iterator
from typing import Any

from rl8.ppo.distributed import DistContext

__all__ = ["StopSignals", "handling", "signal_exit"]


def signal_exit(signum: int) -> BaseException:
    """What a stop signal raises: ``KeyboardInterrupt`` for SIGINT, else
    ``SystemExit(128 + signum)`` (exit status 143 for SIGTERM)."""
    return KeyboardInterrupt() if signum == signal.SIGINT else SystemExit(128 + signum)


@contextlib.contextmanager
def handling(signums: list[int | None], handler: Callable[[int, Any], None]) -> Iterator[None]:
    """Call ``handler(signum, frame)`` on the signals ``signums`` (``None``s are left out) in this
    block, when it runs in the main thread (elsewhere Python handles no signals); the previous
    handlers come back at its end."""
    previous: dict[int, Any] = {}
    try:
        if threading.current_thread() is threading.main_thread():
            previous = {
                signum: signal.signal(signum, handler) for signum in signums if signum is not None
            }
        yield
    finally:
        for signum, old in previous.items():
            signal.signal(signum, old if old is not None else signal.SIG_DFL)


class StopSignals:
    """What SIGUSR1, SIGINT and SIGTERM asked for during one :meth:`rl8.Trainer.run`, agreed
    between the ranks of the process group ``dist`` (a no-op in one process); ``ignore_stop()``
    says whether a SIGINT/SIGTERM is ignored now (while a signal exit marks the MLflow run
    ``KILLED``, within a time limit). ``stop_signal``: the SIGINT/SIGTERM received (by any rank,
    once agreed), or ``None``."""

    def __init__(self, dist: DistContext, ignore_stop: Callable[[], bool]) -> None:
        self.dist = dist
        self._ignore_stop = ignore_stop
        self.stop_signal: int | None = None
        self._checkpoint_requested = False
        self._agreed: tuple[bool, int | None] = (False, None)

    def installed(self) -> contextlib.AbstractContextManager:
        """Handle the signals in this block (only in the main thread)."""
        return handling(
            [signal.SIGINT, signal.SIGTERM, getattr(signal, "SIGUSR1", None)], self._on_signal
        )

    def _on_signal(self, signum: int, frame: Any) -> None:
        if signum == getattr(signal, "SIGUSR1", None):
            self._checkpoint_requested = True
            return
        if self._ignore_stop():
            return
        if self.stop_signal is not None:  # second request: stop now, without a checkpoint
            raise signal_exit(signum)
        self.stop_signal = signum

    def agree(self, stop: bool) -> bool:
        """Whether to stop, given whether the stop conditions hold on this rank (``stop``): in
        data-parallel training rank 0's (its clock decides time limits), agreed with ONE small
        collective that also shares the signals any rank received (kept for :meth:`take`)."""
        if not self.dist.enabled:
            return stop
        requested = self._checkpoint_requested
        flags = self.dist.max(
            [float(stop and self.dist.is_main), float(requested), float(self.stop_signal or 0)]
        )
        if requested:
            self._checkpoint_requested = False
        self._agreed = (bool(flags[1]), int(flags[2]) or None)
        return bool(flags[0])

    def take(self) -> tuple[bool, int | None]:
        """What to act on now, as every rank agreed: whether a checkpoint was asked for (consumed)
        and the stop signal (``None``: none)."""
        if self.dist.enabled:
            checkpoint, signum = self._agreed
            self._agreed = (False, None)
        else:
            checkpoint, signum = self._checkpoint_requested, self.stop_signal
            self._checkpoint_requested = False
        if signum is not None:
            self.stop_signal = signum  # in data-parallel training, maybe another rank's
        return checkpoint, signum
