"""Checkpoint files: atomic writes, safe reads, and a directory of numbered checkpoints.

This module only moves a ``dict`` between memory and disk; what the dict holds is the
Trainer's business (see ``docs/checkpoints.md``). A checkpoint holds nested dicts, lists and
tuples of tensors, ``torch.Size``, dtypes, devices, ``int``, ``float``, ``bool``, ``complex``,
``str``, ``bytes`` and ``None``: exactly what ``torch.load(..., weights_only=True)`` reads back
without executing code from the file. Anything else (numpy arrays, custom classes) is refused
when saving, naming where it is, rather than producing a file that cannot be loaded.
"""

from __future__ import annotations

import collections
import contextlib
import errno
import gc
import json
import os
import pickle
import pickletools
import re
import socket
import struct
import tempfile
import time
import uuid
import warnings
import weakref
import zipfile
import zlib
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch

from rl8.ppo.distributed import DistContext, current_roles
from rl8.ppo.hparams import missing_cuda_device
from rl8.ppo.resolve import CheckpointError

try:  # POSIX: a writer holds a lock on its temporary file (see CheckpointManager)
    import fcntl
except ImportError:  # pragma: no cover - Windows, where an open file cannot be deleted
    fcntl = None  # type: ignore[assignment]

__all__ = [
    "CHECKPOINT_DIR_LOCK", "CHECKPOINT_POINTER_ARTIFACT", "FORMAT_KEY", "FORMAT_VERSION", "STALE_TMP_SECONDS",
    "CheckpointDirError", "CheckpointDirLock", "CheckpointError", "CheckpointManager", "check_loadable",
    "check_writable_folder", "checkpoint_for_actor", "download_artifact", "is_run_ref", "load_checkpoint",
    "read_checkpoint", "resolve_checkpoint", "save_checkpoint",
]

#: MLflow artifact (JSON) with the path and step of a run's latest checkpoint (for resuming).
CHECKPOINT_POINTER_ARTIFACT = "rl8/checkpoint.json"

#: Entry added to every saved dict; its value is the format version. Reserved: a user entry
#: with this name is overwritten on save and removed on load.
FORMAT_KEY = "__rl8_checkpoint__"

#: Version of the checkpoint format this rl8 writes (and the newest it reads).
FORMAT_VERSION = 1

#: Seconds a temporary file of :class:`CheckpointManager` must be left untouched before its
#: next save removes it (when no live writer holds its lock).
STALE_TMP_SECONDS = 60.0


#: The lock file of a checkpoint folder (see :class:`CheckpointDirLock`).
CHECKPOINT_DIR_LOCK = ".rl8.lock"


class CheckpointDirError(ValueError):
    """A checkpoint folder cannot be used: it cannot be created or written, another live run
    writes there, or it holds another run's checkpoints (the message names the folder)."""


# ---- saving ---------------------------------------------------------------------------------

_LEAF_TYPES = (int, float, bool, complex, str, bytes, type(None), torch.Size, torch.dtype, torch.device)
_TENSOR_TYPES = (torch.Tensor, torch.nn.Parameter)
_DICT_TYPES = (dict, collections.OrderedDict)
_SEQUENCE_TYPES = (list, tuple)


