#!/usr/bin/env bash
# Collects, from this Debian machine's installed -dev packages (scripts/setup.sh), every library
# the build needs beyond what a GPU machine's image has (torch, nvcc, CMake, ninja, a C++
# compiler), into one relocatable folder, by default .device-deps/ (ignored by git), that travels
# with the tree to the GPU machine (docs/gpu.md). scripts/device_check.sh builds against it there.
#
#   scripts/device_deps.sh [DIR]
#
# The folder is a small install prefix, found through MIXTRAIN_DEPS_DIR=DIR (CMakeLists.txt
# prepends it to CMAKE_PREFIX_PATH and PKG_CONFIG_PATH):
#   include/          the packages' headers, as under /usr/include
#   lib/              the shared library with its soname links for what goes into mixtrain's
#                     own libraries (yaml-cpp, xxHash, PCRE2, SLEEF: Debian's .a files are not
#                     position-independent, and the Python module is a shared object), and for
#                     Google Benchmark (no .a shipped); static libraries for the test mains
#   lib/cmake/<pkg>/  CMake package configs written here, relative to their own location
#   lib/pkgconfig/    SLEEF's, xxHash's and PCRE2's .pc files, relative to their own location
#   README.md         what is in it and from which package version
# Rebuilt from scratch on every run; fails if a package is missing or the folder outgrows
# MAX_MIB (the device tool carries 64 MiB in all, the source tree included).
set -euo pipefail
cd "$(dirname "$0")/.."

OUT_DIR=${1:-.device-deps}
MAX_MIB=${MAX_MIB:-32}
MULTIARCH=$(gcc -print-multiarch)
SYSLIB=/usr/lib/$MULTIARCH

# Packages whose headers travel. libsleef-dev's sleef.h does not: nothing of ours includes it
# and the torch wheel ships its own, which must not be shadowed.
HEADER_PACKAGES=(libyaml-cpp-dev libtoml11-dev nlohmann-json3-dev libcli11-dev libxxhash-dev
                 libgtest-dev libgmock-dev libbenchmark-dev libgloo-dev libpcre2-dev)
ALL_PACKAGES=("${HEADER_PACKAGES[@]}" libsleef-dev)

die() {
  echo "device_deps: $*" >&2
  exit 1
}

# The upstream part of a package's version: 1:0.7.0+dfsg-8+b1 -> 0.7.0.
upstream_version() {
  dpkg-query -W -f='${Version}' "$1" | sed -E 's/^[0-9]+://; s/[-+~].*//'
}

for p in "${ALL_PACKAGES[@]}"; do
  [[ $(dpkg-query -W -f='${Status}' "$p" 2>/dev/null || true) == "install ok installed" ]] ||
    die "package $p is not installed (run scripts/setup.sh)"
done

rm -rf "$OUT_DIR"
mkdir -p "$OUT_DIR"/{include,lib/cmake,lib/pkgconfig}
DEPS=$(cd "$OUT_DIR" && pwd)

