#!/usr/bin/env bash
# Installs everything mixtrain needs to build, test and run:
#  - Debian packages (compiler, CMake, libraries, test frameworks);
#  - .venv, a project-local Python virtual environment (Debian's python3) holding the pinned
#    packages of scripts/python-requirements.txt from PyPI: the torch wheel is LibTorch
#    (headers, shared libraries, CMake config); Python torch and safetensors serve the tests.
# Idempotent and silent when everything is present. GNU make is the only prerequisite.
set -euo pipefail
cd "$(dirname "$0")/.."

# libpcre2-dev: the regex engine of the tokenizer's pre-tokenizer (data/bpe_tokenizer).
# libgloo-dev: headers only. The torch wheel carries Gloo inside libtorch_cpu but not its
# headers, which c10d's ProcessGroupGloo.hpp includes.
# ninja-build and lld: the build's generator and linker (docs/development.md).
# python3-dev: Python.h, for the Python package's extension module (docs/python.md).
PACKAGES=(
  build-essential cmake ninja-build lld pkg-config ccache clang-format python3 python3-venv
  python3-dev
  libgloo-dev libsleef-dev
  libyaml-cpp-dev libtoml11-dev nlohmann-json3-dev libcli11-dev libxxhash-dev libpcre2-dev
  libgtest-dev libgmock-dev libbenchmark-dev
)

missing=()
for p in "${PACKAGES[@]}"; do
  status=$(dpkg-query -W -f='${Status}' "$p" 2>/dev/null || true)
  [[ "$status" == "install ok installed" ]] || missing+=("$p")
done
if [[ ${#missing[@]} -gt 0 ]]; then
  cmd="apt-get install -y --no-install-recommends ${missing[*]}"
  if [[ $(id -u) -ne 0 ]]; then
    if command -v sudo >/dev/null 2>&1 && sudo -n true 2>/dev/null; then
      SUDO=sudo
    else
      echo "mixtrain setup: missing Debian packages. Run as root:" >&2
      echo "  apt-get update && $cmd" >&2
      exit 1
    fi
  else
    SUDO=
  fi
  echo "mixtrain setup: installing ${missing[*]}" >&2
  export DEBIAN_FRONTEND=noninteractive
  $SUDO apt-get update -qq >/dev/null
  $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

# The Python environment: rebuilt only when the requirements change (their copy in .venv).
# uv (pinned; pip installs it into .venv) installs the packages: it downloads in parallel and
# links files from its cache (~/.cache/uv), so the setup of another clone takes ~10 s where pip
# took ~70 s unpacking the 4.9 GB again. Bytecode is compiled here, once: with
# PYTHONDONTWRITEBYTECODE set, every `import torch` would compile it again (3 s -> 7 s).
UV_VERSION=0.13.9
REQUIREMENTS=scripts/python-requirements.txt
STAMP=.venv/mixtrain-requirements.txt
if ! cmp -s "$REQUIREMENTS" "$STAMP" 2>/dev/null || [[ ! -x .venv/bin/python ]]; then
  echo "mixtrain setup: installing $(grep -v '^#' "$REQUIREMENTS" | xargs) into .venv (several GB, a few minutes)" >&2
  rm -rf .venv
  /usr/bin/python3 -m venv .venv
  .venv/bin/pip install --quiet --disable-pip-version-check --no-input "uv==$UV_VERSION"
  .venv/bin/uv pip install --quiet --compile-bytecode --python .venv/bin/python \
    -r "$REQUIREMENTS"
  cp "$REQUIREMENTS" "$STAMP"
fi