def check_loadable(value: Any, where: str, active: set[int]) -> None:
    """Raise ``TypeError`` when ``value`` holds something ``weights_only`` loading refuses.

    Args:
        value: The data to check (nested dicts, lists, tuples of tensors and plain values).
        where: Its name in messages (``"state"``, ``"metadata"``).
        active: The ids of the containers being checked (to find reference cycles): ``set()``.
    """
    kind = type(value)
    if kind in _LEAF_TYPES or kind in _TENSOR_TYPES:
        return
    if kind in _DICT_TYPES or kind in _SEQUENCE_TYPES:
        if id(value) in active:
            raise TypeError(f"{where} contains itself (a reference cycle); a checkpoint must be a tree")
        active.add(id(value))
        if kind in _DICT_TYPES:
            for key, item in value.items():
                if type(key) not in _LEAF_TYPES:
                    raise TypeError(f"{where} has a key {key!r} of type {type(key).__name__}; "
                                    "keys must be str, int, float, bool or None")
                check_loadable(item, f"{where}[{key!r}]", active)
        else:
            for i, item in enumerate(value):
                check_loadable(item, f"{where}[{i}]", active)
        active.discard(id(value))
        return
    hint = ""
    if kind.__module__ == "numpy":
        hint = " Convert numpy values first: torch.from_numpy(array) for arrays, int(x)/float(x) for scalars."
    elif isinstance(value, torch.Tensor):
        hint = " Convert tensor subclasses to plain tensors (tensor.as_subclass(torch.Tensor))."
    elif hasattr(value, "state_dict"):
        hint = " Save its state_dict() instead of the object."
    raise TypeError(
        f"{where} is a {kind.__module__}.{kind.__qualname__}, which a checkpoint cannot hold "
        "(loading uses torch.load(weights_only=True), which only reads tensors, torch.Size, "
        "dtypes, devices, numbers, str, bytes, None and dicts/lists/tuples of them)." + hint
    )


def _fsync_directory(directory: Path) -> None:
    """Make a rename in ``directory`` durable (POSIX; a no-op where directories can't be opened)."""
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        with contextlib.suppress(OSError):
            os.fsync(fd)
    finally:
        os.close(fd)


def save_checkpoint(state: Mapping[str, Any], path: str | os.PathLike[str]) -> Path:
    """Write ``state`` to ``path`` atomically.

    ``torch.save`` writes a temporary file in the same directory (``.{name}.{random}.tmp``),
    fsynced, then renamed onto ``path``: a crash at any point leaves the old file or the new
    one, never a partial file (and removes the temporary file when it can).

    Args:
        state: A dict of tensors, numbers, strings, ``None``, ``torch.Size``, and nested
            dicts/lists/tuples of them. The entry :data:`FORMAT_KEY` is added to the saved copy
            (``state`` itself is not modified).
        path: Destination file; its directory must exist. An existing file is replaced.

    Returns:
        ``path`` as a :class:`~pathlib.Path`.

    Raises:
        TypeError: When ``state`` is not a dict or holds a value that
            ``torch.load(weights_only=True)`` could not read back (the message says where).
        FileNotFoundError: When the directory of ``path`` does not exist.
        OSError: When writing fails (a full disk: ``errno.ENOSPC``); the message names ``path``.
    """
    path = Path(path)
    if not isinstance(state, Mapping):
        raise TypeError(f"save_checkpoint: state must be a dict, got {type(state).__name__}")
    payload = dict(state)
    payload[FORMAT_KEY] = FORMAT_VERSION
    check_loadable(payload, "state", set())
    directory = path.parent
    if not directory.is_dir():
        raise FileNotFoundError(f"cannot save checkpoint {path}: directory {directory} does not exist")

    tmp = directory / f".{path.name}.{uuid.uuid4().hex[:12]}.tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_BINARY", 0), 0o666)
    try:
        if fcntl is not None:  # held until the file is closed: tells a live writer from a dead one
            fcntl.flock(fd, fcntl.LOCK_EX)
        with os.fdopen(fd, "wb") as file:
            torch.save(payload, file)
            file.flush()
            os.fsync(file.fileno())
        os.replace(tmp, path)
    except BaseException as exc:
        with contextlib.suppress(OSError):
            tmp.unlink()
        cause = _os_error_in(exc)
        if cause is None:
            raise
        # torch reports a failed write as RuntimeError("[enforce fail at inline_container...")
        raise OSError(cause.errno, f"cannot write checkpoint {path}: {cause.strerror or cause}", str(path)) from exc
    _fsync_directory(directory)
    return path


def _os_error_in(exc: BaseException) -> OSError | None:
    """The ``OSError`` that ``exc`` is or was raised while handling (torch wraps write errors)."""
    seen: set[int] = set()
    while exc is not None and id(exc) not in seen:
        if isinstance(exc, OSError) and exc.errno is not None:
            return exc
        seen.add(id(exc))
        exc = exc.__cause__ or exc.__context__
    return None