# --- headers: every file the package installs under /usr/include ------------------------------
for p in "${HEADER_PACKAGES[@]}"; do
  dpkg -L "$p" | grep '^/usr/include/' | while read -r f; do
    [[ -f $f ]] || continue
    rel=${f#/usr/include/}
    mkdir -p "$DEPS/include/$(dirname "$rel")"
    cp "$f" "$DEPS/include/$rel"
  done
done

# --- libraries ----------------------------------------------------------------------------------
for a in libgtest.a libgtest_main.a libgmock.a libgmock_main.a libbenchmark_main.a; do
  cp "$SYSLIB/$a" "$DEPS/lib/"
done
# A shared library: the file, its soname link (what a binary loads) and the plain .so (what the
# linker finds).
copy_shared() {
  local real soname
  real=$(readlink -f "$SYSLIB/$1.so")
  soname=$(objdump -p "$real" | awk '$1 == "SONAME" {print $2}')
  [[ -n $soname ]] || die "$real has no SONAME"
  cp "$real" "$DEPS/lib/"
  [[ $(basename "$real") == "$soname" ]] || ln -s "$(basename "$real")" "$DEPS/lib/$soname"
  ln -s "$soname" "$DEPS/lib/$1.so"
}
copy_shared libbenchmark  # Debian ships no libbenchmark.a
copy_shared libsleef      # nor libsleef.a
copy_shared libyaml-cpp   # the .a files: not -fPIC, so not for the Python module
copy_shared libxxhash
copy_shared libpcre2-8

# --- pkg-config files, relocated: the prefix is two folders above the .pc file -------------------
for pc in sleef libxxhash libpcre2-8; do
  sed -E -e 's|^prefix=.*|prefix=${pcfiledir}/../..|' \
         -e 's|^exec_prefix=.*|exec_prefix=${prefix}|' \
         -e 's|^libdir=.*|libdir=${prefix}/lib|' \
         -e 's|^includedir=.*|includedir=${prefix}/include|' \
         "$SYSLIB/pkgconfig/$pc.pc" >"$DEPS/lib/pkgconfig/$pc.pc"
done

# --- CMake package configs ----------------------------------------------------------------------
# Written here rather than copied: Debian's name /usr/lib/<multiarch>/*.so files. Each defines
# the targets CMakeLists.txt links, with paths relative to the config's folder (lib/cmake/<pkg>/).
# write_config PACKAGE DEB_PACKAGE BODY: <PACKAGE>Config.cmake and a version file (any requested
# version up to the packaged one is compatible).
write_config() {
  local name=$1 deb=$2 body=$3 version dir
  version=$(upstream_version "$deb")
  dir="$DEPS/lib/cmake/$name"
  mkdir -p "$dir"
  cat >"$dir/${name}Config.cmake" <<EOF
# $name $version from Debian's $deb, collected by scripts/device_deps.sh.
get_filename_component(_mixtrain_deps "\${CMAKE_CURRENT_LIST_DIR}/../../.." ABSOLUTE)
include(CMakeFindDependencyMacro)
$body
set(${name}_VERSION "$version")
unset(_mixtrain_deps)
EOF
  cat >"$dir/${name}ConfigVersion.cmake" <<EOF
set(PACKAGE_VERSION "$version")
if(PACKAGE_FIND_VERSION VERSION_GREATER PACKAGE_VERSION)
  set(PACKAGE_VERSION_COMPATIBLE FALSE)
else()
  set(PACKAGE_VERSION_COMPATIBLE TRUE)
  if(PACKAGE_FIND_VERSION VERSION_EQUAL PACKAGE_VERSION)
    set(PACKAGE_VERSION_EXACT TRUE)
  endif()
endif()
EOF
}

# imported TARGET KIND [FILE] [LINKS]: one imported target, its headers under include/.
imported() {
  local target=$1 kind=$2 file=${3:-} links=${4:-}
  echo "if(NOT TARGET $target)"
  echo "  add_library($target $kind IMPORTED)"
  echo "  set_target_properties($target PROPERTIES"
  echo "    INTERFACE_INCLUDE_DIRECTORIES \"\${_mixtrain_deps}/include\""
  [[ -n $file ]] && echo "    IMPORTED_LOCATION \"\${_mixtrain_deps}/lib/$file\""
  [[ -n $file && $kind == SHARED ]] &&
    echo "    IMPORTED_SONAME \"$(objdump -p "$DEPS/lib/$file" | awk '$1 == "SONAME" {print $2}')\""
  [[ -n $links ]] && echo "    INTERFACE_LINK_LIBRARIES \"$links\""
  echo "  )"
  echo "endif()"
}

write_config yaml-cpp libyaml-cpp-dev "$(imported yaml-cpp SHARED "$(readlink "$DEPS/lib/libyaml-cpp.so")")
set(YAML_CPP_INCLUDE_DIR \"\${_mixtrain_deps}/include\")
set(YAML_CPP_LIBRARIES yaml-cpp)"
write_config toml11 libtoml11-dev "$(imported toml11::toml11 INTERFACE)"
write_config nlohmann_json nlohmann-json3-dev "$(imported nlohmann_json::nlohmann_json INTERFACE)"
write_config CLI11 libcli11-dev "$(imported CLI11::CLI11 INTERFACE)"
# GTEST_HAS_PTHREAD=1: how Debian built the library (its GTestTargets.cmake says so too).
write_config GTest libgtest-dev "find_dependency(Threads)
$(imported GTest::gtest STATIC libgtest.a Threads::Threads)
set_property(TARGET GTest::gtest PROPERTY INTERFACE_COMPILE_DEFINITIONS GTEST_HAS_PTHREAD=1)
$(imported GTest::gtest_main STATIC libgtest_main.a 'GTest::gtest;Threads::Threads')
$(imported GTest::gmock STATIC libgmock.a 'GTest::gtest;Threads::Threads')
$(imported GTest::gmock_main STATIC libgmock_main.a 'GTest::gmock;Threads::Threads')"
write_config benchmark libbenchmark-dev "find_dependency(Threads)
$(imported benchmark::benchmark SHARED "$(readlink "$DEPS/lib/libbenchmark.so")" Threads::Threads)
$(imported benchmark::benchmark_main STATIC libbenchmark_main.a benchmark::benchmark)"

# --- checks -------------------------------------------------------------------------------------
# No header here may shadow one of the torch wheel's (include/ comes after torch's include
# folders, but a package's own folder is a search path of its own).
PY=${MIXTRAIN_PYTHON:-.venv/bin/python}
if TORCH_INCLUDE=$("$PY" -c 'import os, torch; print(os.path.join(os.path.dirname(torch.__file__), "include"))' 2>/dev/null); then
  clash=$(comm -12 <(ls "$DEPS/include" | sort) <(ls "$TORCH_INCLUDE" | sort))
  [[ -z $clash ]] || die "headers also in the torch wheel ($TORCH_INCLUDE): $clash"
else
  echo "device_deps: no torch in $PY; the check against the wheel's headers was skipped" >&2
fi
bytes=$(du -sb "$DEPS" | cut -f1)
((bytes <= MAX_MIB * 1024 * 1024)) || die "$DEPS is $bytes bytes, over MAX_MIB=$MAX_MIB MiB"

# --- README -------------------------------------------------------------------------------------
{
  echo "# Build dependencies for a GPU machine"
  echo
  echo "Collected by scripts/device_deps.sh on $(date -u +%Y-%m-%d) from $(. /etc/os-release && echo "$PRETTY_NAME")"
  echo "($MULTIARCH); see docs/gpu.md. $bytes bytes. Nothing here runs on this machine's build"
  echo "unless MIXTRAIN_DEPS_DIR names this folder."
  echo
  echo "| Debian package | version | what travels |"
  echo "| --- | --- | --- |"
  for p in "${ALL_PACKAGES[@]}"; do
    case $p in
      libyaml-cpp-dev) what="headers, libyaml-cpp.so.*, lib/cmake/yaml-cpp" ;;
      libtoml11-dev) what="headers (header-only), lib/cmake/toml11" ;;
      nlohmann-json3-dev) what="headers (header-only), lib/cmake/nlohmann_json" ;;
      libcli11-dev) what="headers (header-only), lib/cmake/CLI11" ;;
      libxxhash-dev) what="headers, libxxhash.so.*, lib/pkgconfig/libxxhash.pc" ;;
      libpcre2-dev) what="headers, libpcre2-8.so.*, lib/pkgconfig/libpcre2-8.pc" ;;
      libgtest-dev) what="headers, libgtest.a, libgtest_main.a, lib/cmake/GTest" ;;
      libgmock-dev) what="headers, libgmock.a, libgmock_main.a (in lib/cmake/GTest)" ;;
      libbenchmark-dev) what="headers, libbenchmark.so.* (no .a shipped), libbenchmark_main.a, lib/cmake/benchmark" ;;
      libgloo-dev) what="headers only: c10d's ProcessGroupGloo.hpp includes them; the wheel's libtorch_cpu holds Gloo itself" ;;
      libsleef-dev) what="libsleef.so.* (no .a shipped), lib/pkgconfig/sleef.pc; not sleef.h (the wheel has its own)" ;;
    esac
    echo "| $p | $(dpkg-query -W -f='${Version}' "$p") | $what |"
  done
} >"$DEPS/README.md"

echo "device_deps: $DEPS: $((bytes / 1024)) KiB"
