"""Folders of checkpoints (``docs/checkpoints.md``): numbered files of which the latest are kept,
one run per folder, and finding and reading the checkpoint to resume from."""

from __future__ import annotations

import contextlib
import gc
import json
import os
import re
import socket
import stat
import tempfile
import time
import uuid
import warnings
import weakref
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from rl8.io.checkpoint import (
    CHECKPOINT_POINTER_ARTIFACT,
    STALE_TMP_SECONDS,
    download_artifact,
    is_run_ref,
    load_checkpoint,
    save_checkpoint,
)
from rl8.ppo.distributed import DistContext, current_roles
from rl8.ppo.resolve import CheckpointError
from rl8.processes import process_state

try:  # POSIX: locks tell a live writer or run from a dead one (see CheckpointManager, CheckpointDirLock)
    import fcntl
except ImportError:  # pragma: no cover - Windows
    fcntl = None  # type: ignore[assignment]

__all__ = [
    "CHECKPOINT_DIR_LOCK",
    "CheckpointDirError",
    "CheckpointDirLock",
    "CheckpointManager",
    "check_writable_folder",
    "checkpoint_for_actor",
    "read_checkpoint",
    "resolve_checkpoint",
]

#: The lock file of a checkpoint folder (see :class:`CheckpointDirLock`).
CHECKPOINT_DIR_LOCK = ".rl8.lock"
#: Bytes of a lock file read at most (rl8's record is about 150): a longer one is not rl8's.
LOCK_MAX_BYTES = 4096


class CheckpointDirError(ValueError):
    """A checkpoint folder cannot be used: it cannot be created or written, another live run
    writes there, or it holds another run's checkpoints (the message names the folder)."""


class CheckpointManager:
    """Numbered checkpoints ``{prefix}-{step:012d}.pt`` in one directory, keeping the most
    recent ones; other files are never touched.

    Args:
        directory: Folder of the checkpoints; created (with parents) if missing.
        keep_last: How many checkpoints to keep (the highest steps; an int >= 1), or ``None``: all.
        prefix: File name prefix; non-empty, without path separators.
    """

    def __init__(
        self, directory: str | os.PathLike[str], *, keep_last: int | None = 5, prefix: str = "checkpoint"
    ) -> None:
        if keep_last is not None and (type(keep_last) is not int or keep_last < 1):
            raise ValueError(
                f"CheckpointManager: keep_last must be an int >= 1 or None, got {keep_last!r}"
            )
        if not isinstance(prefix, str) or not prefix or "/" in prefix or "\\" in prefix:
            raise ValueError(
                f"CheckpointManager: prefix must be a non-empty str without path "
                f"separators, got {prefix!r}"
            )
        self.directory = Path(directory)
        self.keep_last = keep_last
        self.prefix = prefix
        self._pattern = re.compile(rf"{re.escape(prefix)}-(\d{{12,}})\.pt")
        self._tmp_pattern = re.compile(rf"\.{re.escape(prefix)}-\d{{12,}}\.pt\.[0-9a-f]{{12}}\.tmp")
        self.directory.mkdir(parents=True, exist_ok=True)

    def path_for(self, step: int) -> Path:
        """The file name used for ``step``."""
        return self.directory / f"{self.prefix}-{step:012d}.pt"

    def step_of(self, path: str | os.PathLike[str]) -> int | None:
        """The step encoded in a file name of this manager, ``None`` for other files."""
        match = self._pattern.fullmatch(Path(path).name)
        return int(match.group(1)) if match else None

    def save(self, state: Mapping[str, Any], step: int) -> Path:
        """Write ``state`` (see :func:`save_checkpoint`) as the checkpoint of ``step`` (the training
        progress it belongs to, e.g. ``env/steps``, an int >= 0), then prune old checkpoints (never
        the one just written) and stale temporary files; returns the path written."""
        if isinstance(step, bool) or not isinstance(step, int) or step < 0:
            raise ValueError(f"CheckpointManager.save: step must be an int >= 0, got {step!r}")
        path = save_checkpoint(state, self.path_for(step))
        self._remove_stale_tmp_files()
        if self.keep_last is not None:
            paths = self.list()
            for old in paths[: max(0, len(paths) - self.keep_last)]:
                if old != path:
                    old.unlink(missing_ok=True)
        return path

    def _remove_stale_tmp_files(self) -> None:
        """Delete this manager's old temporary files that no live writer holds."""
        now = time.time()
        for entry in self.directory.iterdir():
            if not self._tmp_pattern.fullmatch(entry.name):
                continue
            with contextlib.suppress(OSError):  # a live writer's lock; Windows: an open file
                if now - entry.stat().st_mtime < STALE_TMP_SECONDS:
                    continue  # possibly a writer between creating and locking it
                fd = os.open(entry, os.O_RDONLY)
                try:
                    if fcntl is not None:
                        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    entry.unlink()
                finally:
                    os.close(fd)

    def list(self) -> list[Path]:
        """This manager's checkpoint files, sorted by step (oldest first)."""
        found = [(self.step_of(e), e) for e in self.directory.iterdir() if self.step_of(e) is not None]
        return [entry for _, entry in sorted(found) if entry.is_file()]

    def latest(self) -> Path | None:
        """The checkpoint with the highest step, or ``None`` when there is none."""
        return next(reversed(self.list()), None)

    def load_latest(self, *, map_location: Any = "cpu") -> dict[str, Any] | None:
        """Load the checkpoint with the highest step (see :func:`load_checkpoint`), or ``None``."""
        path = self.latest()
        return None if path is None else load_checkpoint(path, map_location=map_location)

    def __repr__(self) -> str:
        return (
            f"CheckpointManager({str(self.directory)!r}, keep_last={self.keep_last!r}, "
            f"prefix={self.prefix!r})"
        )


