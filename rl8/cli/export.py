"""``rl8 export``: write a saved policy's deterministic actor as an ONNX or TorchScript file for a
robot (``docs/export.md``)."""

from __future__ import annotations

import argparse
from pathlib import Path

from rl8.training.config_file import ConfigError

__all__ = ["DEFAULT_OUTPUTS", "run"]

#: The file written without ``-o``, per format.
DEFAULT_OUTPUTS = {"onnx": "policy.onnx", "torchscript": "policy.pt"}


def run(args: argparse.Namespace) -> int:
    """``rl8 export``: write the file ``args`` (the parsed command line) ask for and print its path;
    the exit status."""
    output = DEFAULT_OUTPUTS[args.format] if args.output is None else args.output
    if not output.strip():
        raise ConfigError("-o/--output: expected a file name, got an empty string")
    path = Path(output)
    if path.is_dir():
        example = path / DEFAULT_OUTPUTS[args.format]
        raise ConfigError(f"-o/--output: {output} is a folder; give a file name (e.g. {example})")
    from rl8.io.export import load_policy
    from rl8.policies.deploy import ExportError, read_export_metadata

    if path.exists() and not args.force and read_export_metadata(path) is None:
        raise ConfigError(
            f"-o/--output: {output} exists and is not an rl8 export; pass --force to overwrite it"
        )
    policy = load_policy(
        args.policy, map_location="cpu", tracking_uri=args.tracking_uri, trust_code=args.trust_code
    )
    try:
        written = policy.export(path, args.format)
    except ExportError as exc:  # the policy named: rl8 export exits with 1 (cli.main)
        raise ExportError(f"{args.policy}: {exc}") from exc
    print(written)
    return 0