# ---- loading --------------------------------------------------------------------------------

_UNSAFE_PATTERN = re.compile(
    r"(Unsupported global: GLOBAL \S+|unsupported GLOBAL \S+|Trying to call reduce[^\n]*|"
    r"Can only create new object[^\n]*|Can only build[^\n]*)"
)


def _first_line(err: BaseException) -> str:
    text = str(err).strip().splitlines()
    return f"{type(err).__name__}: {text[0][:200]}" if text else type(err).__name__


def _pickle_globals(path: Path) -> list[str] | None:
    """The globals a plain pickle stream names (``["posix.system"]``), read without executing
    it; ``None`` when the file is not a complete pickle stream (random or damaged bytes)."""
    try:
        data = path.read_bytes()
        if not data.startswith(b"\x80"):  # PROTO: every pickle of protocol 2 and later
            return None
        names: list[str] = []
        strings: list[str] = []
        for opcode, arg, _ in pickletools.genops(data):
            if opcode.name == "GLOBAL":
                names.append(str(arg).replace(" ", "."))
            elif opcode.name == "STACK_GLOBAL" and len(strings) >= 2:
                names.append(".".join(strings[-2:]))
            elif isinstance(arg, str):
                strings.append(arg)
        return names
    except (ValueError, OSError):
        return None


def _load_error(path: Path, err: Exception) -> CheckpointError:
    """Turn what ``torch.load`` raised into a :class:`CheckpointError` that says what it means."""
    unsafe = _UNSAFE_PATTERN.search(str(err)) if isinstance(err, pickle.UnpicklingError) else None
    if unsafe:
        return CheckpointError(
            f"{path} is not a safe rl8 checkpoint: loading it would need to run code or rebuild "
            f"objects named in the file ({unsafe.group(0)}), and rl8 refuses to execute code "
            "from a checkpoint (it loads with weights_only=True). Only load such a file with "
            "torch.load(weights_only=False) if you trust its source."
        )
    names = _pickle_globals(path) if isinstance(err, pickle.UnpicklingError) else None
    if names is not None:  # a whole pickle stream that weights_only refused to read
        named = f"; it names {', '.join(names[:3])}" if names else ""
        return CheckpointError(
            f"{path} is not a safe rl8 checkpoint: it is a plain pickle (not a torch.save file) "
            f"that torch.load(weights_only=True) refuses to read{named}, and rl8 refuses to "
            "execute code from a checkpoint. Only load such a file with "
            "torch.load(weights_only=False) if you trust its source."
        )
    # torch raises UnpicklingError, RuntimeError, EOFError, KeyError, OSError... for bad bytes
    return CheckpointError(f"{path} is corrupt or truncated (not a readable torch file: {_first_line(err)})")