#: The folders this process holds (``flock`` is per open file: it could not lock them again).
_held_locks: weakref.WeakValueDictionary[Path, CheckpointDirLock] = weakref.WeakValueDictionary()


def check_writable_folder(directory: str | os.PathLike[str]) -> Path:
    """Create ``directory`` (with parents), write and remove a probe file in it, and return it
    absolute; else raise :class:`CheckpointDirError`."""
    directory = Path(directory).absolute()
    probe = directory / f".rl8-probe-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    try:
        directory.mkdir(parents=True, exist_ok=True)
        probe.write_bytes(b"rl8")
        probe.unlink()
    except OSError as exc:
        raise CheckpointDirError(
            f"checkpoint folder {directory} cannot be used: {exc.strerror or exc} "
            f"({exc.filename or directory}); choose a folder this process can write"
        ) from None
    return directory


def _describe_owner(record: Mapping[str, Any]) -> str:
    """``run 0a1b... (pid 123 on host)`` (``, ended)`` once released) from a lock file's record (one
    that rl8 did not write: says so)."""
    if not isinstance(record.get("pid"), int):
        return "an unknown run (the lock file holds no record of rl8's)"
    run = record.get("run_id")
    who = f"run {run}" if run else "a run without MLflow tracking"
    ended = ", ended" if record.get("released") else ""
    return f"{who} (pid {record['pid']} on {record.get('host', '?')}{ended})"


