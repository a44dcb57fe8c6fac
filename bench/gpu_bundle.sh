#!/usr/bin/env bash
# Gathers, on this machine, what `silod mount` needs on a GPU machine that has PyTorch but no package registry
# and no libfuse (the device machines of docs/benchmarks.md, "The GPU check"): wheels of the mount's
# dependencies that such an image lacks, for its Python (default 3.12), pinned to this environment's versions;
# pyfuse3's source, which has no wheel and is compiled there by bench/gpu_setup.sh; and Debian's libfuse3,
# its headers and fusermount3, unpacked. Writes BUNDLE (default .gpu-bundle, which git ignores), about 12 MB.
#
#     bench/gpu_bundle.sh [BUNDLE]        # then carry BUNDLE along and run bench/gpu_setup.sh there
set -euo pipefail

bundle=${1:-.gpu-bundle}
python=${PYTHON:-.venv/bin/python}
target_python=${GPU_PYTHON_VERSION:-3.12}
# Imported by the mount and missing from the GPU image (or older there than the committed stubs need).
wheels="trio outcome sniffio bitarray xxhash protobuf grpcio"

pins=$("$python" -c 'import sys
from importlib.metadata import version
print(" ".join(f"{name}=={version(name)}" for name in sys.argv[1:]))' $wheels pyfuse3)
rm -rf "$bundle"
mkdir -p "$bundle/wheels" "$bundle/debs" "$bundle/root"
echo "wheels for Python $target_python: $pins" >&2
# shellcheck disable=SC2086 # one argument per pin
"$python" -m pip download -q --no-deps --only-binary=:all: -d "$bundle/wheels" \
    --python-version "$target_python" --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
    ${pins% pyfuse3==*}
"$python" -m pip download -q --no-deps --no-binary=:all: -d "$bundle" "pyfuse3==${pins##*pyfuse3==}"
(cd "$bundle/debs" && apt-get download -q -o APT::Sandbox::User=root libfuse3-3 libfuse3-dev fuse3)
for deb in "$bundle"/debs/*.deb; do dpkg-deb -x "$deb" "$bundle/root"; done
rm -rf "$bundle/debs"
du -sh "$bundle" >&2
