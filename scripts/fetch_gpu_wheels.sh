#!/usr/bin/env bash
# Collect, on this machine, the wheels the GPU device machine lacks, into .whl/.
#
# The device image (see /work/.library/device/KINDS.md) has Python 3.12, CuPy
# 14 (cupy-cuda13x), NumPy 2.5, pytest, hypothesis, scipy, matplotlib, tqdm and
# every dependency of Chainer (filelock, protobuf, six, typing-extensions,
# setuptools), but not Chainer itself, and nothing can be downloaded there.
# Chainer 7.8.1 is published only as an sdist whose setup.py imports
# pkg_resources, so it is built here into a pure-Python wheel with setuptools<82
# (constraints-chainer.txt).  pgmo itself travels as source: the device command
# puts the repository root on PYTHONPATH.
#
#   scripts/fetch_gpu_wheels.sh            # chainer only (about 1 MiB)
#   scripts/fetch_gpu_wheels.sh --ortools  # also OR-Tools, for pgmo's exact solver
#
# .whl/ is git-ignored; name it in the device call's carry list.
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
python=${PYTHON:-python3}
dest=.whl
mkdir -p "$dest"

echo "building chainer 7.8.1 (pure Python) into $dest/"
PIP_CONSTRAINT=constraints-chainer.txt PIP_BUILD_CONSTRAINT=constraints-chainer.txt \
    "$python" -m pip wheel -q --no-deps --no-cache-dir -w "$dest" chainer==7.8.1

if [[ "${1:-}" == "--ortools" ]]; then
    # Binary wheel (about 29 MiB) for the device's CPython 3.12 on x86-64.  Its
    # needs are on the device except immutabledict, but it pins
    # protobuf>=6.33.1,<6.34: check `python3 -m pip show protobuf` there first.
    # Not needed by `pytest -m gpu`.
    echo "downloading ortools and immutabledict for cp312 manylinux x86-64"
    "$python" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
        --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 \
        --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
        -d "$dest" ortools==9.15.6755 immutabledict
fi

# The device installs every wheel in .whl/ at once: two versions of one
# package would stop that install, so refuse them here.
dups=$(ls "$dest"/*.whl | xargs -n1 basename | cut -d- -f1 | tr 'A-Z-' 'a-z_' | sort | uniq -d)
if [[ -n "$dups" ]]; then
    echo "error: several wheels of: $dups (keep one version each)" >&2
    exit 1
fi

total=$(du -cb "$dest"/*.whl | tail -1 | cut -f1)
ls -l "$dest"
echo "total: $total bytes"
if (( total > 48 * 1024 * 1024 )); then
    # The whole working tree that travels to the device is limited to 64 MiB.
    echo "error: wheels exceed 48 MiB; the device call carries at most 64 MiB in all" >&2
    exit 1
fi