def load_checkpoint(path: str | os.PathLike[str], *, map_location: Any = "cpu") -> dict[str, Any]:
    """Read a checkpoint written by :func:`save_checkpoint`, without executing code from it
    (``torch.load(weights_only=True)`` only: loading an untrusted file cannot run code).

    Args:
        path: The checkpoint file.
        map_location: Where to put the tensors (``"cpu"``, ``"cuda:0"``, a ``torch.device``,
            or anything ``torch.load`` accepts).

    Returns:
        The saved dict, without the :data:`FORMAT_KEY` entry.

    Before ``torch.load`` the file's zip entries are read once and checked against the CRC-32
    each entry was written with, so that damaged bytes (a bit flip on disk or in a copy) are
    refused instead of loading as wrong numbers; this reads the file twice.

    Raises:
        FileNotFoundError: The file does not exist.
        OSError: The file cannot be opened or read (e.g. ``PermissionError``).
        ValueError: ``map_location`` names a device this machine does not have (no CUDA).
        CheckpointError: The file is corrupt or truncated (an entry fails its CRC check: the
            entry is named), is not an rl8 checkpoint, would need to execute code to be
            loaded, or was written by a newer rl8.
    """
    _check_device_available(map_location)
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(2, f"checkpoint file not found: {path}", str(path))
    if path.is_dir():
        raise IsADirectoryError(21, f"checkpoint path is a directory, not a file: {path}", str(path))
    # Open the file ourselves so that real I/O errors (permissions...) surface as OSError; past
    # this point torch reports bad bytes with many exception types, OSError(EINVAL) included.
    with open(path, "rb") as file:
        _verify_entries(path, file)
        file.seek(0)
        try:
            state = torch.load(file, map_location=map_location, weights_only=True)
        except Exception as err:
            raise _load_error(path, err) from err

    if not isinstance(state, dict) or FORMAT_KEY not in state:
        raise CheckpointError(f"{path} is a torch file but not an rl8 checkpoint (it has no "
                              f"{FORMAT_KEY!r} entry; it was not written by save_checkpoint)")
    version = state.pop(FORMAT_KEY)
    if type(version) is not int or version < 1:
        raise CheckpointError(f"{path} is not an rl8 checkpoint: invalid format version {version!r}")
    if version > FORMAT_VERSION:
        raise CheckpointError(f"{path} uses checkpoint format {version}, but this rl8 reads "
                              f"formats up to {FORMAT_VERSION}; upgrade rl8 to load it")
    return state


def _check_device_available(map_location: Any) -> None:
    """Raise ``ValueError`` when ``map_location`` names a CUDA device this machine lacks."""
    if not isinstance(map_location, (str, torch.device)):
        return  # a dict or a function: torch.load applies it
    try:
        device = torch.device(map_location)
    except (RuntimeError, TypeError):
        return  # not a device name: torch.load says so
    problem = missing_cuda_device(device)
    if problem is not None:
        raise ValueError(f"load_checkpoint: map_location={str(map_location)!r} names a CUDA device, "
                         f"but {problem}; load with map_location='cpu'")


#: Errors of Python's zipfile on damaged archive bytes (EINVAL: a damaged offset to seek to).
_ZIP_ERRORS = (zipfile.BadZipFile, zlib.error, EOFError, ValueError, NotImplementedError,
               RuntimeError, struct.error)
#: The MS-DOS "directory" bit of a zip entry's external attributes (torch skips such entries).
_DOS_DIRECTORY = 0x10


def _verify_entries(path: Path, file: Any) -> None:
    """Read every entry of the zip archive and check it against its CRC-32.

    A file that does not start like a zip archive is left to ``torch.load``, which names what it
    is. The entries are also checked to be plain files: torch reads a damaged "directory" flag
    as an empty entry without any error. Compressed entries are refused before anything is read:
    torch stores every entry as is, and decompressing a crafted entry could cost gigabytes.
    """
    if file.read(4) != b"PK\x03\x04":
        return
    file.seek(0)
    try:
        archive = zipfile.ZipFile(file)
    except (*_ZIP_ERRORS, OSError) as err:
        if isinstance(err, OSError) and err.errno not in (None, errno.EINVAL):
            raise
        raise CheckpointError(f"{path} is corrupt or truncated (its zip directory cannot be "
                              f"read: {_first_line(err)})") from err
    with archive:
        for info in archive.infolist():  # before reading any: a compressed entry may be a zip bomb
            if info.compress_type != zipfile.ZIP_STORED:
                method = zipfile.compressor_names.get(info.compress_type, str(info.compress_type))
                raise CheckpointError(
                    f"{path} is not an rl8 checkpoint as torch writes it: its entry "
                    f"{info.filename!r} is compressed ({method}), and torch never compresses "
                    "entries; rl8 refused to decompress it"
                )
        for info in archive.infolist():
            try:
                if info.is_dir() or info.external_attr & _DOS_DIRECTORY:
                    raise zipfile.BadZipFile("marked as a directory")
                with archive.open(info) as entry:
                    while entry.read(1 << 24):
                        pass
            except (*_ZIP_ERRORS, OSError) as err:
                if isinstance(err, OSError) and err.errno not in (None, errno.EINVAL):
                    raise
                raise CheckpointError(
                    f"{path} is corrupt: its entry {info.filename!r} fails the zip integrity check "
                    f"({_first_line(err)}); the bytes changed after the file was written (a disk "
                    "or copy error). Use an older checkpoint."
                ) from err


