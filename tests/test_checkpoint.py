"""Checkpoint files: round-trips, atomic writes, refusing corrupt, foreign and unsafe files."""

from __future__ import annotations

import collections
import contextlib
import copy
import errno
import io
import json
import os
import pickle
import random
import re
import signal
import socket
import subprocess
import sys
import time
import warnings
import zipfile
from pathlib import Path

import numpy as np
import pytest
import torch
from hparams import SMALL
from launch import rl8_env
from mlflow.tracking import MlflowClient

from rl8 import PPO, Trainer, load_policy
from rl8.cli import main
from rl8.envs import CartPole, GymnasiumEnv
from rl8.io import checkpoint as checkpoint_module
from rl8.io import checkpoint_dir as checkpoint_dir_module
from rl8.io.checkpoint import (
    FORMAT_KEY,
    FORMAT_VERSION,
    CheckpointError,
    load_checkpoint,
    save_checkpoint,
)
from rl8.io.checkpoint_dir import (
    CHECKPOINT_DIR_LOCK,
    CheckpointDirError,
    CheckpointDirLock,
    CheckpointManager,
)


def trainer_like_state() -> dict:
    """A state with every kind of value the Trainer stores."""
    model = torch.nn.Linear(3, 2)
    optimizer = torch.optim.Adam(model.parameters(), lr=3e-4)
    model(torch.randn(4, 3)).sum().backward()
    optimizer.step()
    np_state = np.random.default_rng(0).bit_generator.state
    return {
        "model": model.state_dict(),
        "optimizer": optimizer.state_dict(),
        "counters": {"env/steps": 123_456, "algorithm/collects": 7},
        "hparams": {
            "lr": 3e-4,
            "clip": 0.2,
            "norm_adv": True,
            "activation": "tanh",
            "lr_schedule": None,
            "hidden": (64, 64),
            "huge": 2**70,
        },
        "rng": {
            "torch": torch.get_rng_state(),
            "python": random.getstate(),  # (version, tuple of ints, None)
            "numpy": np_state,  # PCG64: a dict of str and int
        },
        "shapes": [torch.Size([512, 4]), torch.Size([])],
        "dtype": torch.float32,
        "device": torch.device("cpu"),
        "normalizer": {"mean": torch.zeros(4, dtype=torch.float64), "var": torch.ones(4), "count": 1e-4},
        "mlflow_run_id": "0123456789abcdef",
        "stop": [{"type": "TimeLimit", "elapsed": 12.5}, {"nan": float("nan"), "inf": float("-inf")}],
        "blob": b"\x00\x01",
        "ordered": collections.OrderedDict(b=1, a=2),
        1: "int keys work",
    }


def assert_same(a, b, where="state"):
    assert type(a) is type(b), f"{where}: {type(a)} != {type(b)}"
    if isinstance(a, torch.Tensor):
        assert a.dtype == b.dtype and torch.equal(a, b), where
    elif isinstance(a, dict):
        assert list(a) == list(b), where
        for key in a:
            assert_same(a[key], b[key], f"{where}[{key!r}]")
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b), where
        for i, (x, y) in enumerate(zip(a, b)):
            assert_same(x, y, f"{where}[{i}]")
    elif isinstance(a, float) and a != a:
        assert b != b, where
    else:
        assert a == b, where


def test_round_trip_of_every_value_the_trainer_stores(tmp_path):
    state = trainer_like_state()
    path = save_checkpoint(state, str(tmp_path / "ckpt.pt"))
    assert path == tmp_path / "ckpt.pt"
    assert FORMAT_KEY not in state  # the caller's dict is not modified
    loaded = load_checkpoint(path)
    assert_same(state, loaded)


def test_restored_rng_states_reproduce_random_numbers(tmp_path):
    torch.manual_seed(1)
    random.seed(2)
    rng = np.random.default_rng(3)
    save_checkpoint(
        {"torch": torch.get_rng_state(), "python": random.getstate(), "numpy": rng.bit_generator.state},
        tmp_path / "rng.pt",
    )
    expected = (torch.rand(3), random.random(), rng.random())
    loaded = load_checkpoint(tmp_path / "rng.pt")
    torch.set_rng_state(loaded["torch"])
    random.setstate(loaded["python"])
    rng2 = np.random.default_rng()
    rng2.bit_generator.state = loaded["numpy"]
    assert torch.equal(torch.rand(3), expected[0])
    assert random.random() == expected[1]
    assert rng2.random() == expected[2]


def test_a_resaved_loaded_state_round_trips(tmp_path):
    save_checkpoint({"a": 1}, tmp_path / "a.pt")
    loaded = load_checkpoint(tmp_path / "a.pt")
    assert loaded == {"a": 1}
    save_checkpoint(loaded, tmp_path / "b.pt")
    assert load_checkpoint(tmp_path / "b.pt") == {"a": 1}


def test_map_location_is_passed_to_torch_load(tmp_path):
    save_checkpoint({"x": torch.ones(2)}, tmp_path / "x.pt")
    loaded = load_checkpoint(tmp_path / "x.pt", map_location=torch.device("meta"))
    assert loaded["x"].device.type == "meta"


