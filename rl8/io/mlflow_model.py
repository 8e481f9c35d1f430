"""rl8's MLflow model flavor (``docs/tracking.md#policies-as-mlflow-models``): ``mlflow.pyfunc``,
``mlflow models serve`` and the Model Registry take rl8 policies, which the pyfunc loads through
:func:`rl8.load_policy` (registry, ``weights_only``), never through cloudpickle."""

from __future__ import annotations

import copy
import datetime
import json
import platform
import uuid
from pathlib import Path
from typing import Any

import gymnasium
import numpy as np
import tensordict
import torch
from gymnasium import spaces

from rl8.io.export import MODEL_FLAVOR, MODEL_POLICY_FILE, load_policy, save_policy
from rl8.version import __version__

__all__ = ["PolicyModel", "save_model"]


def _schema(space: spaces.Space) -> str:
    """A space's batch as the JSON of an MLflow tensor schema (named tensors for a ``Dict``)."""
    from mlflow.types import Schema, TensorSpec

    entries = list(space.spaces.items()) if isinstance(space, spaces.Dict) else [(None, space)]
    for key, sub in entries:
        if isinstance(sub, spaces.Dict):
            raise ValueError(f"a nested Dict space ({key!r}) has no MLflow signature")
    return Schema(
        [TensorSpec(np.dtype(sub.dtype), (-1, *sub.shape), key) for key, sub in entries]
    ).to_json()


def _input_example(space: spaces.Space, n: int = 2) -> Any:
    """``n`` observations sampled from (a copy of) ``space`` with seed 0, as plain lists."""
    space = copy.deepcopy(space)
    space.seed(0)
    samples = [space.sample() for _ in range(n)]
    if isinstance(space, spaces.Dict):
        return {key: np.stack([s[key] for s in samples]).tolist() for key in space.spaces}
    return np.stack(samples).tolist()


def save_model(policy: Any, path: str | Path, *, env: dict[str, Any] | None = None) -> Path:
    """Write ``policy`` as an MLflow model folder: ``policy.pt`` (:func:`rl8.save_policy`) and
    ``MLmodel`` with the flavors ``rl8`` and ``python_function`` (loader module
    ``rl8.io.mlflow_model``) and a signature: a batch of observations ``[-1, *obs_shape]`` (named
    tensors for a ``Dict`` space) in, env actions out, the param ``deterministic`` (default
    ``True``: the distributions' modes); an input example of two observations,
    ``requirements.txt`` and ``python_env.yaml``. Returns the folder. Needs only
    ``mlflow-skinny`` (loading it as a pyfunc needs the full ``mlflow``: ``rl8[ui]``).

    Args:
        policy: A :class:`rl8.Policy`, e.g. ``algo.policy``.
        path: The folder (created if missing; files of the same names are replaced).
        env: Optional description of the env (see :func:`rl8.save_policy`).
    """
    import mlflow
    import yaml

    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    save_policy(policy, path / MODEL_POLICY_FILE, env=env)
    example = _input_example(policy.observation_space)
    (path / "input_example.json").write_text(json.dumps(example))
    (path / "serving_input_example.json").write_text(json.dumps({"inputs": example}))
    versions = {
        "rl8": __version__,
        "torch": torch.__version__.split("+")[0],
        "mlflow": mlflow.__version__,
        "gymnasium": gymnasium.__version__,
        "tensordict": tensordict.__version__,
        "numpy": np.__version__,
    }
    (path / "requirements.txt").write_text("".join(f"{k}=={v}\n" for k, v in versions.items()))
    (path / "python_env.yaml").write_text(
        f"python: {platform.python_version()}\nbuild_dependencies:\n"
        "  - pip\ndependencies:\n  - -r requirements.txt\n"
    )
    meta = {
        "flavors": {
            "python_function": {
                "loader_module": __name__,
                "data": MODEL_POLICY_FILE,
                "env": {"virtualenv": "python_env.yaml"},
                "python_version": platform.python_version(),
            },
            MODEL_FLAVOR: {"data": MODEL_POLICY_FILE, "rl8_version": __version__},
        },
        "signature": {
            "inputs": _schema(policy.observation_space),
            "outputs": _schema(policy.action_space),
            "params": json.dumps(
                [{"name": "deterministic", "type": "boolean", "default": True, "shape": None}]
            ),
        },
        "saved_input_example_info": {
            "artifact_path": "input_example.json",
            "type": "ndarray",
            "serving_input_path": "serving_input_example.json",
        },
        "mlflow_version": mlflow.__version__,
        "model_uuid": uuid.uuid4().hex,
        "utc_time_created": str(datetime.datetime.now(datetime.UTC).replace(tzinfo=None)),
    }
    (path / "MLmodel").write_text(yaml.safe_dump(meta, sort_keys=False))
    return path


class PolicyModel:
    """What ``mlflow.pyfunc.load_model`` wraps: ``predict`` maps a batch of observations to env
    actions with ``policy``'s (a :class:`rl8.Policy`) :meth:`~rl8.Policy.predict` (a recurrent
    policy starts new episodes at every call)."""

    def __init__(self, policy: Any) -> None:
        self.policy = policy

    def predict(self, model_input: Any, params: dict[str, Any] | None = None) -> np.ndarray:
        """Env actions ``[B, *action_shape]`` for a batch of ``B`` observations.

        Args:
            model_input: A numpy array ``[B, *obs_shape]`` (a dict of them for a ``Dict``
                space), or a pandas DataFrame of ``B`` rows (one column per observation value;
                for a ``Dict`` space, one column per entry).
            params: ``{"deterministic": False}`` samples actions (default: the modes).
        """
        space, frame = (
            self.policy.observation_space,
            hasattr(model_input, "to_numpy"),
        )  # a pandas DataFrame
        if isinstance(space, spaces.Dict):  # copies: MLflow hands over read-only arrays
            obs = {
                k: np.array(list(model_input[k]) if frame else model_input[k]).reshape(-1, *sub.shape)
                for k, sub in space.spaces.items()
            }
        else:
            obs = np.array(model_input.to_numpy() if frame else model_input).reshape(-1, *space.shape)
        deterministic = bool((params or {}).get("deterministic", True))
        actions, _ = self.policy.predict(obs, deterministic=deterministic)
        return actions


def _load_pyfunc(data_path: str) -> PolicyModel:
    """The ``python_function`` loader (``loader_module`` of ``MLmodel``): the policy file
    ``data_path`` through :func:`rl8.load_policy`, which never runs code from the file."""
    return PolicyModel(load_policy(data_path))