# ---- a directory of numbered checkpoints -----------------------------------------------------


class CheckpointManager:
    """Numbered checkpoints in one directory, keeping the most recent ones.

    Files are named ``{prefix}-{step:012d}.pt`` (e.g. ``checkpoint-000000100000.pt``), written
    atomically with :func:`save_checkpoint`. Only files matching this pattern are ever listed or
    deleted; anything else in the directory is left alone. Each save also removes the
    temporary files (``.{prefix}-{step}.pt.{random}.tmp``) that a killed writer left behind:
    those untouched for :data:`STALE_TMP_SECONDS` and, where the OS has file locks, not locked
    by a live writer (another process saving into the same directory keeps its own).

    Args:
        directory: Folder of the checkpoints; created (with parents) if missing.
        keep_last: How many checkpoints to keep (the highest steps); older ones are deleted
            after each save. ``None`` keeps all. An int >= 1.
        prefix: File name prefix; non-empty, without path separators.
    """

    def __init__(self, directory: str | os.PathLike[str], *, keep_last: int | None = 5,
                 prefix: str = "checkpoint") -> None:
        if keep_last is not None and (type(keep_last) is not int or keep_last < 1):
            raise ValueError(f"CheckpointManager: keep_last must be an int >= 1 or None, got {keep_last!r}")
        if not isinstance(prefix, str) or not prefix or "/" in prefix or "\\" in prefix:
            raise ValueError(f"CheckpointManager: prefix must be a non-empty str without path "
                             f"separators, got {prefix!r}")
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
        """Write ``state`` as the checkpoint of ``step``, then prune old checkpoints.

        Pruning keeps the ``keep_last`` highest steps and never deletes the file just written
        (even when ``step`` is lower than existing ones, e.g. after resuming from an older
        checkpoint).

        Args:
            state: See :func:`save_checkpoint`.
            step: Training progress the checkpoint belongs to (e.g. ``env/steps``), an int >= 0.

        Returns:
            The path written.
        """
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
        """Delete this manager's temporary files that no live writer holds (see the class)."""
        now = time.time()
        for entry in self.directory.iterdir():
            if not self._tmp_pattern.fullmatch(entry.name):
                continue
            try:
                if now - entry.stat().st_mtime < STALE_TMP_SECONDS:
                    continue  # possibly a writer between creating and locking it
                fd = os.open(entry, os.O_RDONLY)
            except OSError:
                continue
            try:
                if fcntl is not None:
                    try:
                        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    except OSError:
                        continue  # a live writer holds it
                entry.unlink()  # on Windows an open file cannot be deleted: OSError, kept
            except OSError:
                pass
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
        return (f"CheckpointManager({str(self.directory)!r}, keep_last={self.keep_last!r}, "
                f"prefix={self.prefix!r})")


# ---- one run per checkpoint folder ------------------------------------------------------------

#: The folders this process holds, by absolute path (``flock`` is per open file: this process
#: could not lock them a second time).
_held_locks: weakref.WeakValueDictionary[Path, CheckpointDirLock] = weakref.WeakValueDictionary()


def check_writable_folder(directory: str | os.PathLike[str]) -> Path:
    """Create ``directory`` (with parents) and write and remove a probe file in it.

    Returns:
        The folder, absolute.

    Raises:
        CheckpointDirError: It cannot be created (a file on its path) or written.
    """
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
    """``run 0a1b... (pid 123 on host)`` from a lock file's record."""
    run = record.get("run_id")
    who = f"run {run}" if run else "a run without MLflow tracking"
    ended = ", ended" if record.get("released") else ""
    return f"{who} (pid {record.get('pid', '?')} on {record.get('host', '?')}{ended})"


