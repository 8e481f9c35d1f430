"""Deployment: a policy's deterministic actor (:class:`DeterministicActor`) as an ONNX or
TorchScript file for a robot (``docs/export.md``)."""

from __future__ import annotations

import copy
import importlib.util
import json
import math
import os
import warnings
import zipfile
from pathlib import Path
from typing import Any

import numpy as np
import torch
from gymnasium import spaces
from tensordict import TensorDict
from torch import nn

from rl8.envs.spaces import space_dtype, space_to_dict
from rl8.version import __version__

__all__ = [
    "EXPORT_FORMATS",
    "ExportError",
    "DeterministicActor",
    "export_policy",
    "read_export_metadata",
]

#: The file formats of :func:`export_policy`.
EXPORT_FORMATS = ("onnx", "torchscript")
#: Name of the metadata file inside a TorchScript export (its ``extra/`` entries).
TORCHSCRIPT_METADATA = "rl8_metadata.json"


class ExportError(ValueError):
    """A policy that cannot be exported in the format asked for (the message says why)."""


class DeterministicActor(nn.Module):
    """The deterministic actor of a policy as a module of tensors only: ``actor(*inputs)``
    gives the env actions of ``policy.predict(obs, deterministic=True)`` (normalised, clipped,
    in the action space's dtype), and for recurrent models the next state.

    Inputs, in :attr:`input_names` order, each with the batch ``B`` first: ``obs``
    ``[B, *obs_shape]`` in the observation space's dtype, or for ``Dict`` observations one
    input per key the actor reads (:attr:`~rl8.policies.models.Model.actor_groups`, with
    ``action_mask`` when the space has one); then for recurrent models ``state_<key>`` per
    entry of the state (``[B, L, H]`` for LSTM/GRU: ``h``, ``c``). Outputs: ``actions``, then
    ``next_state_<key>`` per state entry.

    Args:
        policy: The :class:`~rl8.policies.policy.Policy`; it is copied to the CPU, untouched.
    """

    def __init__(self, policy: Any) -> None:
        super().__init__()
        self.policy = copy.deepcopy(policy).cpu().eval()
        model, obs_space, act_space = self.policy.model, policy.observation_space, policy.action_space
        self.obs_keys: tuple[str, ...] | None = None
        if isinstance(obs_space, spaces.Dict):
            keys = tuple(self.policy.actor_observation_space.spaces)
            nested = [k for k in keys if isinstance(obs_space[k], spaces.Dict)]
            if nested:
                raise ExportError(
                    f"observation entries {nested} are Dict spaces; an exported actor takes "
                    "one tensor per key (flatten nested Dict observations)"
                )
            self.obs_keys = keys
        self.state_keys: tuple[str, ...] = ()
        if self.policy.recurrent:
            initial = self.policy.initial_state(1)
            if any(bool(leaf.any()) for leaf in initial.values(include_nested=True, leaves_only=True)):
                raise ExportError(
                    f"{type(model).__name__}.initial_state is not all zeros; an exported "
                    "actor starts an episode from a zero state"
                )
            self.state_keys = tuple(initial.keys())
            self._state_shapes = {k: tuple(initial[k].shape[1:]) for k in self.state_keys}
        self.input_names = (*(self.obs_keys or ("obs",)), *(f"state_{k}" for k in self.state_keys))
        self.output_names = ("actions", *(f"next_state_{k}" for k in self.state_keys))
        try:
            zeros = torch.zeros(1, self.policy.distribution_cls.param_size(act_space))
            self.policy.distribution_cls(zeros, act_space).deterministic_sample()
        except NotImplementedError:
            raise ExportError(
                f"{self.policy.distribution_cls.__name__} has no deterministic action "
                "(deterministic_sample); an exported actor needs one"
            ) from None
        self.action_dtype = torch.from_numpy(np.zeros(0, dtype=act_space.dtype)).dtype
        self.clip = isinstance(act_space, spaces.Box) and bool(
            np.isfinite(act_space.low).any() or np.isfinite(act_space.high).any()
        )
        if self.clip:
            self.register_buffer("low", torch.as_tensor(act_space.low, dtype=torch.float32))
            self.register_buffer("high", torch.as_tensor(act_space.high, dtype=torch.float32))
        self.eval().requires_grad_(False)

    def forward(self, *inputs: torch.Tensor) -> torch.Tensor | tuple[torch.Tensor, ...]:
        """Env actions ``[B, ...]`` (a tuple with the next state for recurrent models)."""
        policy, n = self.policy, len(self.input_names) - len(self.state_keys)
        batch = inputs[0].shape[:1]
        obs = (
            inputs[0]
            if self.obs_keys is None
            else TensorDict(dict(zip(self.obs_keys, inputs[:n])), batch)
        )
        state = TensorDict(dict(zip(self.state_keys, inputs[n:])), batch) if self.state_keys else None
        dist, next_state = policy.actor_step(obs, state)  # the actor alone, on its inputs
        actions = policy.to_env_action(dist.deterministic_sample())
        if self.clip:
            actions = torch.clamp(actions, self.low, self.high)
        actions = actions.to(self.action_dtype)
        return (actions, *(next_state[k] for k in self.state_keys)) if self.state_keys else actions

    def example_inputs(self, batch_size: int = 2, seed: int = 0) -> tuple[torch.Tensor, ...]:
        """Valid inputs for ``batch_size`` envs: observations the space samples (seeded with
        ``seed``), zero states."""
        space = self.policy.observation_space
        leaves = [(k, space[k]) for k in self.obs_keys] if self.obs_keys else [("obs", space)]
        out = []
        for key, sub in leaves:
            sub = copy.deepcopy(sub)
            sub.seed(seed)
            value = torch.as_tensor(np.stack([sub.sample() for _ in range(batch_size)]))
            out.append(value.bool() if key == "action_mask" else value.to(space_dtype(sub)))
        return (*out, *(torch.zeros(batch_size, *self._state_shapes[k]) for k in self.state_keys))

    def metadata(self) -> dict[str, str]:
        """What a robot-side loader reads (JSON strings): the spaces (:func:`space_to_dict`,
        non-finite bounds as ``"inf"``/``"-inf"``), the inputs and outputs (name, shape with
        ``"B"`` for the batch, dtype), the classes and the rl8 version."""
        examples = self.example_inputs(1)
        outputs = self(*examples)
        outputs = outputs if isinstance(outputs, tuple) else (outputs,)

        def described(names: tuple[str, ...], tensors: tuple[torch.Tensor, ...]) -> str:
            return json.dumps(
                [
                    {
                        "name": name,
                        "shape": ["B", *t.shape[1:]],
                        "dtype": str(t.dtype).removeprefix("torch."),
                    }
                    for name, t in zip(names, tensors)
                ]
            )

        policy = self.policy
        return {
            "rl8_version": __version__,
            "observation_space": json.dumps(_plain(space_to_dict(policy.observation_space))),
            "action_space": json.dumps(_plain(space_to_dict(policy.action_space))),
            "inputs": described(self.input_names, examples),
            "outputs": described(self.output_names, outputs),
            "model_cls": type(policy.model).__qualname__,
            "distribution_cls": policy.distribution_cls.__qualname__,
            "normalize_observations": json.dumps(policy.obs_normalizer is not None),
        }


