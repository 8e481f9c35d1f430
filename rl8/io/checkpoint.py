"""Checkpoint files (``docs/checkpoints.md``): atomic writes of a dict of what
``torch.load(weights_only=True)`` reads back, and safe reads that never execute code."""

from __future__ import annotations

import collections
import contextlib
import errno
import os
import pickle
import pickletools
import re
import shutil
import struct
import uuid
import zipfile
import zlib
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch

from rl8.mlflow_http import bounded_requests
from rl8.mlflow_store import check_store_schema
from rl8.ppo.hparams import missing_cuda_device
from rl8.ppo.resolve import CheckpointError

__all__ = [
    "CHECKPOINT_POINTER_ARTIFACT",
    "FORMAT_KEY",
    "FORMAT_VERSION",
    "MAX_DOWNLOAD_BYTES",
    "STALE_TMP_SECONDS",
    "CheckpointError",
    "check_loadable",
    "download_artifact",
    "is_run_ref",
    "load_checkpoint",
    "load_torch_file",
    "max_download_bytes",
    "save_checkpoint",
]

try:  # POSIX: a writer holds a lock on its temporary file (see CheckpointManager)
    import fcntl
except ImportError:  # pragma: no cover - Windows, where an open file cannot be deleted
    fcntl = None  # type: ignore[assignment]

#: MLflow artifact (JSON) with the path and step of a run's latest checkpoint (for resuming).
CHECKPOINT_POINTER_ARTIFACT = "rl8/checkpoint.json"

#: Entry added to every saved dict (reserved); its value is the format version.
FORMAT_KEY = "__rl8_checkpoint__"
#: Version of the checkpoint format this rl8 writes (and the newest it reads).
FORMAT_VERSION = 1
#: Seconds a temporary file of a ``CheckpointManager`` stays untouched before a save removes it.
STALE_TMP_SECONDS = 60.0

_LEAF_TYPES = (int, float, bool, complex, str, bytes, type(None), torch.Size, torch.dtype, torch.device)
_CONTAINER_TYPES = (dict, collections.OrderedDict, list, tuple)


