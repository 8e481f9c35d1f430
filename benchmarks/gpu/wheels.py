"""Check a folder of wheels for the GPU machine: one wheel per pin of ``wheels.txt``, each
built for CPython 3.12 on Linux x86-64, and every requirement of theirs either in the folder or
in the machine's image (:data:`PREINSTALLED`).

    python benchmarks/gpu/wheels.py .whl        # prints the wheels and their size; exit 1 on a problem

``prepare_wheels.sh`` runs it after downloading. Needs only ``packaging``.
"""

from __future__ import annotations

import sys
import zipfile
from email.parser import Parser
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name, parse_wheel_filename

HERE = Path(__file__).resolve().parent

#: The Python packages of the GPU machine's image (the workplace's device notes, KINDS.md,
#: "Python packages already there", read 2026-11-17). Their versions are the image's own.
PREINSTALLED = frozenset(
    canonicalize_name(n)
    for n in """
absl-py accelerate aiofiles aiohappyeyeballs aiohttp aiosignal annotated-doc anyio attrs botorch
build certifi charset-normalizer chex click cloudpickle cmake colorama contourpy coverage
cuda-bindings cuda-core cuda-pathfinder cuda-toolkit cupy-cuda13x cycler cython diffrax e3nn
einops equinox etils execnet filelock flatbuffers flax fonttools formulaic frozenlist fsspec
gpytorch grpcio h11 h5py hf-xet httpcore httpx huggingface-hub humanize hypothesis idna imageio
iniconfig interface-meta jax jax-cuda13-pjrt jax-cuda13-plugin jaxlib jaxtyping jinja2 joblib
kiwisolver lazy-loader lightning lightning-utilities linear-operator lineax llvmlite lxml
markdown markdown-it-py markupsafe matplotlib mdurl meson ml-dtypes mpi4py mpmath msgpack
multidict multipledispatch mypy-extensions nanobind narwhals networkx ninja numba numba-cuda
numpy numpyro nvidia-cublas nvidia-cuda-cupti nvidia-cuda-nvrtc nvidia-cuda-runtime
nvidia-cudnn-cu13 nvidia-cufft nvidia-cufile nvidia-curand nvidia-cusolver nvidia-cusparse
nvidia-cusparselt-cu13 nvidia-ml-py nvidia-nccl-cu13 nvidia-nvjitlink nvidia-nvshmem-cu13
nvidia-nvtx onnx onnx-ir onnxruntime onnxscript opencv-python-headless optax opt-einsum
opt-einsum-fx optimistix orbax-checkpoint packaging pandas pathspec patsy peft pillow pip
pluggy portalocker prometheus-client propcache protobuf psutil pyarrow pybind11 py-cpuinfo
pygments pyparsing pyproject-hooks pyre-extensions pytest pytest-benchmark pytest-cov
pytest-mock pytest-timeout pytest-xdist python-dateutil pytorch-lightning pyyaml regex requests
rich sacrebleu safetensors scikit-build-core scikit-image scikit-learn scipy seaborn
sentencepiece sentence-transformers setuptools shellingham simplejson six sortedcontainers
statsmodels sympy tabulate tensorboard tensorboard-data-server tensorstore threadpoolctl
tifffile tiktoken timm tokenizers toolz torch torchaudio torchdiffeq torch-geometric
torchmetrics torchvision tqdm transformers treescope triton typer typing-extensions
typing-inspect urllib3 uvloop wadler-lindig werkzeug wheel wrapt xarray xxhash yarl zipp
""".split()
)

#: Requirements left out on purpose, with why: Playground on MJX (``impl="jax"``) never imports
#: them (checked with their imports blocked); warp-lang alone is 142 MiB, over the 64 MiB carried.
NOT_CARRIED = {
    "warp-lang": "only for impl='warp' (Playground and mujoco-mjx import it in a try)",
    "mediapy": "Playground's videos",
    "pyopengl": "MuJoCo's OpenGL rendering",
    "flask": "brax's visualiser server",
    "flask-cors": "brax's visualiser server",
    "tensorboardx": "brax's training logger",
}

#: The GPU machine's Python (3.12.3, Linux x86-64), for the markers of ``Requires-Dist``.
MARKER_ENV = {
    "python_version": "3.12",
    "python_full_version": "3.12.3",
    "implementation_name": "cpython",
    "implementation_version": "3.12.3",
    "platform_python_implementation": "CPython",
    "sys_platform": "linux",
    "platform_system": "Linux",
    "platform_machine": "x86_64",
    "os_name": "posix",
    "extra": "",
}