class CheckpointDirLock:
    """The claim of one run on its checkpoint folder, held until :meth:`release` or the end of
    the process (docs/trainer.md, one run per checkpoint folder): it writes and locks the lock
    file :data:`CHECKPOINT_DIR_LOCK`, refusing (:class:`CheckpointDirError`) a folder it cannot
    create or write, one locked by a live process or one holding another run's checkpoints; a
    lock left by a dead process is taken over with a warning.

    Args:
        directory: The checkpoint folder.
        run_id: The MLflow run id of the run claiming it, when known (``None``: a new run, or
            no tracking); see :meth:`set_run_id`.
        resumed_from: The checkpoint file this run resumes from, ``None`` for a new run.
    """

    def __init__(
        self,
        directory: str | os.PathLike[str],
        *,
        run_id: str | None = None,
        resumed_from: str | os.PathLike[str] | None = None,
    ) -> None:
        self.directory = Path(directory).absolute()
        self.run_id = run_id
        self._host = socket.gethostname()
        self._fd: int | None = None
        path = self.directory / CHECKPOINT_DIR_LOCK
        holder = _held_locks.get(self.directory)
        if (
            holder is not None
            and holder.held
            and not self._same_run(holder.run_id, run_id, resumed_from)
        ):
            gc.collect()  # a Trainer of this process that nothing references any more
            holder = _held_locks.get(self.directory)
        if holder is not None and holder.held:  # this process holds it already
            if not self._same_run(holder.run_id, run_id, resumed_from):
                raise self._busy({"run_id": holder.run_id, "pid": os.getpid(), "host": self._host})
            # the same run resumed in this process (a Trainer left open): the claim moves here
            fd, previous = holder.hand_over(), {}
        else:
            fd, previous = self._open_locked(path), None
        try:
            if previous is None:
                previous = self._read(fd)
                pid = previous.get("pid")
                if (
                    fcntl is None
                    and pid != os.getpid()
                    and process_state(previous.get("host"), pid) == "alive"
                ):
                    raise self._busy(previous)  # without file locks (Windows): the record tells
                if not self._same_run(previous.get("run_id"), run_id, resumed_from):
                    self._check_no_checkpoints(previous)
            self._write(fd)
        except BaseException:
            os.close(fd)
            raise
        self._fd = fd
        _held_locks[self.directory] = self
        if previous and not previous.get("released") and previous.get("pid") != os.getpid():
            fate = {
                "dead": "whose process ended without releasing it (killed or crashed)",
                "alive": "whose process is alive but no longer holds the lock",
                "unknown": "which no longer holds the lock (whether its process still runs is not known here)",
            }
            state = process_state(previous.get("host"), previous.get("pid"))
            warnings.warn(
                f"checkpoint_dir {self.directory} was locked by {_describe_owner(previous)}, "
                f"{fate[state]}; this run takes it over",
                stacklevel=3,
            )

    def _open_locked(self, path: Path) -> int:
        """Open and lock the lock file (again if its owner replaced or removed it meanwhile)."""
        while True:
            try:
                self.directory.mkdir(parents=True, exist_ok=True)
                fd = os.open(path, os.O_RDWR | os.O_CREAT | getattr(os, "O_NOFOLLOW", 0), 0o666)
            except OSError as exc:
                if path.is_symlink():
                    raise CheckpointDirError(
                        f"checkpoint_dir {self.directory}: its lock file {path} is a "
                        "symbolic link, which rl8 never follows; remove it"
                    ) from None
                raise CheckpointDirError(
                    f"checkpoint_dir {self.directory} cannot be used for checkpoints: {exc.strerror or exc} "
                    f"({exc.filename or path}); choose a folder this process can write"
                ) from None
            try:
                if not stat.S_ISREG(os.fstat(fd).st_mode):
                    raise CheckpointDirError(
                        f"checkpoint_dir {self.directory}: its lock file {path} is "
                        "not a regular file; remove it"
                    )
                try:
                    if fcntl is not None:
                        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                except OSError:
                    raise self._busy(self._read(fd)) from None
                with contextlib.suppress(FileNotFoundError):
                    if os.stat(path).st_ino == os.fstat(fd).st_ino:
                        return fd
            except BaseException:
                os.close(fd)
                raise
            os.close(fd)

    def _busy(self, record: Mapping[str, Any]) -> CheckpointDirError:
        """The error for a folder whose lock a live process holds (``record``: what its lock file says)."""
        named, released = isinstance(record.get("pid"), int), record.get("released")
        if named and not released and process_state(record.get("host"), record.get("pid")) != "dead":
            mine = (
                " (a Trainer of this process: close() it first)" if record["pid"] == os.getpid() else ""
            )
            return CheckpointDirError(
                f"checkpoint_dir {self.directory} is in use by {_describe_owner(record)}{mine}; two runs "
                "writing into one folder would overwrite and prune each other's checkpoints. Give this "
                "run another checkpoint_dir (e.g. --checkpoint-dir), or wait for that run to end"
            )
        says = (
            f"not the one its lock file names, {_describe_owner(record)}{'' if released else ', which has ended'}"
            if named
            else "its lock file holds no record of rl8's"
        )
        return CheckpointDirError(
            f"checkpoint_dir {self.directory} is locked by a live process ({says}); rl8 never writes into a "
            "folder another process holds. Give this run another checkpoint_dir (e.g. --checkpoint-dir), or "
            "stop that process"
        )

    def _same_run(self, owner: str | None, run_id: str | None, resumed_from: Any) -> bool:
        """Whether the run claiming the folder continues its owner's (resumes from a checkpoint
        there, or continues the MLflow run ``owner``)."""
        if resumed_from is not None and Path(resumed_from).absolute().parent == self.directory:
            return True
        return run_id is not None and owner == run_id

    def _check_no_checkpoints(self, previous: Mapping[str, Any]) -> None:
        found = CheckpointManager(self.directory, keep_last=None).list()
        if not found:
            return
        owner = _describe_owner(previous) if previous else "another run"
        raise CheckpointDirError(
            f"checkpoint_dir {self.directory} already holds {len(found)} checkpoint(s) of {owner} "
            f"(latest: {found[-1].name}); a new run there would overwrite and prune them. Resume that "
            f"run (rl8 train --resume {self.directory}, Trainer.from_checkpoint), give this run "
            "another checkpoint_dir, or delete those checkpoints"
        )

    @staticmethod
    def _read(fd: int) -> dict[str, Any]:
        """The lock file's record: ``{}`` when empty; ``{"unreadable": True}`` when it is not an
        rl8 record (not a JSON object, nested too deep, longer than :data:`LOCK_MAX_BYTES`)."""
        try:
            os.lseek(fd, 0, os.SEEK_SET)
            data = os.read(fd, LOCK_MAX_BYTES + 1)
            if not data.strip():
                return {}
            record = json.loads(data) if len(data) <= LOCK_MAX_BYTES else None
        except (OSError, ValueError, RecursionError):
            record = None
        return record if isinstance(record, dict) else {"unreadable": True}

    def _write(self, fd: int, released: bool = False) -> None:
        record = {
            "run_id": self.run_id,
            "pid": os.getpid(),
            "host": self._host,
            "since": time.time(),
            "released": released,
        }
        data = json.dumps(record).encode()
        try:
            os.ftruncate(fd, 0)
            os.lseek(fd, 0, os.SEEK_SET)
            os.write(fd, data)
        except OSError as exc:
            raise CheckpointDirError(
                f"checkpoint_dir {self.directory} cannot be used for checkpoints: writing "
                f"{CHECKPOINT_DIR_LOCK} there failed: {exc.strerror or exc}"
            ) from None

    @property
    def held(self) -> bool:
        """Whether this claim is still held (not released)."""
        return self._fd is not None

    def set_run_id(self, run_id: str | None) -> None:
        """Record the MLflow run id once known (a run created after the claim)."""
        if self._fd is not None and run_id != self.run_id:
            self.run_id = run_id
            with contextlib.suppress(CheckpointDirError):
                self._write(self._fd)

    def hand_over(self) -> int | None:
        """Give this claim up without releasing the folder (the same run claims it again in this
        process): the open, locked lock file's descriptor, which the caller now owns; ``None``
        when not held."""
        fd, self._fd = self._fd, None
        return fd

    def release(self) -> None:
        """Give the folder up (idempotent): the lock file, marked released, still names the run."""
        fd, self._fd = self._fd, None
        if fd is None:
            return
        with contextlib.suppress(CheckpointDirError):
            self._write(fd, released=True)
        os.close(fd)

    def __del__(self) -> None:  # the OS releases the lock with the file; this only closes it
        with contextlib.suppress(Exception):
            if self._fd is not None:
                os.close(self._fd)

    def __repr__(self) -> str:
        return f"CheckpointDirLock({str(self.directory)!r}, run_id={self.run_id!r}, held={self.held})"