def check_loadable(value: Any, where: str, active: set[int]) -> None:
    """Raise ``TypeError`` when ``value`` holds something ``weights_only`` loading refuses.

    Args:
        value: The data to check (nested dicts, lists, tuples of tensors and plain values).
        where: Its name in messages (``"state"``).
        active: The ids of the containers being checked (to find cycles): ``set()``.
    """
    kind = type(value)
    if kind in _LEAF_TYPES or kind in (torch.Tensor, torch.nn.Parameter):
        return
    if kind in _CONTAINER_TYPES:
        if id(value) in active:
            raise TypeError(f"{where} contains itself (a reference cycle); a checkpoint must be a tree")
        active.add(id(value))
        is_dict = isinstance(value, dict)
        for key, item in value.items() if is_dict else enumerate(value):
            if is_dict and type(key) not in _LEAF_TYPES:
                raise TypeError(
                    f"{where} has a key {key!r} of type {type(key).__name__}; "
                    "keys must be str, int, float, bool or None"
                )
            check_loadable(item, f"{where}[{key!r}]", active)
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
    with contextlib.suppress(OSError):
        fd = os.open(directory, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def save_checkpoint(state: Mapping[str, Any], path: str | os.PathLike[str]) -> Path:
    """Write ``state`` to ``path`` atomically (a temporary file renamed onto it); returns ``path``.
    A value that ``weights_only`` loading refuses is a ``TypeError`` saying where.

    Args:
        state: A dict of tensors, plain values and nested dicts/lists/tuples of them.
        path: Destination file; its directory must exist. An existing file is replaced.
    """
    path = Path(path)
    if not isinstance(state, Mapping):
        raise TypeError(f"save_checkpoint: state must be a dict, got {type(state).__name__}")
    payload = {**state, FORMAT_KEY: FORMAT_VERSION}
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
        raise OSError(
            cause.errno, f"cannot write checkpoint {path}: {cause.strerror or cause}", str(path)
        ) from exc
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


_UNSAFE_PATTERN = re.compile(
    r"(Unsupported global: GLOBAL \S+|unsupported GLOBAL \S+|Trying to call reduce[^\n]*|"
    r"Can only create new object[^\n]*|Can only build[^\n]*)"
)


def _first_line(err: BaseException) -> str:
    text = str(err).strip().splitlines()
    return f"{type(err).__name__}: {text[0][:200]}" if text else type(err).__name__


def _pickle_globals(path: Path) -> list[str] | None:
    """The globals a plain pickle stream names (``["posix.system"]``), read without executing
    it; ``None`` when the file is not a complete pickle stream."""
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
    if isinstance(err, pickle.UnpicklingError):
        unsafe = _UNSAFE_PATTERN.search(str(err))
        names = None if unsafe else _pickle_globals(path)  # a whole pickle stream weights_only refused
        if unsafe or names is not None:
            what = (
                unsafe.group(0)
                if unsafe
                else f"a plain pickle, not a torch.save file, naming {names[:3]}"
            )
            return CheckpointError(
                f"{path} is not a safe rl8 checkpoint: loading it would need to run code or rebuild "
                f"objects named in the file ({what}), and rl8 refuses to execute code from a checkpoint "
                "(it loads with weights_only=True). Only load such a file with "
                "torch.load(weights_only=False) if you trust its source."
            )
    # torch raises UnpicklingError, RuntimeError, EOFError, KeyError, OSError... for bad bytes
    return CheckpointError(
        f"{path} is corrupt or truncated (not a readable torch file: {_first_line(err)})"
    )


def load_torch_file(path: str | os.PathLike[str], *, map_location: Any = "cpu") -> Any:
    """What a torch file at ``path`` holds, read as :func:`load_checkpoint` reads (regular file,
    CRC check of every zip entry, ``torch.load(weights_only=True)``), whoever wrote it (an rsl_rl
    checkpoint...); a :class:`CheckpointError` for a corrupt or unsafe file."""
    _check_device_available(map_location)
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(2, f"checkpoint file not found: {path}", str(path))
    if path.is_dir():
        raise IsADirectoryError(21, f"checkpoint path is a directory, not a file: {path}", str(path))
    if not path.is_file():  # a device (/dev/zero) or a pipe would be read forever
        raise CheckpointError(
            f"{path} is not a regular file (a device, a pipe or a socket); rl8 reads "
            "checkpoints and policy files only from regular files"
        )
    # Open the file ourselves so that real I/O errors (permissions...) surface as OSError; past
    # this point torch reports bad bytes with many exception types, OSError(EINVAL) included.
    with open(path, "rb") as file:
        _verify_entries(path, file)
        file.seek(0)
        try:
            return torch.load(file, map_location=map_location, weights_only=True)
        except Exception as err:
            raise _load_error(path, err) from err


def load_checkpoint(path: str | os.PathLike[str], *, map_location: Any = "cpu") -> dict[str, Any]:
    """The dict :func:`save_checkpoint` wrote to ``path``, read with ``torch.load(weights_only=True)``
    onto ``map_location`` (anything ``torch.load`` accepts) after a CRC check of every zip entry; a
    :class:`CheckpointError` for a corrupt, foreign, unsafe or too new file, an ``OSError`` if it
    cannot be read."""
    path = Path(path)
    state = load_torch_file(path, map_location=map_location)
    if not isinstance(state, dict) or FORMAT_KEY not in state:
        raise CheckpointError(
            f"{path} is a torch file but not an rl8 checkpoint (it has no "
            f"{FORMAT_KEY!r} entry; it was not written by save_checkpoint)"
        )
    version = state.pop(FORMAT_KEY)
    if type(version) is not int or version < 1:
        raise CheckpointError(f"{path} is not an rl8 checkpoint: invalid format version {version!r}")
    if version > FORMAT_VERSION:
        raise CheckpointError(
            f"{path} uses checkpoint format {version}, but this rl8 reads "
            f"formats up to {FORMAT_VERSION}; upgrade rl8 to load it"
        )
    return state


def _check_device_available(map_location: Any) -> None:
    if not isinstance(map_location, (str, torch.device)):
        return  # a dict or a function: torch.load applies it
    try:
        device = torch.device(map_location)
    except (RuntimeError, TypeError):
        return  # not a device name: torch.load says so
    problem = missing_cuda_device(device)
    if problem is not None:
        raise ValueError(
            f"load_checkpoint: map_location={str(map_location)!r} names a CUDA device, "
            f"but {problem}; load with map_location='cpu'"
        )


#: Errors of Python's zipfile on damaged archive bytes (EINVAL: a damaged offset to seek to).
_ZIP_ERRORS = (
    zipfile.BadZipFile,
    zlib.error,
    EOFError,
    ValueError,
    NotImplementedError,
    RuntimeError,
    struct.error,
)
#: The MS-DOS "directory" bit of a zip entry's external attributes (torch skips such entries).
_DOS_DIRECTORY = 0x10


def _verify_entries(path: Path, file: Any) -> None:
    """Read every entry of the zip archive and check it against its CRC-32 (other files are
    left to ``torch.load``). Entries must be plain files (torch reads a damaged "directory"
    flag as an empty entry) and stored, not compressed (a crafted entry could cost gigabytes).
    """
    if file.read(4) != b"PK\x03\x04":
        return
    file.seek(0)
    try:
        archive = zipfile.ZipFile(file)
    except (*_ZIP_ERRORS, OSError) as err:
        if isinstance(err, OSError) and err.errno not in (None, errno.EINVAL):
            raise
        raise CheckpointError(
            f"{path} is corrupt or truncated (its zip directory cannot be read: {_first_line(err)})"
        ) from err
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


_RUN_ID = re.compile(r"[0-9a-f]{32}")


def is_run_ref(ref: str) -> bool:
    """Whether ``ref`` names an MLflow run (a run id or a ``runs:/`` URI), not a path."""
    return ref.startswith("runs:/") or _RUN_ID.fullmatch(ref) is not None


#: The most bytes one download of a run's artifact or a model's folder may hold (``load_policy``
#: of a run id, ``runs:/`` or ``models:/`` URI, ``rl8 eval RUN_ID``, ``--resume RUN_ID``): a policy
#: or checkpoint holds megabytes. The variable ``RL8_MAX_DOWNLOAD_MB`` sets another limit.
MAX_DOWNLOAD_BYTES = 1024**3


def max_download_bytes() -> int:
    """The download limit in bytes: ``RL8_MAX_DOWNLOAD_MB`` (MiB, a number > 0) if set, else
    :data:`MAX_DOWNLOAD_BYTES`."""
    text = os.environ.get("RL8_MAX_DOWNLOAD_MB")
    if text is None:
        return MAX_DOWNLOAD_BYTES
    try:
        megabytes = float(text)
    except ValueError:
        megabytes = -1.0
    if not 0 < megabytes < float("inf"):
        raise ValueError(f"RL8_MAX_DOWNLOAD_MB must be a number of MiB > 0, got {text!r}")
    return int(megabytes * 1024**2)


def _model_location(ref: str, tracking_uri: str | None) -> str:
    """Where the folder of ``models:/ID``, ``models:/NAME/VERSION`` or ``models:/NAME@ALIAS`` is
    stored (the store at ``tracking_uri`` is also the registry)."""
    from mlflow import MlflowClient

    client = MlflowClient(tracking_uri, registry_uri=tracking_uri)
    name = ref[len("models:/") :].strip("/")
    if "@" in name:
        name, alias = name.split("@", 1)
        version = client.get_model_version_by_alias(name, alias).version
    elif "/" in name:
        name, version = name.split("/", 1)
    else:
        return client.get_logged_model(name).artifact_location
    return client.get_model_version_download_uri(name, version)


def _artifact_root(ref: str, artifact: str, tracking_uri: str | None) -> tuple[str, str]:
    """The artifact store URI and the path in it of what :func:`download_artifact` fetches."""
    from mlflow import MlflowClient

    if ref.startswith("models:/"):
        return _model_location(ref, tracking_uri), ""
    if ref.startswith("runs:/"):
        ref, _, artifact = ref[len("runs:/") :].strip("/").partition("/")
    return MlflowClient(tracking_uri).get_run(ref).info.artifact_uri, artifact


def _stored_bytes(root: str, path: str) -> int:
    """The bytes of the file or folder ``path`` of the artifact store at ``root``, as the store
    lists them, before anything is downloaded."""
    from mlflow.store.artifact.artifact_repository_registry import get_artifact_repository

    repo = get_artifact_repository(root)
    parent = path.rpartition("/")[0]
    same = [info for info in repo.list_artifacts(parent or None) if info.path == path]
    if path and same and not same[0].is_dir:
        return same[0].file_size or 0
    total, folders = 0, [path or None]
    while folders:
        for info in repo.list_artifacts(folders.pop()):
            if info.is_dir:
                folders.append(info.path)
            else:
                total += info.file_size or 0
    return total


def _local_bytes(path: Path) -> int:
    """The bytes of the file or folder ``path`` on disk."""
    files = [path] if path.is_file() else [p for p in path.rglob("*") if p.is_file()]
    return sum(p.stat().st_size for p in files)


def download_artifact(ref: str, artifact: str, tracking_uri: str | None, dst: str) -> Path:
    """Download one artifact of an MLflow run (``ref``: a run id or a ``runs:/`` URI), or the
    folder of a ``models:/`` URI (the registry is the tracking store), into ``dst``. Every request
    is held to the tracker's HTTP policy (:func:`~rl8.mlflow_http.bounded_requests`: seconds a
    request, retries), and a download larger than :func:`max_download_bytes` is refused before
    it starts (by the sizes the store lists) and after it ends (by the bytes written, which are
    removed). A failure is a ``FileNotFoundError``, but a SQLite store that a newer MLflow wrote
    is a :class:`~rl8.mlflow_store.StoreSchemaError`."""
    import mlflow.artifacts

    kind = "model" if ref.startswith("models:/") else "run"
    what = f"{artifact or 'the folder'!r} of MLflow {kind} {ref!r}"
    limit, local = max_download_bytes(), None
    try:
        with bounded_requests(tracking_uri):
            root, path = _artifact_root(ref, artifact, tracking_uri)
            stored = _stored_bytes(root, path)
            if stored <= limit:
                local = Path(
                    mlflow.artifacts.download_artifacts(
                        artifact_uri=f"{root.rstrip('/')}/{path}" if path else root, dst_path=dst
                    )
                )
                stored = max(stored, _local_bytes(local))
    except Exception as exc:
        uri = tracking_uri or mlflow.get_tracking_uri()
        check_store_schema(uri)
        raise FileNotFoundError(
            f"cannot download {what} from {uri!r}: "
            f"{str(exc).splitlines()[0] if str(exc) else type(exc).__name__}"
        ) from exc
    if stored > limit:
        if local is not None and local.is_dir():  # the store listed fewer bytes than it sent
            shutil.rmtree(local)
        elif local is not None:
            local.unlink()
        raise FileNotFoundError(
            f"refused to download {what}: it holds {stored / 1024**2:.3g} MiB, more than the limit of "
            f"{limit / 1024**2:.3g} MiB (RL8_MAX_DOWNLOAD_MB sets another; docs/security.md)"
        )
    return local
