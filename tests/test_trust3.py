"""Trust, round three (issue 36): files, names, stores and servers that could mislead rl8."""

from __future__ import annotations

import os

import pytest

from rl8.io.checkpoint_dir import CHECKPOINT_DIR_LOCK, CheckpointDirError, CheckpointDirLock


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