def resolve_checkpoint(ref: str | os.PathLike[str], *, tracking_uri: str | None = None) -> Path:
    """The checkpoint file that ``ref`` names: a checkpoint file, a folder of numbered checkpoints
    (its latest) or an MLflow run id of the store ``tracking_uri`` (``None``: MLflow's default);
    ``FileNotFoundError`` if none."""
    text = os.fspath(ref)
    path = Path(text)
    if path.is_dir():
        latest = CheckpointManager(path, keep_last=None).latest()
        if latest is None:
            raise FileNotFoundError(f"no checkpoint-*.pt file in {path}")
        return latest
    if path.exists():
        return path
    if not is_run_ref(text):
        raise FileNotFoundError(f"no checkpoint at {text!r}: not a file or folder, nor an MLflow run id")
    with tempfile.TemporaryDirectory(prefix="rl8-resume-") as tmp:
        pointer = download_artifact(text, CHECKPOINT_POINTER_ARTIFACT, tracking_uri, tmp)
        try:
            info = json.loads(pointer.read_bytes()[: 1 << 16])
        except (ValueError, RecursionError) as exc:
            info = exc
    found = info.get("path") if isinstance(info, dict) else None
    if not isinstance(found, str) or not Path(found).is_absolute() or ".." in Path(found).parts:
        raise CheckpointError(
            f"MLflow run {text}: its artifact {CHECKPOINT_POINTER_ARTIFACT} must be a JSON object whose "
            f"'path' is the absolute path of a checkpoint, without '..'; got {str(info)[:200]!r}. "
            "Pass the checkpoint's path instead"
        )
    found = Path(found)
    if not found.is_file():
        raise FileNotFoundError(
            f"MLflow run {text} records its latest checkpoint at {found}, which does not "
            "exist on this machine; pass the checkpoint's path instead"
        )
    return found


