"""The dtype of ``enable_amp``'s autocast (``docs/hparams.md``, Speed)."""

from __future__ import annotations

import logging
import warnings

import torch

__all__ = ["choose_amp_dtype", "cuda_amp_dtype"]

logger = logging.getLogger(__name__)

#: Prefixes of ``torch.backends.cpu.get_cpu_capability()`` whose vector units run bfloat16
#: matmuls fast (oneDNN: AVX-512 and its successors on x86, SVE on Arm).
_BF16_CAPABILITIES = ("AVX512", "AMX", "SVE")


def cuda_amp_dtype(device: torch.device) -> torch.dtype:
    """``torch.bfloat16`` when the CUDA ``device`` runs it natively (compute capability 8.0,
    Ampere, and later; every ROCm GPU torch supports), else ``torch.float16``, which needs a
    gradient scaler: its range is too small for the gradients of small losses."""
    if torch.version.hip is not None:
        return torch.bfloat16
    major, _ = torch.cuda.get_device_capability(device)
    return torch.bfloat16 if major >= 8 else torch.float16


def choose_amp_dtype(device: torch.device, enable_amp: bool) -> torch.dtype:
    """The dtype PPO's forward passes on ``device`` autocast to, logged: on CUDA :func:`cuda_amp_dtype`,
    on CPU ``torch.bfloat16`` where its vector units run it fast (else ``torch.float32`` with a
    ``UserWarning``); ``torch.float32`` without the hyper-parameter ``enable_amp``."""
    if not enable_amp:
        return torch.float32
    capability = torch.backends.cpu.get_cpu_capability()
    if device.type == "cuda":
        dtype = cuda_amp_dtype(device)
    elif device.type == "cpu" and not capability.upper().startswith(_BF16_CAPABILITIES):
        warnings.warn(
            f"hparam enable_amp: training in float32 instead of bfloat16: this CPU's vector capability "
            f"is {capability!r} (torch.backends.cpu.get_cpu_capability()); fast bfloat16 matmuls need "
            f"one of {', '.join(_BF16_CAPABILITIES)}",
            stacklevel=3,
        )
        dtype = torch.float32
    else:
        dtype = torch.bfloat16
    logger.info("rl8: enable_amp on %s: autocast dtype %s", device, str(dtype).removeprefix("torch."))
    return dtype
