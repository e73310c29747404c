#!/usr/bin/env bash
# Builds libmscclpp_nccl (the NCCL-compatible C library) and installs it under a prefix:
#   PREFIX/include/mscclpp_nccl/{nccl.h,mscclpp_nccl_ext.h}
#   PREFIX/lib/libmscclpp_nccl.so.VERSION, .so.MAJOR (its SONAME) and .so links
#   PREFIX/lib/pkgconfig/mscclpp_nccl.pc (Libs carry an rpath: no LD_LIBRARY_PATH needed)
#   PREFIX/lib/libnccl.so.2 -> the library, with --nccl-name (drop-in for programs linked to NCCL)
#
# Usage: scripts/install.sh --prefix DIR [--debug] [--nccl-name] [--features cuda|rocm]
#   --debug     install the debug build (target/debug) instead of a release build
#   --features  the GPU backend to build (default: the host backend, no GPU toolkit needed)
# Then: cc app.c $(PKG_CONFIG_PATH=DIR/lib/pkgconfig pkg-config --cflags --libs mscclpp_nccl)
set -euo pipefail
cd "$(dirname "$0")/.."

usage() { sed -n '2,12s/^# \{0,1\}//p' "$0"; }
prefix="" profile=release nccl_name=0 features=()
while [ $# -gt 0 ]; do
  case "$1" in
    --prefix) [ $# -ge 2 ] || { echo "install.sh: --prefix needs a directory" >&2; exit 2; }
              prefix=$2; shift ;;
    --prefix=*) prefix=${1#--prefix=} ;;
    --debug) profile=debug ;;
    --nccl-name) nccl_name=1 ;;
    --features) [ $# -ge 2 ] || { echo "install.sh: --features needs cuda or rocm" >&2; exit 2; }
                features=(--features "$2"); shift ;;
    -h|--help) usage; exit 0 ;;
    *) echo "install.sh: unknown argument '$1'" >&2; usage >&2; exit 2 ;;
  esac
  shift
done
[ -n "$prefix" ] || { echo "install.sh: --prefix DIR is required" >&2; usage >&2; exit 2; }
mkdir -p "$prefix"
prefix=$(cd "$prefix" && pwd)

[ -x "$HOME/.cargo/bin/cargo" ] && export PATH="$PATH:$HOME/.cargo/bin"
# The version cargo builds (workspace version), e.g. path+file:///x/core/nccl#mscclpp-nccl@0.1.0
version=$(cargo pkgid -p mscclpp-nccl | sed 's/.*@//')
major=${version%%.*}
build=(cargo build -p mscclpp-nccl "${features[@]}")
[ $profile = release ] && build+=(--release)
echo "install.sh: ${build[*]} (version $version)"
"${build[@]}"

lib=target/$profile/libmscclpp_nccl.so
libdir=$prefix/lib incdir=$prefix/include/mscclpp_nccl
install -d "$libdir/pkgconfig" "$incdir"
install -m 644 core/nccl/include/*.h "$incdir/"
install -m 755 "$lib" "$libdir/libmscclpp_nccl.so.$version"
ln -sfn "libmscclpp_nccl.so.$version" "$libdir/libmscclpp_nccl.so.$major"
ln -sfn "libmscclpp_nccl.so.$major" "$libdir/libmscclpp_nccl.so"
if [ $nccl_name = 1 ]; then
  ln -sfn "libmscclpp_nccl.so.$version" "$libdir/libnccl.so.2"
fi
cat > "$libdir/pkgconfig/mscclpp_nccl.pc" <<PC
prefix=$prefix
libdir=\${prefix}/lib
includedir=\${prefix}/include/mscclpp_nccl

Name: mscclpp_nccl
Description: NCCL 2.28 C ABI over mscclpp-rs (libmscclpp_nccl)
Version: $version
Cflags: -I\${includedir}
Libs: -L\${libdir} -Wl,-rpath,\${libdir} -lmscclpp_nccl
PC
echo "install.sh: installed into $prefix:"
(cd "$prefix" && find include/mscclpp_nccl lib -maxdepth 2 \( -type f -o -type l \) | sort | sed 's/^/  /')
echo "install.sh: build with: cc app.c \$(PKG_CONFIG_PATH=$libdir/pkgconfig pkg-config --cflags --libs mscclpp_nccl)"