def read_checkpoint(
    ref: str | os.PathLike[str], *, tracking_uri: str | None = None
) -> tuple[Path, dict[str, Any]]:
    """The file of :func:`resolve_checkpoint` (``ref``, ``tracking_uri``: as there) and its content
    as this rank loads it (rank 0 reads it for every rank; an actor reads it itself and gets its
    own entry as ``"actor"``, ``None`` without actor states); a ``CheckpointError`` if it was
    written by another job."""
    roles = current_roles()
    if roles is not None and roles.is_actor:
        file = resolve_checkpoint(ref, tracking_uri=tracking_uri)
        _check_pointed_run(os.fspath(ref), file, state := load_checkpoint(file))
        return file, checkpoint_for_actor(state, file, roles.rank)
    ctx = DistContext()

    def read_for_every_rank() -> list[tuple[Path, dict[str, Any]]]:
        file = resolve_checkpoint(ref, tracking_uri=tracking_uri)
        state = load_checkpoint(file)
        _check_pointed_run(os.fspath(ref), file, state)
        return [
            (file, _checkpoint_for_rank(state, file, r, ctx.world_size)) for r in range(ctx.world_size)
        ]

    return ctx.on_main(read_for_every_rank, scatter=True)


def _check_pointed_run(ref: str, file: Path, state: Mapping[str, Any]) -> None:
    """Refuse a checkpoint that the pointer of MLflow run ``ref`` names but another run wrote."""
    if Path(ref).exists() or not is_run_ref(ref):
        return
    run_id = ref[len("runs:/") :].split("/")[0] if ref.startswith("runs:/") else ref
    trainer = state.get("trainer")
    owner = trainer.get("run_id") if isinstance(trainer, Mapping) else None
    if owner != run_id:
        raise CheckpointError(
            f"MLflow run {run_id} points at the checkpoint {file}, which belongs to run {owner}: "
            "rl8 refused to resume another run into it. Pass the checkpoint's path instead"
        )


