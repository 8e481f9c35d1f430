#!/usr/bin/env bash
# Download, on a machine WITH network, the wheels that the GPU machine lacks (benchmarks/gpu/
# wheels.txt: rl8's runtime dependencies beyond the machine's image, and rsl-rl-lib), built for
# its Python (CPython 3.12, manylinux x86-64), into one folder; then check the folder
# (wheels.py: one wheel per pin, nothing missing) and print its size. Never downloads torch.
#
#   benchmarks/gpu/prepare_wheels.sh [FOLDER]      # default: .whl at the repository root
#
# The folder is carried to the GPU machine beside the checkout, where benchmarks/gpu/check.sh
# installs it with pip --no-index. Keep it out of git (e.g. `echo /.whl/ >> .git/info/exclude`).
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
root="$(cd "$here/../.." && pwd)"
dest="${1:-$root/.whl}"
python="${PYTHON:-python3}"
mkdir -p "$dest"
mapfile -t pins < <(sed -e 's/#.*//' -e 's/[[:space:]]//g' "$here/wheels.txt" | grep -v '^$')
echo "downloading ${#pins[@]} wheels into $dest"
# pip matches manylinux_2_N exactly: name every N a wheel of wheels.txt is built for (glibc
# 2.28 at most, so that the wheels also fit a machine older than the GPU machine's Ubuntu)
"$python" -m pip download --quiet --no-deps --only-binary=:all: \
    --python-version 3.12 --implementation cp --abi cp312 --abi abi3 --abi none \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 \
    --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 --platform manylinux1_x86_64 \
    --platform any \
    -d "$dest" "${pins[@]}"
"$python" "$here/wheels.py" "$dest"
echo "folder size: $(du -sh "$dest" | cut -f1) ($dest)"
