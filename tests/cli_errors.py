"""What the rl8 command prints when it refuses its input (tests/test_cli.py, tests/test_video.py)."""

from __future__ import annotations


def one_error_line(err: str) -> str:
    """The single ``rl8: error:`` line of ``err`` (what the command printed on stderr)."""
    lines = [line for line in err.splitlines() if line.startswith("rl8: error:")]
    assert len(lines) == 1, err
    assert "Traceback" not in err, err
    return lines[0]
