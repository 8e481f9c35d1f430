"""rl8's MLflow model flavor (``docs/tracking.md#policies-as-mlflow-models``): ``mlflow.pyfunc``,
``mlflow models serve`` and the Model Registry take rl8 policies, which the pyfunc loads through
:func:`rl8.load_policy` (registry, ``weights_only``), never through cloudpickle."""

from __future__ import annotations

import copy
import datetime
import json
import platform
import uuid
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import gymnasium
import numpy as np
import tensordict
import torch
from gymnasium import spaces

from rl8.io.export import MODEL_FLAVOR, MODEL_POLICY_FILE, load_policy, save_policy
from rl8.version import __version__

__all__ = ["PolicyModel", "as_dtype", "save_model"]


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
    ``rl8.io.mlflow_model``) and a signature: env actions out and the param ``deterministic``
    (default ``True``: the distributions' modes); an input example of two observations,
    ``requirements.txt`` and ``python_env.yaml``. Returns the folder. Needs only
    ``mlflow-skinny`` (loading it as a pyfunc needs the full ``mlflow``: ``rl8[ui]``).

    The input, a batch of observations ``[-1, *obs_shape]`` (named tensors for a ``Dict``
    space), is the ``rl8`` flavor's ``inputs`` schema, not the signature's: MLflow refuses any
    input whose dtype differs from a signature's (a float64 batch for float32 observations), so
    :meth:`PolicyModel.predict` checks and casts the input itself.

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
            MODEL_FLAVOR: {
                "data": MODEL_POLICY_FILE,
                "rl8_version": __version__,
                "inputs": _schema(policy.observation_space),
            },
        },
        "signature": {
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
        """Env actions ``[B, *action_shape]`` for a batch of ``B`` observations (one observation
        is a batch of one), cast to the observation space's dtypes where no value changes
        (:func:`as_dtype`).

        Args:
            model_input: An array ``[B, *obs_shape]`` (numpy, or nested lists), or a pandas
                DataFrame of ``B`` rows whose columns are the flat observation features; for a
                ``Dict`` space a dict of such arrays, or a DataFrame with a column per key (of
                the values or arrays of each row), with at least the keys the actor reads.
            params: ``{"deterministic": False}`` samples actions (default: the modes).

        Raises:
            ValueError: An input of the wrong shape, number of columns or keys, or of values
                that do not cast to the space's dtype without change (floats for integer
                observations), naming what was expected and what was given.
        """
        space = self.policy.observation_space
        if isinstance(space, spaces.Dict):
            obs = _entries(model_input, space)
        else:
            obs = _observations(_features(model_input, space), space, "model input")
        deterministic = bool((params or {}).get("deterministic", True))
        actions, _ = self.policy.predict(obs, deterministic=deterministic)
        return actions


def _is_frame(value: Any) -> bool:
    """Whether ``value`` is a pandas DataFrame (pandas is not imported: it comes with mlflow)."""
    return hasattr(value, "columns") and hasattr(value, "to_numpy")


def _features(model_input: Any, space: spaces.Space) -> Any:
    """A DataFrame of flat observation features as an array ``[B, *obs_shape]``; any other input as it is."""
    if not _is_frame(model_input):
        return model_input
    size = int(np.prod(space.shape, dtype=np.int64))
    columns = len(model_input.columns)
    if columns != size:
        raise ValueError(
            f"model input: expected a DataFrame of {size} columns (the flat features of an "
            f"observation of shape {space.shape}), got {columns} columns"
        )
    return model_input.to_numpy().reshape(-1, *space.shape)


def _entries(model_input: Any, space: spaces.Dict) -> dict[str, Any]:
    """The entries of a ``Dict`` observation batch (a dict, or a DataFrame with a column per
    key), those of the space cast to its dtypes; the others are left for
    :meth:`rl8.Policy.predict` to refuse."""
    if _is_frame(model_input):
        model_input = {key: model_input[key] for key in model_input.columns}
    if not isinstance(model_input, Mapping):
        raise ValueError(
            f"model input: expected a dict of arrays (or a DataFrame with a column per key) with "
            f"the keys {list(space.spaces)}, got {type(model_input).__name__}"
        )
    return {
        key: _observations(value, space[key], f"model input[{key!r}]") if key in space.spaces else value
        for key, value in model_input.items()
    }


def _observations(value: Any, space: spaces.Space, where: str) -> np.ndarray:
    """``value``, observations of ``space`` ``[B, *obs_shape]`` (or one), as a new array of the
    space's dtype (:func:`as_dtype`); a wrong shape is an error naming the shapes."""
    array = as_dtype(value, np.dtype(space.dtype), where)
    if array.shape == space.shape:  # one observation: a batch of one
        array = array[None]
    if array.shape[1:] != space.shape:
        batched = "[B" + "".join(f", {size}" for size in space.shape) + "]"
        raise ValueError(
            f"{where}: expected a batch of observations {batched} (or one of shape "
            f"{space.shape}), got shape {array.shape}"
        )
    return array


def as_dtype(value: Any, dtype: np.dtype, where: str) -> np.ndarray:
    """``value`` as a new numpy array of ``dtype`` where no value changes but for the rounding
    of a float: numbers of any width, ints and bools for a float ``dtype`` (float64 to float32);
    ints and bools within the range of an integer ``dtype`` (0 and 1 for ``bool``).

    Args:
        value: An array, nested lists, or a DataFrame column (of values or per-row arrays).
        dtype: The dtype of the observation space (of its entry).
        where: The input as the message names it (``"model input['state']"``).

    Raises:
        ValueError: Floats for an integer ``dtype``, ints out of its range, or values that are
            no numbers, naming ``where``, the expected dtype and the given one.
    """
    array = np.asarray(value)
    if array.dtype == object and array.size:  # a DataFrame column: per-row values or arrays
        array = np.array(array.tolist())
    given = array.dtype
    if given == dtype or (dtype.kind == "f" and given.kind in "fiub"):
        return array.astype(dtype)  # a copy: MLflow hands over read-only arrays
    if dtype.kind in "iub" and given.kind in "iub":
        low, high = (0, 1) if dtype.kind == "b" else (np.iinfo(dtype).min, np.iinfo(dtype).max)
        if array.size == 0 or (array.min() >= low and array.max() <= high):
            return array.astype(dtype)
        raise ValueError(
            f"{where}: expected {dtype} values in [{low}, {high}], got values in "
            f"[{array.min()}, {array.max()}]"
        )
    cast = (
        "numbers of any width and bools are cast"
        if dtype.kind == "f"
        else "ints and bools are cast, floats are not: they need not be whole"
    )
    raise ValueError(f"{where}: expected {dtype} values ({cast}), got {given} values")


def _load_pyfunc(data_path: str) -> PolicyModel:
    """The ``python_function`` loader (``loader_module`` of ``MLmodel``): the policy file
    ``data_path`` through :func:`rl8.load_policy`, which never runs code from the file."""
    return PolicyModel(load_policy(data_path))
