#!/usr/bin/env bash
# Build, on a machine with network access, the wheels a GPU machine without it
# needs, into .whl/ (scripts/gpu_session.sh installs them from there).
#
# Chainer 7.8.1 is published only as a source archive whose setup.py imports
# pkg_resources, so it is built here into a pure-Python wheel under
# constraints-chainer.txt (setuptools<82).  pgmo's device layer reaches CUDA's
# virtual memory through cuda-bindings (without it the arena falls back to
# cudaMalloc and the quick check fails), whose major version must be the CUDA
# major of the GPU machine's CuPy (cupy-cuda13x: --cuda 13, the default;
# cupy-cuda12x: --cuda 12); it needs cuda-pathfinder, fetched beside it.  The
# quick check measures each process's device memory through NVML: nvidia-ml-py.
# pgmo itself needs no wheel: scripts/gpu_session.sh runs it from the checkout.
# The GPU machine must have CuPy for its CUDA, NumPy and Chainer's dependencies
# (filelock, protobuf, six, typing-extensions, setuptools) installed already.
#
#   scripts/fetch_gpu_wheels.sh            # Chainer, cuda-bindings 13.x, cuda-pathfinder and
#                                          # nvidia-ml-py (about 10 MiB)
#   scripts/fetch_gpu_wheels.sh --cuda 12  # cuda-bindings 12.x, for cupy-cuda12x
#   scripts/fetch_gpu_wheels.sh --ortools  # also OR-Tools, for pgmo's exact solver
#   scripts/fetch_gpu_wheels.sh --mpi      # also mpi4py and MPICH, for ChainerMN (step mn)
#
# Environment: PYTHON, the Python whose pip builds the wheels (default python3);
# MAX_WHEEL_MIB, the most .whl/ may hold (default 48, so that the checkout
# with its wheels stays small enough to copy in one go: --ortools and --mpi
# together exceed it).  .whl/ is ignored by git: copy it with the checkout to
# the GPU machine.  Wheels are for CPython 3.12 on x86-64 Linux.
set -euo pipefail
trap 'echo "fetch_gpu_wheels: stopped (Ctrl-C)" >&2; exit 130' INT

# Options first: a mistake costs no download.
cuda=13
extras=()
while (( $# )); do
    case $1 in
        --cuda)
            if [[ $# -lt 2 || ! $2 =~ ^(12|13)$ ]]; then
                echo "error: --cuda takes 12 or 13 (the CUDA major of the GPU machine's CuPy)" >&2
                exit 2
            fi
            cuda=$2
            shift 2 ;;
        --ortools|--mpi)
            extras+=("$1")
            shift ;;
        *)
            echo "error: unknown option $1 (options: --cuda 12|13 --ortools --mpi)" >&2
            exit 2 ;;
    esac
done

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

# cuda-bindings of the CuPy wheel's CUDA major, as pgmo's cuda12/cuda13 extras pin it.
case $cuda in
    13) bindings='cuda-bindings>=13,<14' ;;
    12) bindings='cuda-bindings>=12.6,<13' ;;
esac
echo "downloading $bindings, cuda-pathfinder and nvidia-ml-py for cp312 manylinux x86-64"
download "$bindings" cuda-pathfinder nvidia-ml-py

for option in ${extras[@]+"${extras[@]}"}; do
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
