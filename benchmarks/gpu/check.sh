#!/usr/bin/env bash
# The prepared GPU check (benchmarks/gpu/README.md), for a machine with one NVIDIA GPU, torch
# installed, no network, and the wheels of benchmarks/gpu/prepare_wheels.sh carried beside the
# checkout. In under 8 minutes: installs the wheels, prints the GPU and the torch/CUDA
# versions, runs the CUDA tests (at most 70 s), then rl8 against rsl_rl on the GPU
# (benchmarks/gpu/bench.py, at most 165 s of measurements) and on MuJoCo Playground's
# CartpoleBalance on MJX (benchmarks/peers/playground.py, at most 195 s) and prints the tables,
# also written to $OUT/gpu_table.md when OUT is set (with the whole log in $OUT/gpu_check.log).
#
#   benchmarks/gpu/check.sh                  # on the GPU machine, from anywhere in the checkout
#   benchmarks/gpu/check.sh --cpu-dry-run    # the same steps on CPU, tiny sizes, no nvidia-smi
#
# Environment: PYTHON (default python3), RL8_WHEELS (the wheels' folder, default .whl at the
# repository root), RL8_SITE (where they are installed, default /tmp/site; a temporary folder
# in the dry run), RL8_RSL_RL_PYTHON (the Python of rsl_rl's side, default PYTHON),
# RL8_COMMIT (the commit the table names, where the copied checkout has no .git),
# RL8_GPU_TESTS (what pytest collects, default tests), RL8_GPU_DRY_ENVS (the dry run's env
# counts, default "64 128"), OUT (a folder for the table and the log).
set -uo pipefail
root="$(cd "$(dirname "$0")/../.." && pwd)"
cd "$root"
dry=0
case "${1:-}" in
    --cpu-dry-run) dry=1 ;;
    "") ;;
    *) echo "usage: $0 [--cpu-dry-run]  (got: $1)" >&2; exit 2 ;;
esac
py="${PYTHON:-python3}"
wheels="${RL8_WHEELS:-$root/.whl}"
out="${OUT:-}"
if [ -n "$out" ]; then
    mkdir -p "$out"
    exec > >(tee "$out/gpu_check.log") 2>&1
fi
start=$SECONDS
step() { echo; echo "== $* (at $((SECONDS - start)) s)"; }

step "1/5 the wheels ($wheels)"
if [ $dry = 1 ] && [ -z "${RL8_SITE:-}" ]; then
    site="$(mktemp -d)"
    trap 'rm -rf "$site"' EXIT
else
    site="${RL8_SITE:-/tmp/site}"
fi
if compgen -G "$wheels/*.whl" >/dev/null; then
    if [ $dry = 1 ] && ! "$py" -c 'import sys; sys.exit(sys.version_info[:2] != (3, 12))'; then
        echo "dry run: $py is not Python 3.12 (the wheels' Python): not installed; using its own packages"
    else
        "$py" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
            --target "$site" "$wheels"/*.whl || { echo "installing the wheels into $site failed" >&2; exit 1; }
        export PYTHONPATH="$site${PYTHONPATH:+:$PYTHONPATH}"
        echo "installed $(ls "$wheels"/*.whl | wc -l) wheels into $site; pip check (for information):"
        "$py" -m pip check 2>&1 | head -n 20
    fi
elif [ $dry = 1 ]; then
    echo "dry run: no wheels in $wheels; using $py's own packages"
else
    echo "no wheels in $wheels: run benchmarks/gpu/prepare_wheels.sh where there is network, and carry the folder" >&2
    exit 1
fi
export PYTHONPATH="$root${PYTHONPATH:+:$PYTHONPATH}"  # this checkout's rl8 first
# JAX (step 3's JAX test, step 5) takes 75% of the GPU memory at its start unless told not to; torch shares it
export XLA_PYTHON_CLIENT_PREALLOCATE="${XLA_PYTHON_CLIENT_PREALLOCATE:-false}"

step "2/5 the machine"
if [ $dry = 0 ]; then
    nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader || echo "nvidia-smi failed"
fi
"$py" - "$dry" <<'EOF' || exit 1
import importlib.metadata as m
import platform
import sys

import torch

import rl8

dry = sys.argv[1] == "1"
print(f"Python {platform.python_version()}; torch {torch.__version__}, CUDA {torch.version.cuda}, "
      f"cuDNN {torch.backends.cudnn.version()}; rl8 {rl8.__version__} from {rl8.__file__}")
print("; ".join(f"{d} {m.version(d)}" for d in ("tensordict", "gymnasium", "mlflow-skinny", "sqlalchemy")),
      end="; ")
try:
    print(f"rsl-rl-lib {m.version('rsl-rl-lib')}")
except m.PackageNotFoundError:
    print("rsl-rl-lib not installed")
if torch.cuda.is_available():
    p = torch.cuda.get_device_properties(0)
    print(f"GPU: {p.name}, {p.total_memory / 2**30:.0f} GiB, {p.multi_processor_count} SMs, "
          f"capability {p.major}.{p.minor}")
elif dry:
    print("dry run: no GPU used")
else:
    sys.exit("torch sees no CUDA device: stopping")
EOF

step "3/5 the CUDA tests (pytest -k 'cuda or gpu', at most 70 s)"
# shellcheck disable=SC2086  # RL8_GPU_TESTS may name several paths
timeout 70 "$py" -m pytest ${RL8_GPU_TESTS:-tests} -q -p no:cacheprovider -k "cuda or gpu" -rs \
    --continue-on-collection-errors
echo "pytest exit status: $? (0: passed; 5: none selected; 124: stopped at 70 s)"

step "4/5 rl8 against rsl_rl (benchmarks/gpu/bench.py)"
if [ $dry = 1 ]; then
    bench=(--device cpu --rounds 1 --warmup 1 --iters 1 --threads 1 --no-compile --budget 120)
    for n in ${RL8_GPU_DRY_ENVS:-64 128}; do bench+=(--envs "$n"); done
else
    bench=(--device cuda --budget 165)
fi
timeout 185 "$py" benchmarks/gpu/bench.py "${bench[@]}" --rsl-rl-python "${RL8_RSL_RL_PYTHON:-$py}" \
    ${out:+--out "$out/gpu_table.md"}
status=$?

step "5/5 rl8 against rsl_rl on MuJoCo Playground's CartpoleBalance, MJX (benchmarks/peers/playground.py)"
if ! why="$("$py" -c 'import mujoco_playground' 2>&1)"; then
    echo "skipped: mujoco_playground does not import with $py (${why##*$'\n'}); its wheels are in wheels.txt"
else
    if [ $dry = 1 ]; then
        pg=(--device cpu --num-envs 16 --warmup 1 --iters 1 --threads 1 --budget 5 --timeout 120)
    else
        pg=(--device cuda --num-envs 4096 --warmup 2 --iters 10 --threads 4 --budget 60 --timeout 95 --rsl-rl-path "")
    fi
    timeout 195 "$py" benchmarks/peers/playground.py "${pg[@]}" --sides rl8,rsl_rl --rounds 1 --target-return 900 \
        ${out:+--out "$out/gpu_table.md"}
    echo "playground.py exit status: $? (124: stopped at 195 s)"
fi
step "done: bench.py exit status $status"
exit $status
