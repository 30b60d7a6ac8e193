#!/usr/bin/env bash
# Build, on a machine with network access, the wheels a GPU machine without it
# needs, into .whl/ (scripts/gpu_session.sh installs them from there).
#
# Chainer 7.8.1 is published only as a source archive whose setup.py imports
# pkg_resources, so it is built here into a pure-Python wheel under
# constraints-chainer.txt (setuptools<82).  pgmo itself needs no wheel:
# scripts/gpu_session.sh runs it from the checkout.  The GPU machine must have
# CuPy for its CUDA, NumPy and Chainer's dependencies (filelock, protobuf, six,
# typing-extensions, setuptools) installed already.
#
#   scripts/fetch_gpu_wheels.sh            # Chainer only (about 1 MiB)
#   scripts/fetch_gpu_wheels.sh --ortools  # also OR-Tools, for pgmo's exact solver
#   scripts/fetch_gpu_wheels.sh --mpi      # also mpi4py and MPICH, for ChainerMN (step mn)
#
# Environment: PYTHON, the Python whose pip builds the wheels (default python3);
# MAX_WHEEL_MIB, the most .whl/ may hold (default 48, so that the checkout
# with its wheels stays small enough to copy in one go).  .whl/ is ignored by
# git: copy it with the checkout to the GPU machine.
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
python=${PYTHON:-python3}
max_mib=${MAX_WHEEL_MIB:-48}
dest=.whl
mkdir -p "$dest"

echo "building chainer 7.8.1 (pure Python) into $dest/"
PIP_CONSTRAINT=constraints-chainer.txt PIP_BUILD_CONSTRAINT=constraints-chainer.txt \
    "$python" -m pip wheel -q --no-deps --no-cache-dir -w "$dest" chainer==7.8.1

# Binary wheels for CPython 3.12 on x86-64 Linux: change --python-version for
# another Python.
download() {
    "$python" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
        --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 \
        --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 -d "$dest" "$@"
}

for option in "$@"; do
    case $option in
        --ortools)
            # About 29 MiB.  OR-Tools needs protobuf>=6.33.1,<6.34: check `python3 -m
            # pip show protobuf` on the GPU machine first.  Not needed by `pytest -m gpu`.
            echo "downloading ortools and immutabledict for cp312 manylinux x86-64"
            download ortools==9.15.6755 immutabledict ;;
        --mpi)
            # About 15 MiB: mpi4py and MPICH's library with its mpiexec (no system MPI needed).
            echo "downloading mpi4py and mpich for cp312 manylinux x86-64"
            download 'mpi4py>=4.1' 'mpich>=5.0' ;;
        *)
            echo "error: unknown option $option (options: --ortools --mpi)" >&2
            exit 2 ;;
    esac
done

# gpu_session.sh installs every wheel in .whl/ at once: two versions of one
# package would stop that install, so refuse them here.
dups=$(ls "$dest"/*.whl | xargs -n1 basename | cut -d- -f1 | tr 'A-Z-' 'a-z_' | sort | uniq -d)
if [[ -n "$dups" ]]; then
    echo "error: several wheels of: $dups (keep one version each)" >&2
    exit 1
fi

total=$(du -cb "$dest"/*.whl | tail -1 | cut -f1)
ls -l "$dest"
echo "total: $total bytes"
if (( total > max_mib * 1024 * 1024 )); then
    echo "error: wheels exceed $max_mib MiB (MAX_WHEEL_MIB); remove what is not needed" >&2
    exit 1
fi