def read_pins(path: Path = HERE / "wheels.txt") -> dict[str, str]:
    """``name -> version`` of the ``NAME==VERSION`` lines of ``path`` (comments and blanks skipped)."""
    pins = {}
    for line in path.read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        name, sep, version = line.partition("==")
        if not sep or not version:
            raise ValueError(f"{path}: expected NAME==VERSION, got {line!r}")
        pins[canonicalize_name(name)] = version.strip()
    return pins


def requirements(wheel: Path) -> list[Requirement]:
    """The ``Requires-Dist`` entries of ``wheel`` that apply on the GPU machine without extras."""
    with zipfile.ZipFile(wheel) as zf:
        name = next(n for n in zf.namelist() if n.endswith(".dist-info/METADATA") and n.count("/") == 1)
        meta = Parser().parsestr(zf.read(name).decode("utf-8"))
    reqs = [Requirement(r) for r in meta.get_all("Requires-Dist") or []]
    return [r for r in reqs if r.marker is None or r.marker.evaluate(MARKER_ENV)]


def fits_the_machine(wheel: Path) -> bool:
    """Whether ``wheel``'s tags allow CPython 3.12 on manylinux x86-64."""
    _, _, _, tags = parse_wheel_filename(wheel.name)

    def python_fits(t) -> bool:
        if t.abi == "abi3":  # the stable ABI: built for CPython 3.N, runs on 3.N and later
            return t.interpreter.startswith("cp3") and int(t.interpreter[3:]) <= 12
        return t.interpreter in ("py3", "cp312") and t.abi in ("none", "cp312")

    return any(
        python_fits(t)
        and (
            t.platform == "any" or (t.platform.startswith("manylinux") and t.platform.endswith("x86_64"))
        )
        for t in tags
    )


def check(folder: Path, pins: dict[str, str]) -> list[str]:
    """The problems of the wheels in ``folder`` against ``pins`` (empty: none), as sentences."""
    problems = []
    found: dict[str, list[str]] = {}
    for wheel in sorted(folder.glob("*.whl")):
        name, version, _, _ = parse_wheel_filename(wheel.name)
        found.setdefault(name, []).append(str(version))
        if not fits_the_machine(wheel):
            problems.append(f"{wheel.name}: not built for CPython 3.12 on manylinux x86-64")
    for name, versions in found.items():
        if len(versions) > 1:
            problems.append(
                f"{name}: {len(versions)} versions ({', '.join(versions)}); pip installs one"
            )
        if name == "torch":
            problems.append("torch: the GPU machine has its own; remove the wheel")
        elif name not in pins:
            problems.append(f"{name}: in the folder but not in wheels.txt")
    for name, version in pins.items():
        if name not in found:
            problems.append(f"{name}=={version}: in wheels.txt but no wheel in {folder}")
        elif version not in found[name]:
            problems.append(
                f"{name}: wheels.txt pins {version}, the folder has {', '.join(found[name])}"
            )
    for wheel in sorted(folder.glob("*.whl")):
        for req in requirements(wheel):
            dep = canonicalize_name(req.name)
            if dep not in found and dep not in PREINSTALLED and dep not in NOT_CARRIED:
                problems.append(
                    f"{wheel.name} needs {req}: neither in the folder nor on the GPU machine"
                )
            elif dep in found and not any(
                req.specifier.contains(v, prereleases=True) for v in found[dep]
            ):
                problems.append(
                    f"{wheel.name} needs {req}, the folder has {dep} {', '.join(found[dep])}"
                )
    return problems


def main(argv: list[str] | None = None) -> int:
    """Print the folder's wheels and total size, then its problems; 1 if there are any."""
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print("usage: python benchmarks/gpu/wheels.py WHEEL_FOLDER", file=sys.stderr)
        return 2
    folder = Path(args[0])
    if not folder.is_dir():
        print(f"wheel folder {folder}: not a folder", file=sys.stderr)
        return 1
    wheels = sorted(folder.glob("*.whl"))
    total = sum(w.stat().st_size for w in wheels)
    for w in wheels:
        print(f"{w.stat().st_size / 2**20:6.2f} MiB  {w.name}")
    print(f"{len(wheels)} wheels, {total / 2**20:.1f} MiB in {folder}")
    problems = check(folder, read_pins())
    for p in problems:
        print(f"problem: {p}", file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
