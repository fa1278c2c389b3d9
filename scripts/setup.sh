#!/usr/bin/env bash
# Installs every Debian package mixtrain needs to build, test and run.
# Idempotent and silent when everything is present. GNU make is the only prerequisite.
set -euo pipefail

PACKAGES=(
  build-essential cmake pkg-config ccache clang-format
  libtorch-dev libgloo-dev libsleef-dev libopenblas0-pthread libopenblas-dev
  libyaml-cpp-dev libtoml11-dev nlohmann-json3-dev libcli11-dev libxxhash-dev
  libgtest-dev libgmock-dev libbenchmark-dev
)

missing=()
for p in "${PACKAGES[@]}"; do
  status=$(dpkg-query -W -f='${Status}' "$p" 2>/dev/null || true)
  [[ "$status" == "install ok installed" ]] || missing+=("$p")
done
[[ ${#missing[@]} -eq 0 ]] && exit 0

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