class CheckpointDirLock:
    """The claim of one run on its checkpoint folder, held until :meth:`release` (or until
    the process ends): two jobs never write, prune or resume each other's checkpoints.

    Claiming, before the first training step:

    1. creates the folder (with parents) and writes the lock file :data:`CHECKPOINT_DIR_LOCK`
       in it, so that a folder that cannot be created or written (a path under a file, a
       read-only disk) is an error now rather than after the run;
    2. locks that file (POSIX ``flock``, released by the OS when the process dies; elsewhere
       the process id it names is checked). A folder locked by a live process is refused, its
       run and process named. A record left by a process that died without releasing it is
       taken over, with a warning;
    3. refuses a folder that holds numbered checkpoints (``checkpoint-*.pt``) of another run:
       a new run there would replace and prune them. The checkpoints belong to this run when it
       resumes from one of them (``resumed_from`` in this folder) or when the lock file names
       this run's MLflow ``run_id``. Within one process, such a Trainer also takes the claim over
       from an open Trainer of the same run (a Trainer of another run is refused).

    :meth:`release` marks the record released and unlocks the file, which stays (naming the
    run whose checkpoints the folder holds); a record not marked released names a process
    that died.

    Args:
        directory: The checkpoint folder.
        run_id: The MLflow run id of the run claiming it, when known (``None``: a new run, or
            no tracking); see :meth:`set_run_id`.
        resumed_from: The checkpoint file this run resumes from, ``None`` for a new run.

    Raises:
        CheckpointDirError: The folder cannot be created or written, is locked by a live
            process, or holds another run's checkpoints.
    """

    def __init__(self, directory: str | os.PathLike[str], *, run_id: str | None = None,
                 resumed_from: str | os.PathLike[str] | None = None) -> None:
        self.directory = Path(directory).absolute()
        self.run_id = run_id
        self._host = socket.gethostname()
        self._fd: int | None = None
        self._path = path = self.directory / CHECKPOINT_DIR_LOCK
        holder = _held_locks.get(self.directory)
        if holder is not None and holder.held and not self._same_run(holder.run_id, run_id, resumed_from):
            gc.collect()  # a Trainer of this process that nothing references any more
            holder = _held_locks.get(self.directory)
        if holder is not None and holder.held:  # this process holds it already
            if not self._same_run(holder.run_id, run_id, resumed_from):
                raise self._busy({"run_id": holder.run_id, "pid": os.getpid(), "host": self._host})
            # the same run resumed in this process (a Trainer left open): the claim moves here
            fd, holder._fd, previous = holder._fd, None, {}
        else:
            fd = self._open_locked(path)
            try:
                previous = self._read(fd)
                if fcntl is None and self._alive(previous):
                    raise self._busy(previous)
                if not self._same_run(previous.get("run_id"), run_id, resumed_from):
                    self._check_no_checkpoints(previous)
            except BaseException:
                os.close(fd)
                raise
        try:
            self._write(fd)
        except BaseException:
            os.close(fd)
            raise
        self._fd = fd
        _held_locks[self.directory] = self
        if previous and not previous.get("released") and previous.get("pid") != os.getpid():
            warnings.warn(
                f"checkpoint_dir {self.directory} was locked by {_describe_owner(previous)}, whose "
                "process ended without releasing it (killed or crashed); this run takes it over",
                stacklevel=3,
            )

    def _open_locked(self, path: Path) -> int:
        """Open and lock the lock file; a file that a releasing owner removed meanwhile (a
        different file now, or none) is opened again."""
        while True:
            try:
                self.directory.mkdir(parents=True, exist_ok=True)
                fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o666)
            except OSError as exc:
                raise CheckpointDirError(
                    f"checkpoint_dir {self.directory} cannot be used for checkpoints: {exc.strerror or exc} "
                    f"({exc.filename or path}); choose a folder this process can write"
                ) from None
            try:
                if not self._lock(fd):
                    raise self._busy(self._read(fd))
                try:
                    same = os.stat(path).st_ino == os.fstat(fd).st_ino
                except FileNotFoundError:
                    same = False
            except BaseException:
                os.close(fd)
                raise
            if same:
                return fd
            os.close(fd)

    @staticmethod
    def _lock(fd: int) -> bool:
        if fcntl is None:
            return True
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return True
        except OSError:
            return False

    def _alive(self, record: Mapping[str, Any]) -> bool:
        """Whether the process a record names runs on this host (no file locks: Windows)."""
        pid = record.get("pid")
        if record.get("host") != self._host or not isinstance(pid, int) or pid == os.getpid():
            return False
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        except OSError:
            pass
        return True

    def _busy(self, record: Mapping[str, Any]) -> CheckpointDirError:
        mine = " (a Trainer of this process: close() it first)" if record.get("pid") == os.getpid() else ""
        return CheckpointDirError(
            f"checkpoint_dir {self.directory} is in use by {_describe_owner(record)}{mine}; two runs "
            "writing into one folder would overwrite and prune each other's checkpoints. Give this "
            "run another checkpoint_dir (e.g. --checkpoint-dir), or wait for that run to end"
        )

    def _same_run(self, owner: str | None, run_id: str | None, resumed_from: Any) -> bool:
        """Whether the run claiming the folder continues its owner's: it resumes from a
        checkpoint in the folder, or continues the MLflow run ``owner``."""
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
        try:
            os.lseek(fd, 0, os.SEEK_SET)
            data = os.read(fd, 1 << 16)
            record = json.loads(data) if data.strip() else {}
        except (OSError, ValueError):
            return {}
        return record if isinstance(record, dict) else {}

    def _write(self, fd: int, released: bool = False) -> None:
        record = {"run_id": self.run_id, "pid": os.getpid(), "host": self._host, "since": time.time(),
                  "released": released}
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

    def release(self) -> None:
        """Give the folder up (idempotent): the lock file records that the run released it
        (and still names the run: its checkpoints stay its own), then is unlocked."""
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