def test_save_overwrites_an_existing_file(tmp_path):
    path = tmp_path / "c.pt"
    save_checkpoint({"v": 1}, path)
    save_checkpoint({"v": 2}, path)
    assert load_checkpoint(path) == {"v": 2}
    assert os.listdir(tmp_path) == ["c.pt"]


# ----------------------------------------------------------------------------- save checks


@pytest.mark.parametrize(
    "value, match",
    [
        (np.zeros(3), r"state\['bad'\] is a numpy.ndarray.*torch.from_numpy"),
        (np.float32(1.0), r"state\['bad'\] is a numpy.float32.*float\(x\)"),
        ({"deep": [1, torch.nn.ReLU()]}, r"state\['bad'\]\['deep'\]\[1\] is a torch.nn.*ReLU"),
        ({frozenset([1]): 1}, r"has a key frozenset"),
        (range(3), r"builtins.range"),
    ],
)
def test_save_refuses_values_that_could_not_be_loaded_safely(tmp_path, value, match):
    path = tmp_path / "bad.pt"
    with pytest.raises(TypeError, match=match):
        save_checkpoint({"good": 1, "bad": value}, path)
    assert os.listdir(tmp_path) == []


def test_save_refuses_cycles_and_non_dicts(tmp_path):
    cyclic: list = [1]
    cyclic.append(cyclic)
    with pytest.raises(TypeError, match="reference cycle"):
        save_checkpoint({"c": cyclic}, tmp_path / "c.pt")
    with pytest.raises(TypeError, match="state must be a dict, got list"):
        save_checkpoint([1, 2], tmp_path / "c.pt")
    shared = torch.zeros(2)  # the same object twice is fine (not a cycle)
    save_checkpoint({"a": [shared, shared], "b": (1,), "c": (1,)}, tmp_path / "ok.pt")


def test_save_into_a_missing_directory_names_it(tmp_path):
    with pytest.raises(FileNotFoundError, match="missing"):
        save_checkpoint({"a": 1}, tmp_path / "missing" / "c.pt")


# ------------------------------------------------------------------------------- atomicity


def test_a_crash_while_writing_keeps_the_previous_file(tmp_path, monkeypatch):
    path = tmp_path / "c.pt"
    save_checkpoint({"version": "old", "w": torch.arange(1000)}, path)
    before = path.read_bytes()

    real_save = torch.save

    def crashing_save(obj, file, *args, **kwargs):
        buffer = io.BytesIO()
        real_save(obj, buffer, *args, **kwargs)
        file.write(buffer.getvalue()[:100])  # half-written, then the process "dies"
        raise OSError("No space left on device")

    monkeypatch.setattr(torch, "save", crashing_save)
    with pytest.raises(OSError, match="No space left"):
        save_checkpoint({"version": "new", "w": torch.arange(1000)}, path)
    monkeypatch.undo()

    assert path.read_bytes() == before
    assert os.listdir(tmp_path) == ["c.pt"]  # no temporary file left behind
    assert load_checkpoint(path)["version"] == "old"


class FullDisk(io.FileIO):
    """A file on a disk with ``room`` bytes free: a bigger write fails with ENOSPC."""

    room = 3000

    def write(self, data):
        if self.tell() + memoryview(data).nbytes > self.room:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return super().write(data)


def test_a_full_disk_is_an_os_error_naming_the_file(tmp_path, monkeypatch):
    path = tmp_path / "c.pt"
    save_checkpoint({"version": "old"}, path)
    monkeypatch.setattr(os, "fdopen", lambda fd, mode: io.BufferedWriter(FullDisk(fd, "wb")))
    with pytest.raises(OSError) as info:  # torch itself raises RuntimeError("[enforce fail...")
        save_checkpoint({"version": "new", "w": torch.randn(10_000)}, path)
    monkeypatch.undo()
    assert type(info.value) is OSError and info.value.errno == errno.ENOSPC
    assert str(path) in str(info.value) and "No space left" in str(info.value)
    assert os.listdir(tmp_path) == ["c.pt"]
    assert load_checkpoint(path)["version"] == "old"