def _checkpoint_for_rank(
    state: dict[str, Any], file: Path, rank: int, world_size: int
) -> dict[str, Any]:
    """The checkpoint as rank ``rank`` loads it: rank 0's ``algo`` entry updated with its own."""
    info = state.get("distributed")
    saved = int(info["world_size"]) if isinstance(info, Mapping) else 1
    if isinstance(state.get("algo"), Mapping) and saved != world_size:
        raise CheckpointError(
            f"{file} was written by a run of {saved} rank(s) (data-parallel processes) but "
            f"this run has {world_size}: every rank resumes its own envs and RNG, so resume "
            + (
                "without torchrun"
                if saved == 1
                else f"with {saved} ranks in all, e.g. "
                f"torchrun --nproc_per_node={saved} -m rl8 train --resume ..."
            )
        )
    _check_actor_entries(state, file)
    out = {
        k: v for k, v in state.items() if k not in ("distributed", "actors")
    }  # the actors read their own
    if isinstance(info, Mapping):
        out["algo"] = {**state["algo"], **info["ranks"][rank]}
    return out


def checkpoint_for_actor(state: dict[str, Any], file: Path, rank: int) -> dict[str, Any]:
    """The loaded checkpoint ``state`` (of ``file``, named in messages) as actor rank ``rank`` loads
    it: the learners' entries, and as ``"actor"`` its own state or ``None``; a ``CheckpointError``
    for a job of other actors."""
    _check_actor_entries(state, file)
    saved = state.get("actors")
    out = {k: v for k, v in state.items() if k not in ("distributed", "actors")}
    out["actor"] = saved["ranks"].get(rank) if isinstance(saved, Mapping) else None
    return out


def _shape_of(value: Any) -> str:
    if not isinstance(value, Mapping):
        return repr(value)[:80]
    return "{" + ", ".join(f"{k!r}: {type(v).__name__}" for k, v in list(value.items())[:6]) + "}"


def _check_actor_entries(state: Mapping[str, Any], file: Path) -> None:
    """Refuse to resume a checkpoint's actor states in a job of other actors."""
    saved, roles = state.get("actors"), current_roles()
    if saved is None:
        return
    ranks = saved.get("ranks") if isinstance(saved, Mapping) else None
    if not (
        isinstance(ranks, Mapping)
        and all(isinstance(saved.get(k), int) for k in ("world_size", "actors"))
        and all(isinstance(r, int) and isinstance(e, Mapping) for r, e in ranks.items())
    ):
        raise CheckpointError(
            f"{file}: entry 'actors': expected {{'world_size': int, 'actors': int, 'ranks': {{rank (int): "
            f"state (dict)}}}}, got {type(saved).__name__} {_shape_of(saved)}"
        )
    if roles is None:
        return
    world_size, actors = int(saved["world_size"]), int(saved["actors"])
    if (world_size, actors) != (roles.world_size, roles.actors):
        raise CheckpointError(
            f"{file} holds the envs and RNG states of the {actors} actors of a job of {world_size} processes, "
            f"but this job has {roles.actors} actors of {roles.world_size}: every actor resumes its own envs, "
            f"so resume with the same, e.g. torchrun --nproc_per_node={world_size} -m rl8 train --resume ... "
            f"--actors {actors}"
        )