# ---- finding and reading a checkpoint to resume from ------------------------------------------


def resolve_checkpoint(ref: str | os.PathLike[str], *, tracking_uri: str | None = None) -> Path:
    """The checkpoint file named by a path, a folder (its latest) or an MLflow run id (through
    the run's :data:`CHECKPOINT_POINTER_ARTIFACT`).

    Args:
        ref: A checkpoint file, a folder of numbered checkpoints, or an MLflow run id.
        tracking_uri: The MLflow store of the run id; ``None``: MLflow's default.

    Raises:
        FileNotFoundError: Nothing found (the message says where it looked).
    """
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
        info = json.loads(pointer.read_text())
    found = Path(info["path"])
    if not found.is_file():
        raise FileNotFoundError(
            f"MLflow run {text} records its latest checkpoint at {found}, which does not "
            "exist on this machine; pass the checkpoint's path instead"
        )
    return found


def read_checkpoint(ref: str | os.PathLike[str], *, tracking_uri: str | None = None) -> tuple[Path, dict[str, Any]]:
    """Resolve (:func:`resolve_checkpoint`) and load a checkpoint, as this rank sees it.

    In data-parallel training rank 0 alone reads the file (and asks MLflow for a run id) and
    sends every rank its view (rank 0's entries updated with the rank's own), or its error.
    ``ref`` and ``tracking_uri``: as for :func:`resolve_checkpoint`.

    Returns:
        The file and its content as this rank loads it.

    Raises:
        CheckpointError: The checkpoint was written by another number of ranks (or as for
            :func:`load_checkpoint`).
    """
    ctx = DistContext()

    def read_for_every_rank() -> list[tuple[Path, dict[str, Any]]]:
        file = resolve_checkpoint(ref, tracking_uri=tracking_uri)
        state = load_checkpoint(file)
        return [(file, _checkpoint_for_rank(state, file, r, ctx.world_size)) for r in range(ctx.world_size)]

    return ctx.on_main(read_for_every_rank, scatter=True)