def test_a_crash_before_the_first_checkpoint_leaves_nothing(tmp_path, monkeypatch):
    def crashing_save(obj, file, *args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(torch, "save", crashing_save)
    with pytest.raises(KeyboardInterrupt):
        save_checkpoint({"a": 1}, tmp_path / "c.pt")
    assert os.listdir(tmp_path) == []


def test_the_file_is_fsynced_before_the_rename(tmp_path, monkeypatch):
    events = []
    real_fsync, real_replace = os.fsync, os.replace
    monkeypatch.setattr(os, "fsync", lambda fd: (events.append("fsync"), real_fsync(fd))[1])
    monkeypatch.setattr(os, "replace", lambda a, b: (events.append("replace"), real_replace(a, b))[1])
    save_checkpoint({"a": 1}, tmp_path / "c.pt")
    assert events[:2] == ["fsync", "replace"]


# --------------------------------------------------------------------------------- loading


def test_missing_file_is_file_not_found(tmp_path):
    with pytest.raises(FileNotFoundError, match="nope.pt"):
        load_checkpoint(tmp_path / "nope.pt")


@pytest.mark.parametrize("keep", [0, 10, 0.5, -10])
def test_truncated_file_is_a_checkpoint_error(tmp_path, keep):
    path = tmp_path / "c.pt"
    save_checkpoint({"w": torch.randn(1000)}, path)
    data = path.read_bytes()
    cut = int(len(data) * keep) if isinstance(keep, float) else keep
    path.write_bytes(data[:cut])
    with pytest.raises(CheckpointError, match=r"c\.pt is corrupt or truncated"):
        load_checkpoint(path)


# Seeded, so that every pytest-xdist worker collects the same parameters.
_NOISE = random.Random(0)


@pytest.mark.parametrize(
    "data",
    [
        _NOISE.randbytes(4096),
        b"\x80\x02" + _NOISE.randbytes(200),  # looks like a pickle
        b"PK\x03\x04" + _NOISE.randbytes(200),  # looks like a zip
        b"model: mlp\n",
    ],
    ids=["noise", "pickle-like", "zip-like", "yaml"],
)
def test_random_bytes_are_a_checkpoint_error(tmp_path, data):
    path = tmp_path / "c.pt"
    path.write_bytes(data)
    with pytest.raises(CheckpointError, match="corrupt or truncated"):
        load_checkpoint(path)


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without CUDA")
@pytest.mark.parametrize("device", ["cuda:0", "cuda", torch.device("cuda", 0)])
def test_a_cuda_map_location_without_cuda_says_so(tmp_path, device):
    path = save_checkpoint({"w": torch.zeros(3)}, tmp_path / "c.pt")
    with pytest.raises(ValueError, match="CUDA is not available") as info:
        load_checkpoint(path, map_location=device)
    assert not isinstance(info.value, CheckpointError)  # the file is fine


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_a_cuda_device_beyond_the_count_is_named(tmp_path):
    path = save_checkpoint({"w": torch.zeros(3)}, tmp_path / "c.pt")
    index = torch.cuda.device_count()
    with pytest.raises(
        ValueError,
        match=rf"map_location='cuda:{index}' names a CUDA device, but "
        rf"this machine has {index} CUDA device\(s\), "
        rf"cuda:0 to cuda:{index - 1}",
    ):
        load_checkpoint(path, map_location=f"cuda:{index}")


def test_a_cuda_device_beyond_the_count_is_named_without_a_gpu(tmp_path, monkeypatch):
    """The same message on a machine without CUDA, where torch is told there are two devices
    (the branch that needs a GPU also runs in CI)."""
    path = save_checkpoint({"w": torch.zeros(3)}, tmp_path / "c.pt")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    with pytest.raises(
        ValueError,
        match=r"map_location='cuda:2' names a CUDA device, but this "
        r"machine has 2 CUDA device\(s\), cuda:0 to cuda:1; "
        r"load with map_location='cpu'",
    ):
        load_checkpoint(path, map_location="cuda:2")


def flip(data: bytes, offset: int, length: int = 1) -> bytes:
    damaged = bytearray(data)
    for i in range(offset, min(offset + length, len(data))):
        damaged[i] ^= 0xFF
    return bytes(damaged)


def test_flipped_bytes_are_refused_or_harmless(tmp_path):
    """Every flip is refused naming the damaged entry, or (zip metadata nobody reads, such as
    a time stamp or padding) the file loads exactly as written: never wrong numbers."""
    state = trainer_like_state()
    state["weights"] = torch.randn(4000)
    path = save_checkpoint(state, tmp_path / "c.pt")
    data = path.read_bytes()
    offsets = sorted({*range(0, len(data), 97), len(data) // 2, len(data) - 30})
    refused, harmless = [], []
    for offset in offsets:
        damaged = tmp_path / "damaged.pt"
        damaged.write_bytes(flip(data, offset, 64 if offset == len(data) // 2 else 1))
        try:
            loaded = load_checkpoint(damaged)
        except CheckpointError as err:
            assert "damaged.pt is corrupt" in str(err)
            refused.append((offset, str(err)))
            continue
        assert_same(loaded, state)
        harmless.append(offset)
    middle = dict(refused)[len(data) // 2]  # the 64 bytes in the middle land in the weights
    assert "fails the zip integrity check" in middle and "archive/data/" in middle
    assert len(refused) > 0.9 * len(offsets), harmless


def test_a_damaged_directory_flag_is_refused(tmp_path):
    """torch reads an entry flagged as a directory as garbage without any error."""
    path = save_checkpoint({"w": torch.randn(1000)}, tmp_path / "c.pt")
    data = bytearray(path.read_bytes())
    record = data.rfind(b"PK\x01\x02")  # the last central-directory record
    data[record + 38] |= 0x10  # external attributes: MS-DOS directory bit
    path.write_bytes(bytes(data))
    with pytest.raises(CheckpointError, match="entry '.*' fails the zip integrity check"):
        load_checkpoint(path)


def test_a_compressed_entry_is_refused_before_it_is_read(tmp_path):
    """torch never compresses entries; a DEFLATE entry could be a zip bomb."""
    path = save_checkpoint({"w": torch.randn(10)}, tmp_path / "c.pt")
    with zipfile.ZipFile(path, "a") as archive:  # 16 MiB of zeros in about 16 KiB
        archive.writestr("c/bomb", bytes(16 << 20), compress_type=zipfile.ZIP_DEFLATED)
    assert path.stat().st_size < 100_000
    with pytest.raises(
        CheckpointError,
        match=r"c.pt is not an rl8 checkpoint as torch writes it: "
        r"its entry 'c/bomb' is compressed \(deflate\)",
    ):
        load_checkpoint(path)


def test_a_checkpoint_error_is_caught_as_a_value_error(tmp_path):
    path = tmp_path / "garbage.pt"
    path.write_bytes(b"not a checkpoint")
    with pytest.raises(ValueError, match="garbage.pt") as info:
        load_checkpoint(path)
    assert type(info.value) is CheckpointError


@pytest.mark.parametrize("obj", [{"model": torch.zeros(2)}, [1, 2], torch.zeros(3)])
def test_a_foreign_torch_file_is_not_an_rl8_checkpoint(tmp_path, obj):
    path = tmp_path / "foreign.pt"
    torch.save(obj, path)
    with pytest.raises(CheckpointError, match="foreign.pt is a torch file but not an rl8 ch"):
        load_checkpoint(path)


def test_a_newer_format_is_a_clear_error(tmp_path):
    path = tmp_path / "future.pt"
    torch.save({FORMAT_KEY: FORMAT_VERSION + 1, "a": 1}, path)
    with pytest.raises(CheckpointError, match=f"format {FORMAT_VERSION + 1}.*upgrade rl8"):
        load_checkpoint(path)


def test_an_invalid_format_version_is_an_error(tmp_path):
    path = tmp_path / "odd.pt"
    torch.save({FORMAT_KEY: "1"}, path)
    with pytest.raises(CheckpointError, match="invalid format version"):
        load_checkpoint(path)


class Malicious:
    """Unpickling this creates a file: the proof that code from the file ran."""

    def __init__(self, target: str) -> None:
        self.target = target

    def __reduce__(self):
        return (os.mkdir, (self.target,))


class Innocent:
    """A custom class: unpickling it needs a global, which weights_only refuses."""

    def __init__(self) -> None:
        self.x = 1


@pytest.mark.filterwarnings("ignore:Detected pickle protocol")  # torch, on protocols 4 and 5
@pytest.mark.parametrize("how", ["torch", "pickle", "pickle-4", "pickle-default"])
def test_a_malicious_file_is_refused_without_running_its_code(tmp_path, how):
    marker = tmp_path / "pwned"
    path = tmp_path / "evil.pt"
    payload = {FORMAT_KEY: FORMAT_VERSION, "model": Malicious(str(marker))}
    if how == "torch":
        torch.save(payload, path)
    else:
        protocol = {"pickle": 2, "pickle-4": 4, "pickle-default": None}[how]
        path.write_bytes(pickle.dumps(payload, protocol=protocol))
    with pytest.raises(
        CheckpointError, match="not a safe rl8 checkpoint.*refuses to execute code"
    ) as info:
        load_checkpoint(path)
    assert "evil.pt" in str(info.value) and "mkdir" in str(info.value)
    assert not marker.exists()


def test_a_file_with_custom_classes_is_refused(tmp_path):
    path = tmp_path / "custom.pt"
    torch.save({FORMAT_KEY: FORMAT_VERSION, "obj": Innocent()}, path)
    with pytest.raises(CheckpointError, match="Innocent.*refuses to execute code"):
        load_checkpoint(path)


def test_load_uses_weights_only(tmp_path, monkeypatch):
    save_checkpoint({"a": 1}, tmp_path / "c.pt")
    seen = {}
    real_load = torch.load

    def spy(*args, **kwargs):
        seen.update(kwargs)
        return real_load(*args, **kwargs)

    monkeypatch.setattr(torch, "load", spy)
    load_checkpoint(tmp_path / "c.pt")
    assert seen["weights_only"] is True and seen["map_location"] == "cpu"


# --------------------------------------------------------------------------------- manager


def test_manager_creates_the_directory_and_names_files(tmp_path):
    manager = CheckpointManager(tmp_path / "runs" / "ckpts", keep_last=None)
    assert manager.directory.is_dir()
    assert manager.latest() is None and manager.list() == [] and manager.load_latest() is None
    path = manager.save({"step": 100}, step=100)
    assert path.name == "checkpoint-000000000100.pt"
    assert manager.step_of(path) == 100
    assert manager.load_latest() == {"step": 100}


def test_manager_keeps_the_last_n_and_leaves_other_files_alone(tmp_path):
    manager = CheckpointManager(tmp_path, keep_last=3)
    others = [
        "notes.txt",
        "checkpoint-12.pt",
        "checkpoint-000000000001.pt.bak",
        "other-000000000001.pt",
        "model.pt",
    ]
    for name in others:
        (tmp_path / name).write_text("keep me")
    for step in [10, 20, 30, 40, 50]:
        manager.save({"step": step}, step)
    assert [p.name for p in manager.list()] == [
        "checkpoint-000000000030.pt",
        "checkpoint-000000000040.pt",
        "checkpoint-000000000050.pt",
    ]
    assert manager.latest() == tmp_path / "checkpoint-000000000050.pt"
    for name in others:
        assert (tmp_path / name).read_text() == "keep me"


def test_manager_sorts_by_step_not_by_name_or_time(tmp_path):
    manager = CheckpointManager(tmp_path, keep_last=None)
    for step in [10**13, 5, 10**12, 7]:  # more than 12 digits still sorts numerically
        manager.save({"step": step}, step)
    assert [manager.step_of(p) for p in manager.list()] == [5, 7, 10**12, 10**13]
    assert manager.load_latest() == {"step": 10**13}


def test_manager_never_deletes_the_checkpoint_it_just_wrote(tmp_path):
    manager = CheckpointManager(tmp_path, keep_last=2)
    manager.save({"step": 100}, 100)
    manager.save({"step": 200}, 200)
    path = manager.save({"step": 50}, 50)  # e.g. resumed from an older checkpoint
    assert path.exists()
    assert [manager.step_of(p) for p in manager.list()] == [50, 100, 200]
    manager.save({"step": 60}, 60)  # the 2 highest steps, plus the file just written
    assert [manager.step_of(p) for p in manager.list()] == [60, 100, 200]
    manager.save({"step": 300}, 300)
    assert [manager.step_of(p) for p in manager.list()] == [200, 300]


def test_manager_separate_prefixes_do_not_interfere(tmp_path):
    best = CheckpointManager(tmp_path, keep_last=1, prefix="best")
    regular = CheckpointManager(tmp_path, keep_last=1)
    best.save({"a": 1}, 1)
    regular.save({"a": 2}, 2)
    regular.save({"a": 3}, 3)
    assert [p.name for p in best.list()] == ["best-000000000001.pt"]
    assert [p.name for p in regular.list()] == ["checkpoint-000000000003.pt"]


def tmp_file_of(manager, step, age=0.0):
    """A temporary file as save_checkpoint names it, last modified ``age`` seconds ago."""
    path = manager.directory / f".{manager.path_for(step).name}.{os.urandom(6).hex()}.tmp"
    path.write_bytes(b"half a checkpoint")
    stamp = time.time() - age
    os.utime(path, (stamp, stamp))
    return path


def test_manager_removes_stale_temporary_files_of_its_own(tmp_path):
    manager = CheckpointManager(tmp_path)
    old = tmp_file_of(manager, 100, age=checkpoint_module.STALE_TMP_SECONDS + 5)
    fresh = tmp_file_of(manager, 200)  # a writer may have just created it
    other = tmp_file_of(CheckpointManager(tmp_path, prefix="best"), 100, age=3600)
    unrelated = tmp_path / ".notes.tmp"
    unrelated.write_text("mine")
    manager.save({"a": 1}, step=300)
    assert not old.exists()
    assert fresh.exists() and other.exists() and unrelated.exists()


@pytest.mark.slow
@pytest.mark.skipif(not hasattr(os, "fork"), reason="file locks: POSIX")
def test_manager_keeps_the_temporary_file_of_a_live_writer_and_removes_it_after_kill_9(tmp_path):
    """A writer in another process, stuck in torch.save: its file is kept however old while the
    process lives (it holds the file's lock), and removed on the next save after kill -9."""
    writer = subprocess.Popen(
        [
            sys.executable,
            "-c",
            f"""
import time, torch
from rl8.io.checkpoint_dir import CheckpointManager
def stuck(obj, file, *args, **kwargs):
    file.write(b"partial"); file.flush(); print("writing", flush=True); time.sleep(60)
torch.save = stuck
CheckpointManager({str(tmp_path)!r}).save({{"a": 1}}, step=100)
""",
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert writer.stdout.readline() == "writing\n"
        (tmp,) = tmp_path.glob(".checkpoint-000000000100.pt.*.tmp")
        stamp = time.time() - 3600
        os.utime(tmp, (stamp, stamp))
        manager = CheckpointManager(tmp_path)
        manager.save({"a": 2}, step=200)
        assert tmp.exists()  # a live writer holds it
    finally:
        writer.send_signal(signal.SIGKILL)
        writer.wait()
    assert tmp.exists()  # kill -9 leaves it behind
    manager.save({"a": 3}, step=300)
    assert not tmp.exists()
    assert [p.name for p in tmp_path.iterdir()] == sorted(p.name for p in manager.list())


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"keep_last": 0}, "keep_last must be an int >= 1 or None, got 0"),
        ({"keep_last": 2.0}, "keep_last must be an int >= 1 or None, got 2.0"),
        ({"prefix": ""}, "prefix must be a non-empty str"),
        ({"prefix": "a/b"}, "without path separators"),
    ],
)
def test_manager_validation(tmp_path, kwargs, match):
    with pytest.raises(ValueError, match=match):
        CheckpointManager(tmp_path, **kwargs)


@pytest.mark.parametrize("step", [-1, 1.5, True, "10"])
def test_manager_rejects_bad_steps(tmp_path, step):
    with pytest.raises(ValueError, match="step must be an int >= 0"):
        CheckpointManager(tmp_path).save({}, step)


def test_module_exports():
    assert set(checkpoint_module.__all__) >= {"save_checkpoint", "load_checkpoint", "CheckpointError"}
    assert "CheckpointManager" in checkpoint_dir_module.__all__


@pytest.mark.parametrize("dangling", [False, True])
def test_a_lock_file_that_is_a_symlink_is_refused_and_never_followed(tmp_path, dangling):
    target = tmp_path / "precious.txt"
    if not dangling:
        target.write_text("keep me")
    (tmp_path / "ck").mkdir()
    (tmp_path / "ck" / CHECKPOINT_DIR_LOCK).symlink_to(target)
    with pytest.raises(CheckpointDirError, match="is a symbolic link, which rl8 never follows"):
        CheckpointDirLock(tmp_path / "ck")
    assert target.read_text() == "keep me" if not dangling else not target.exists()


def test_a_lock_file_that_is_not_a_regular_file_is_refused(tmp_path):
    (tmp_path / "ck").mkdir()
    os.mkfifo(tmp_path / "ck" / CHECKPOINT_DIR_LOCK)
    with pytest.raises(CheckpointDirError, match="is not a regular file"):
        CheckpointDirLock(tmp_path / "ck")


def _lock_record(folder: Path, **record) -> None:
    folder.mkdir(exist_ok=True)
    (folder / CHECKPOINT_DIR_LOCK).write_text(json.dumps({"run_id": "r" * 32, "since": 0.0, **record}))


@pytest.mark.parametrize(
    "content",
    ["[" * 100_000 + "]" * 100_000, '{"pid": 1' + " " * 5000 + "}", "{not json"],
    ids=["deep", "long", "not-json"],
)
def test_a_lock_file_that_holds_no_rl8_record_is_taken_over_with_one_line(tmp_path, content):
    (tmp_path / "ck").mkdir()
    (tmp_path / "ck" / CHECKPOINT_DIR_LOCK).write_text(content)
    with pytest.warns(
        UserWarning, match=r"was locked by an unknown run \(the lock file holds no record of rl8's\)"
    ):
        lock = CheckpointDirLock(tmp_path / "ck")
    assert json.loads((tmp_path / "ck" / CHECKPOINT_DIR_LOCK).read_text())["pid"] == os.getpid()
    lock.release()


@contextlib.contextmanager
def _held_by_another_process(lock: Path):
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import fcntl, os, time\n"
            f"fcntl.flock(os.open({str(lock)!r}, os.O_RDWR), fcntl.LOCK_EX)\n"
            "print('held', flush=True)\ntime.sleep(60)",
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout.readline() == "held\n"
        yield
    finally:
        holder.kill()
        holder.wait()


@pytest.mark.parametrize("released", [True, False])
def test_a_lock_held_by_a_live_process_that_is_not_the_named_run_says_so(tmp_path, released):
    folder = tmp_path / "ck"
    # a run that released the folder, or one that ended long ago (past Linux's default pid_max)
    _lock_record(
        folder, pid=os.getpid() if released else 2**22 - 1, host=socket.gethostname(), released=released
    )
    with (
        _held_by_another_process(folder / CHECKPOINT_DIR_LOCK),
        pytest.raises(CheckpointDirError) as raised,
    ):
        CheckpointDirLock(folder)
    fate = ", ended))" if released else "), which has ended)"
    assert f"is locked by a live process (not the one its lock file names, run {'r' * 32} (pid" in str(
        raised.value
    )
    assert f"{fate}; rl8 never writes into a folder another process holds" in str(raised.value)
    assert "is in use by" not in str(raised.value)
    (folder / CHECKPOINT_DIR_LOCK).write_text("[1]")
    with (
        _held_by_another_process(folder / CHECKPOINT_DIR_LOCK),
        pytest.raises(
            CheckpointDirError,
            match=r"is locked by a live process \(its lock file holds no record of rl8's\)",
        ),
    ):
        CheckpointDirLock(folder)


@pytest.mark.parametrize(
    "where, fate",
    [
        ("alive", "whose process is alive but no longer holds the lock"),
        (
            "elsewhere",
            r"which no longer holds the lock \(whether its process still runs is not known here\)",
        ),
        ("ended", r"whose process ended without releasing it \(killed or crashed\)"),
    ],
)
def test_a_lock_taken_over_says_what_is_known_of_its_owner(tmp_path, where, fate):
    pid = {"alive": os.getppid(), "elsewhere": os.getppid(), "ended": 2**22 - 1}[where]
    host = "another-host" if where == "elsewhere" else socket.gethostname()
    _lock_record(tmp_path / "ck", pid=pid, host=host, released=False)
    with pytest.warns(
        UserWarning,
        match=rf"was locked by run r{{32}} \(pid {pid} on {host}\), {fate}; this run takes it over",
    ):
        CheckpointDirLock(tmp_path / "ck").release()


def _run_with_pointer(content: str) -> str:
    client = MlflowClient()
    run = client.create_run(client.create_experiment("pointers")).info.run_id
    Path("checkpoint.json").write_text(content)
    client.log_artifact(run, "checkpoint.json", "rl8")
    return run


@pytest.mark.parametrize(
    "content, words",
    [
        ("{not json", "must be a JSON object"),
        ('["a"]', "must be a JSON object"),
        (
            '{"path": "../elsewhere/checkpoint-000000000001.pt"}',
            "absolute path of a checkpoint, without '..'",
        ),
        ('{"path": "/tmp/../etc/checkpoint-000000000001.pt"}', "without '..'"),
        ("[" * 100000 + "]" * 100000, "must be a JSON object"),
    ],
    ids=["not-json", "a-list", "relative", "dotdot", "deep"],
)
def test_a_malformed_or_escaping_checkpoint_pointer_is_refused(migrated_store, content, words):
    run = _run_with_pointer(content)
    with pytest.raises(CheckpointError, match=re.escape(words)):
        Trainer.from_checkpoint(run)


def test_a_pointer_to_another_runs_checkpoint_is_refused(migrated_store, tmp_path, capsys):
    with Trainer(
        PPO(CartPole, num_envs=4, horizon=4, sgd_minibatch_size=16),
        tracking=False,
        progress=False,
        checkpoint_dir=tmp_path / "other",
    ) as trainer:
        written = trainer.save_checkpoint()
    run = _run_with_pointer(json.dumps({"path": str(written), "env/steps": 0}))
    with pytest.raises(
        CheckpointError, match=f"points at the checkpoint {written}, which belongs to run None"
    ):
        Trainer.from_checkpoint(run)
    assert main(["train", "--resume", run]) != 0
    assert "rl8 refused to resume another run into it" in capsys.readouterr().err


@pytest.mark.parametrize(
    "field, value, words",
    [
        (
            "optimizer_cls",
            "torch.optim.Optimizer",
            "hparam optimizer_cls = 'torch.optim.Optimizer', which is the class "
            "torch.optim.optimizer.Optimizer, not a torch.optim.Optimizer subclass",
        ),
        (
            "optimizer_cls",
            "torch.optim.LBFGS",
            "do not build: hparam optimizer_kwargs: torch.optim.lbfgs.LBFGS refused "
            "{'eps': 1e-05} (LBFGS.__init__() got an unexpected keyword argument 'eps')",
        ),
        (
            "optimizer_kwargs",
            {"betas": "x"},
            "hparam optimizer_kwargs: torch.optim.adam.Adam refused {'betas': 'x'}",
        ),
        (
            "model_config",
            {"hiddens": "abc"},
            "model_config hiddens: expected a sequence of ints >= 1, got 'abc'",
        ),
        (
            "env_kwargs",
            {"env": "CartPole-v1", "wrappers": ["gymnasium.wrappers.ClipAction"]},
            "env env_kwargs['wrappers'] must be empty or None in a file (a wrapper is a callable, which a file cannot hold)",
        ),
    ],
)
def test_resuming_stored_hparams_that_do_not_build_is_one_line(tmp_path, capsys, field, value, words):
    algo = PPO(
        GymnasiumEnv, env_kwargs={"env": "CartPole-v1"}, num_envs=2, horizon=4, sgd_minibatch_size=8
    )
    with Trainer(algo, tracking=False, progress=False, checkpoint_dir=tmp_path / "ck") as trainer:
        state = load_checkpoint(trainer.save_checkpoint())
    state["algo"]["hparams"][field] = value
    bad = save_checkpoint(state, tmp_path / "bad.pt")
    with pytest.raises(CheckpointError, match=re.escape(f"{bad}: ") + ".*" + re.escape(words)):
        Trainer.from_checkpoint(bad, tracking=False, progress=False, checkpoint_dir=tmp_path / "again")
    assert main(["train", "--resume", str(bad), "--checkpoint-dir", str(tmp_path / "cli")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("rl8: error: ") and words in err and err.count("\n") == 1, err


@pytest.mark.slow
def test_a_folder_written_by_a_live_process_is_refused_and_taken_over_once_it_died(tmp_path):
    folder = tmp_path / "shared"
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys\nfrom rl8.io.checkpoint_dir import CheckpointDirLock\n"
            f"lock = CheckpointDirLock({str(folder)!r}, run_id='a' * 32)\nprint('held', flush=True)\n"
            "sys.stdin.read()",
        ],
        env=rl8_env(),
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout.readline().strip() == "held"
        with pytest.raises(
            CheckpointDirError, match=rf"{folder} is in use by run a{{32}} \(pid {holder.pid} on "
        ):
            CheckpointDirLock(folder)
    finally:
        holder.kill()  # no release: the lock file stays, naming a dead process
        holder.wait()
    assert (folder / CHECKPOINT_DIR_LOCK).is_file()
    with pytest.warns(
        UserWarning, match=rf"was locked by run a{{32}} \(pid {holder.pid} .*ended without releasing"
    ):
        lock = CheckpointDirLock(folder)
    lock.release()
    assert json.loads((folder / CHECKPOINT_DIR_LOCK).read_text())["released"] is True
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a released folder is taken without a warning
        CheckpointDirLock(folder).release()


def _small_trainer(**options):
    return Trainer(PPO(CartPole, **SMALL), progress=False, **options)


def test_an_older_checkpoint_without_a_newer_hparam_resumes_from_the_cli_as_from_python(
    tmp_path, capsys
):
    trainer = _small_trainer(checkpoint_dir=tmp_path / "ck", tracking=False)
    trainer.step()
    path = trainer.save_checkpoint()
    trainer.close()
    state = load_checkpoint(path)
    for newer in ("horizons_per_env_reset", "seqs_per_state_reset"):  # defaults -1: "given: -1"
        del state["algo"]["hparams"][newer]
    save_checkpoint(state, path)
    Trainer.from_checkpoint(path, progress=False).close()
    code = main(["train", "--resume", str(path), "--max-steps", "256", "--quiet"])
    assert code == 0, capsys.readouterr().err
    # a value given that differs from the default the checkpoint implies is still an error
    assert main(["train", "--resume", str(path), "--set", "horizons_per_env_reset=2", "--quiet"]) == 2
    assert "horizons_per_env_reset (checkpoint: -1, given: 2)" in capsys.readouterr().err


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """A policy file and a Trainer checkpoint of CartPole, and their content."""
    from rl8 import PPO, Trainer, save_policy
    from rl8.envs import CartPole
    from rl8.io.checkpoint import load_checkpoint

    folder = tmp_path_factory.mktemp("saved")
    algo = PPO(CartPole, **SMALL)
    policy = save_policy(algo.policy, folder / "policy.pt", env={"spec": "rl8.envs.CartPole"})
    with Trainer(algo, tracking=False, checkpoint_dir=folder / "ck", progress=False) as trainer:
        checkpoint = trainer.save_checkpoint()
    return {"policy": load_checkpoint(policy), "checkpoint": load_checkpoint(checkpoint)}


def _first_weight(state):
    return next(iter(state))


def _fill(value):
    return lambda d, weight: d["state_dict"][weight].fill_(value)


def _wrong_shape(d, weight):
    d["state_dict"][weight] = torch.zeros(3, 3)


def _set(entry, value):
    return lambda d, weight: d.__setitem__(entry, value)


#: (what, how the policy description is changed (given it and its first weight's name), the error)
BAD_POLICIES = [
    (
        "weights nan",
        _fill(float("nan")),
        r"the policy's weights hold NaN or inf: state_dict\['{weight}'\]",
    ),
    (
        "weights inf",
        _fill(float("inf")),
        r"the policy's weights hold NaN or inf: state_dict\['{weight}'\]",
    ),
    (
        "wrong shape",
        _wrong_shape,
        r"entry 'state_dict' does not match the model .*size mismatch for {weight}",
    ),
    (
        "weights not a dict",
        _set("state_dict", [1, 2]),
        "entry 'state_dict' must be a dict of tensors by name, got list",
    ),
    (
        "model_config not a dict",
        _set("model_config", [64, 64]),
        "entry 'model_config' must be a dict, got list",
    ),
    (
        "model_config bad",
        _set("model_config", {"hiddens": "wide"}),
        "cannot be built .*model_config hiddens: expected a sequence of ints",
    ),
    (
        "observations 2**30",
        lambda d, weight: d["observation_space"].__setitem__("shape", [2**30]),
        r"entry 'observation_space': the space declares 1073741824 elements, more than rl8 loads "
        r"\(MAX_SPACE_ELEMENTS = 16777216\)",
    ),
    (
        "actions 2**30",
        lambda d, weight: d["action_space"].__setitem__("n", 2**30),
        "entry 'action_space': the space declares 1073741824 elements",
    ),
    (
        "space not a dict",
        _set("observation_space", 4),
        "entry 'observation_space': expected a space description",
    ),
    (
        "box without low",
        lambda d, weight: d["observation_space"].pop("low"),
        "entry 'observation_space': 'low' must be a tensor",
    ),
]


@pytest.mark.parametrize("what,change,match", BAD_POLICIES, ids=[case[0] for case in BAD_POLICIES])
def test_a_malformed_policy_file_is_a_checkpoint_error_naming_the_entry(
    tmp_path, saved, what, change, match, capsys
):
    policy = copy.deepcopy(saved["policy"])
    weight = _first_weight(policy["state_dict"])
    change(policy, weight)
    path = save_checkpoint(policy, tmp_path / "policy.pt")
    with pytest.raises(CheckpointError, match=match.format(weight=weight)):
        load_policy(path)
    assert main(["eval", str(path), "--episodes", "1"]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"rl8: error: {path}") and err.count("\n") == 1, err


def test_a_malformed_trainer_checkpoint_is_a_checkpoint_error_naming_the_entry(tmp_path, saved, capsys):
    state = saved["checkpoint"]
    weight = _first_weight(state["algo"]["policy"])
    cases = {
        "hparams not a dict": (
            lambda s: s["algo"].__setitem__("hparams", "wide"),
            "hyper-parameters must be a dict",
            "entry 'algo.hparams' must be a dict",
        ),
        "weights not fitting the hparams": (
            lambda s: s["algo"]["hparams"].__setitem__("model_config", {"hiddens": [8]}),
            r"entry 'algo' does not fit the PPO its hyper-parameters \(entry 'algo.hparams'\) describe",
            "entry 'algo' does not fit",
        ),
        "weights nan": (
            lambda s: s["algo"]["policy"][weight].fill_(float("nan")),
            rf"entry 'algo.policy': the policy's weights hold NaN or inf: state_dict\['{weight}'\]",
            "hold NaN or inf",
        ),
    }
    for what, (change, python_match, cli_match) in cases.items():
        broken = copy.deepcopy(state)
        change(broken)
        (tmp_path / what.replace(" ", "-")).mkdir()
        path = save_checkpoint(broken, tmp_path / what.replace(" ", "-") / "checkpoint-000000000128.pt")
        with pytest.raises(CheckpointError, match=python_match):
            Trainer.from_checkpoint(path, progress=False)
        assert main(["train", "--resume", str(path), "--max-steps", "256", "--quiet"]) == 2, what
        err = capsys.readouterr().err
        assert cli_match in err and err.count("\n") == 1, (what, err)
