#!/usr/bin/env bash
# Makes `silod mount` runnable on a GPU machine from the bundle bench/gpu_bundle.sh made (run it from the
# repository's root there): installs the wheels into SITE (default /tmp/silod-site), compiles pyfuse3's
# Cython output against the bundled libfuse3 (its library found through an rpath, so nothing is installed
# system-wide), and puts a `silod` command beside the Python that runs it, where the benchmarks look for it.
# Then run, from the repository's root:
#
#     PYTHONPATH=/tmp/silod-site:. PATH=$PWD/.gpu-bundle/root/bin:$PATH python3 bench/pytorch_gpu.py
set -euo pipefail

bundle=$(realpath "${1:-.gpu-bundle}")
site=${SITE:-/tmp/silod-site}
python=${PYTHON:-python3}
repo=$PWD

mkdir -p "$site"
"$python" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$site" \
    "$bundle"/wheels/*.whl

source_dir=$(mktemp -d)
tar xzf "$bundle"/pyfuse3-*.tar.gz -C "$source_dir" --strip-components=1
src="$source_dir/src/pyfuse3"
mkdir -p "$site/pyfuse3"
cp "$src"/_pyfuse3.py "$src"/asyncio.py "$src"/__init__.pyi "$src"/py.typed "$site/pyfuse3/"
library=$(dirname "$(find "$bundle/root" -name 'libfuse3.so.3' | head -1)")
include=$("$python" -c 'import sysconfig; print(sysconfig.get_paths()["include"])')
suffix=$("$python" -c 'import sysconfig; print(sysconfig.get_config_var("EXT_SUFFIX"))')
# The flags of pyfuse3's own build (its util/build_backend.py), with the bundle's headers and library.
gcc -shared -fPIC -O2 -DFUSE_USE_VERSION=32 -I"$include" -I"$bundle/root/usr/include/fuse3" \
    -I"$source_dir/Include" -I"$src" "$src/__init__.c" -o "$site/pyfuse3/__init__$suffix" \
    -L"$library" -l:libfuse3.so.3 -Wl,-rpath,"$library" -lpthread -lrt
rm -rf "$source_dir"

launcher="$(dirname "$("$python" -c 'import sys; print(sys.executable)')")/silod"
printf '#!/bin/sh\nPYTHONPATH=%s:%s${PYTHONPATH:+:$PYTHONPATH} exec %s -m silodcli.main "$@"\n' \
    "$site" "$repo" "$("$python" -c 'import sys; print(sys.executable)')" > "$launcher"
chmod +x "$launcher"
PYTHONPATH="$site:$repo" "$python" -c 'import pyfuse3, trio, silodcli.fuse_client; print("the mount imports load")'
"$launcher" mount --help > /dev/null
echo "silod is $launcher" >&2