def _checkpoint_for_rank(state: dict[str, Any], file: Path, rank: int, world_size: int) -> dict[str, Any]:
    """The checkpoint as rank ``rank`` of ``world_size`` loads it: rank 0's ``algo`` entry
    updated with this rank's own (envs, RNG...); an error when the world size differs."""
    info = state.get("distributed")
    saved = int(info["world_size"]) if isinstance(info, Mapping) else 1
    if isinstance(state.get("algo"), Mapping) and saved != world_size:
        raise CheckpointError(
            f"{file} was written by a run of {saved} rank(s) (data-parallel processes) but "
            f"this run has {world_size}: every rank resumes its own envs and RNG, so resume "
            + ("without torchrun" if saved == 1 else f"with {saved} ranks in all, e.g. "
               f"torchrun --nproc_per_node={saved} -m rl8 train --resume ...")
        )
    _check_actor_entries(state, file)
    out = {k: v for k, v in state.items() if k not in ("distributed", "actors")}  # the actors read their own
    if isinstance(info, Mapping):
        out["algo"] = {**state["algo"], **info["ranks"][rank]}
    return out


def checkpoint_for_actor(state: dict[str, Any], file: Path, rank: int) -> dict[str, Any]:
    """The checkpoint as actor rank ``rank`` (``rl8 train --actors``) loads it: the learners'
    entries as written (rank 0's ``algo``, which holds the run's seed, counters and weights),
    and as ``"actor"`` its own state (the per-rank part of ``PPO.state_dict()`` and its own
    counters), or ``None`` when the file holds no actor states (written before rl8 saved them,
    or after the actors were told to stop).

    Raises:
        CheckpointError: The file holds actor states of a job with another number of actors
            or processes.
    """
    _check_actor_entries(state, file)
    saved = state.get("actors")
    out = {k: v for k, v in state.items() if k not in ("distributed", "actors")}
    out["actor"] = saved["ranks"].get(rank) if isinstance(saved, Mapping) else None
    return out


def _shape_of(value: Any) -> str:
    """A short description of ``value``'s keys and their types, for error messages."""
    if not isinstance(value, Mapping):
        return repr(value)[:80]
    return "{" + ", ".join(f"{k!r}: {type(v).__name__}" for k, v in list(value.items())[:6]) + "}"


def _check_actor_entries(state: Mapping[str, Any], file: Path) -> None:
    """Refuse to resume a checkpoint's actor states in a job of other actors (another number
    of actors, or of processes)."""
    saved, roles = state.get("actors"), current_roles()
    if saved is None:
        return
    ranks = saved.get("ranks") if isinstance(saved, Mapping) else None
    if not (isinstance(ranks, Mapping) and all(isinstance(saved.get(k), int) for k in ("world_size", "actors"))
            and all(isinstance(r, int) and isinstance(e, Mapping) for r, e in ranks.items())):
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


_RUN_ID = re.compile(r"[0-9a-f]{32}")


def is_run_ref(ref: str) -> bool:
    """Whether ``ref`` names an MLflow run (a 32-hex-digit run id or a ``runs:/`` URI), not a path."""
    return ref.startswith("runs:/") or _RUN_ID.fullmatch(ref) is not None


def download_artifact(ref: str, artifact: str, tracking_uri: str | None, dst: str) -> Path:
    """Download one artifact of an MLflow run (``ref``: a run id or a ``runs:/`` URI)."""
    import mlflow.artifacts

    where = {"artifact_uri": ref} if ref.startswith("runs:/") else {"run_id": ref, "artifact_path": artifact}
    try:
        local = mlflow.artifacts.download_artifacts(**where, tracking_uri=tracking_uri, dst_path=dst)
    except Exception as exc:
        uri = tracking_uri or mlflow.get_tracking_uri()
        raise FileNotFoundError(
            f"cannot download {artifact!r} of MLflow run {ref!r} from {uri!r}: "
            f"{str(exc).splitlines()[0] if str(exc) else type(exc).__name__}"
        ) from exc
    return Path(local)