def _plain(value: Any) -> Any:
    """A space description as JSON data: tensors as lists, non-finite floats as strings."""
    if isinstance(value, torch.Tensor):
        value = value.tolist()
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_plain(v) for v in value]
    return str(value) if isinstance(value, float) and not math.isfinite(value) else value


def export_policy(policy: Any, path: str | os.PathLike[str], format: str = "onnx") -> Path:
    """Write the deterministic actor of ``policy`` (:class:`DeterministicActor`) to ``path``,
    atomically, with a dynamic batch axis and the metadata of :meth:`DeterministicActor.metadata`
    (ONNX ``metadata_props``; TorchScript: the ``extra/rl8_metadata.json`` entry). Returns the path.

    Args:
        policy: The :class:`~rl8.policies.policy.Policy`.
        path: The file to write; its folder is created if missing.
        format: ``"onnx"`` (``torch.onnx.export``'s ``torch.export``-based exporter, opset 18;
            needs the ``onnx`` extra: ``pip install -e ".[onnx]"`` in the checkout) or ``"torchscript"`` (``torch.jit.trace``).

    Raises:
        ExportError: A distribution without a deterministic action, a model that does not trace,
            or an observation or state layout an exported actor cannot take.
    """
    if format not in EXPORT_FORMATS:
        raise ValueError(f"format: expected one of {list(EXPORT_FORMATS)}, got {format!r}")
    if format == "onnx" and not all(importlib.util.find_spec(name) for name in ("onnx", "onnxscript")):
        raise ImportError(
            'ONNX export needs onnx and onnxscript, the onnx extra: pip install -e ".[onnx]" in the checkout of rl8'
        )
    actor = DeterministicActor(policy)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        _write(actor, format, tmp)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    return path


