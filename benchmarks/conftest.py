"""Benchmarks import their helpers (floor.py) from this folder and the tests' (launch.py: free
ports, torchrun jobs) from tests/, and run with the torch threads their ``torch_threads(n)``
marker asks for."""

import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).parent))
sys.path.insert(1, str(Path(__file__).parent.parent / "tests"))


def pytest_configure(config):
    config.addinivalue_line(
        "markers",
        "torch_threads(n): run with torch.set_num_threads(n), the previous count restored after",
    )


@pytest.fixture(autouse=True)
def torch_threads(request):
    """``torch.set_num_threads(n)`` for the benchmark of a module (``pytestmark``) or test marked
    ``torch_threads(n)``; the previous count is restored after. Unmarked: nothing is changed."""
    marker = request.node.get_closest_marker("torch_threads")
    if marker is None:
        yield torch.get_num_threads()
        return
    previous = torch.get_num_threads()
    torch.set_num_threads(marker.args[0])
    yield marker.args[0]
    torch.set_num_threads(previous)
