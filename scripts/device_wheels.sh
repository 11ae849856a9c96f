#!/usr/bin/env bash
# Fetch, as wheels into .whl/ (ignored by git), the Python packages that the GPU
# machine's image lacks: apache-tvm-ffi with what it needs, and torch-c-dlpack-ext
# (whose only need, torch, the image has). scripts/gpu_check.sh installs them from
# there without a network. Run it here, then give the device tool carry [".whl"].
#
#   bash scripts/device_wheels.sh [NAME==VERSION ...]   # extra packages, without their needs
#
# The versions are the ones installed here, so that caches and results match this
# machine's; override with TVM_FFI_VERSION / DLPACK_EXT_VERSION. DEVICE_PYTHON (3.12)
# and the manylinux x86_64 tags below describe the GPU machine.
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
cd "$repo"

installed() {  # the version of distribution $1 installed here, or nothing
  python3 -c 'import importlib.metadata as m, sys
try:
    print(m.version(sys.argv[1]))
except m.PackageNotFoundError:
    pass' "$1"
}
tvm_ffi=${TVM_FFI_VERSION:-$(installed apache-tvm-ffi)}
dlpack_ext=${DLPACK_EXT_VERSION:-$(installed torch-c-dlpack-ext)}
if [ -z "$tvm_ffi" ] || [ -z "$dlpack_ext" ]; then
  echo "device_wheels.sh: apache-tvm-ffi or torch-c-dlpack-ext is not installed here;" \
    "set TVM_FFI_VERSION and DLPACK_EXT_VERSION" >&2
  exit 2
fi

target=(
  --only-binary=:all: --implementation cp --python-version "${DEVICE_PYTHON:-3.12}"
  --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64
  --platform manylinux_2_24_x86_64 --platform manylinux_2_17_x86_64
  --platform manylinux2014_x86_64
)
mkdir -p .whl
download() { python3 -m pip download -q --disable-pip-version-check "${target[@]}" -d .whl "$@"; }
download "apache-tvm-ffi==$tvm_ffi"
download --no-deps "torch-c-dlpack-ext==$dlpack_ext" "$@"
ls -1 .whl