def _write(actor: DeterministicActor, format: str, path: Path) -> None:
    """Trace ``actor`` into a file of ``format``; what fails to trace is an :class:`ExportError`."""
    try:
        metadata, other_batch = actor.metadata(), actor.example_inputs(3, seed=1)
        with warnings.catch_warnings():  # torch's notes on tracing (the trace is checked instead)
            for category in (torch.jit.TracerWarning, FutureWarning, DeprecationWarning):
                warnings.simplefilter("ignore", category)
            warnings.filterwarnings(
                "ignore", "The tensor attributes .* were assigned during export"
            )  # nn.LSTM
            if format == "onnx":
                program = torch.onnx.export(
                    actor,
                    actor.example_inputs(),
                    dynamo=True,
                    opset_version=18,
                    verbose=False,
                    input_names=list(actor.input_names),
                    output_names=list(actor.output_names),
                    dynamic_shapes=(({0: torch.export.Dim.DYNAMIC},) * len(actor.input_names),),
                )
                try:  # what torch.export froze (a value, a branch) shows on another batch
                    torch.testing.assert_close(
                        program.exported_program.module()(*other_batch), actor(*other_batch)
                    )
                except AssertionError:
                    raise ValueError(
                        "the exported program's actions differ from the model's on a second batch "
                        "(the model's computation depends on how it is traced)"
                    ) from None
                program.model.metadata_props.update(metadata)
                program.save(str(path))
            else:
                traced = torch.jit.trace(actor, actor.example_inputs(), check_inputs=[other_batch])
                torch.jit.save(
                    traced, str(path), _extra_files={TORCHSCRIPT_METADATA: json.dumps(metadata)}
                )
    except OSError:
        raise
    except Exception as exc:
        other, cause = EXPORT_FORMATS[format == "onnx"], exc
        while cause.__cause__ is not None:  # torch.onnx wraps the error of torch.export
            cause = cause.__cause__
        first = (str(cause).strip().splitlines() or [type(cause).__name__])[0]
        policy = actor.policy
        raise ExportError(
            f"cannot export {type(policy.model).__name__} with {policy.distribution_cls.__name__} "
            f"as {format} ({first}); try format={other!r}, or a model of plain torch operations"
        ) from exc


def read_export_metadata(path: str | os.PathLike[str]) -> dict[str, str] | None:
    """The metadata of the file ``path`` if :func:`export_policy` wrote it, read without running
    it; ``None`` for any other file (one that is not ONNX nor TorchScript, or not written by rl8)."""
    try:
        if zipfile.is_zipfile(path):
            with zipfile.ZipFile(path) as archive:
                names = [n for n in archive.namelist() if n.endswith(f"/extra/{TORCHSCRIPT_METADATA}")]
                return json.loads(archive.read(names[0])) if names else None
        import onnx  # optional (rl8[onnx])

        props = {p.key: p.value for p in onnx.load(str(path), load_external_data=False).metadata_props}
    except (
        Exception
    ):  # onnx not installed (no ONNX file counts as an export then), or another kind of file
        return None
    return props if "rl8_version" in props else None
