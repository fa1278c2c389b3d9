#!/usr/bin/env bash
# Rehearses scripts/device_check.sh on this machine (no GPU) as the device tool would run it: in
# a fresh clone of HEAD (committed files only) with the deps bundle copied in, and CMake kept
# off this machine's own -dev packages (the /usr prefix ignored, pkg-config hidden), so the build
# can only succeed from the bundle. Then checks that it did, and that the cuda tests are skipped
# without MIXTRAIN_REQUIRE_CUDA (device_check.sh, which sets it, must report them as failed here).
#
#   scripts/device_rehearse.sh [CLONE_DIR]     (default /tmp/mixtrain-rehearsal; OUT=/tmp/devout)
#
# JOBS defaults to 2 (the development VM's cores), LIMIT_SCALE to 12. CCACHE_BASEDIR=/tmp lets the clone's
# compiles reuse the cache of a checkout built with the same relative paths.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
DEST=${1:-/tmp/mixtrain-rehearsal}
export OUT=${OUT:-/tmp/devout}
export JOBS=${JOBS:-2}
[[ -d .device-deps ]] || scripts/device_deps.sh || exit 1

rm -rf "$DEST" "$OUT"
git clone -q --no-hardlinks . "$DEST" || exit 1
cp -a .device-deps "$DEST/"
ln -s "$(readlink -f .venv)" "$DEST/.venv"
cd "$DEST" || exit 1

ccache=$(command -v ccache || echo CCACHE_PROGRAM-NOTFOUND)
export MIXTRAIN_PYTHON=.venv/bin/python CCACHE_BASEDIR=${CCACHE_BASEDIR:-/tmp}
export MIXTRAIN_CMAKE_ARGS="-DCMAKE_IGNORE_PREFIX_PATH=/usr -DCMAKE_FIND_USE_SYSTEM_PACKAGE_REGISTRY=OFF
  -DCMAKE_DISABLE_FIND_PACKAGE_PkgConfig=ON -DCCACHE_PROGRAM=$ccache"
# 2 cores instead of 16, and a cold compiler cache: the phases' limits x12.
export LIMIT_SCALE=${LIMIT_SCALE:-12}
scripts/device_check.sh
check_rc=$?
echo "device_check.sh: exit $check_rc"

B=build-device
failed=0
fail() {
  echo "REHEARSAL FAILED: $*"
  failed=1
}
echo "--- libraries and packages the configure chose (all must be the bundle's)"
grep -E '^(yaml-cpp|toml11|nlohmann_json|CLI11|GTest|benchmark)_DIR|^MIXTRAIN_(SLEEF|XXHASH)_LIBRARY' "$B/CMakeCache.txt"
while IFS= read -r line; do
  [[ $line == *"$DEST/.device-deps"* ]] || fail "not from the bundle: $line"
done < <(grep -E '^(yaml-cpp|toml11|nlohmann_json|CLI11|GTest|benchmark)_DIR|^MIXTRAIN_(SLEEF|XXHASH)_LIBRARY' "$B/CMakeCache.txt")
echo "--- headers of the bundled packages read from /usr/include (must be none)"
ninja -C "$B" -t deps >"$B/deps.txt"  # a file: `grep -q` on a pipe would fail it under pipefail
bundled='(yaml-cpp|toml|nlohmann|CLI|gtest|gmock|benchmark|gloo|xxh)'
grep -E "^ +/usr/include/$bundled" "$B/deps.txt" | sort -u | head
grep -qE "^ +/usr/include/$bundled" "$B/deps.txt" && fail "a bundled package's header came from /usr/include"
# ccache (CCACHE_BASEDIR) records the bundle's headers relative to the build folder.
grep -qE "^ +($DEST/|\.\./)\.device-deps/include/gloo/" "$B/deps.txt" || fail "no compile read the bundle's Gloo headers"
echo "--- ldd $B/mixtrain (no yaml-cpp, xxhash: linked statically from the bundle)"
ldd "$B/mixtrain" | grep -vE 'site-packages|linux-vdso|ld-linux'
ldd "$B/mixtrain" >"$B/ldd.txt"
grep -qE 'yaml-cpp|xxhash' "$B/ldd.txt" && fail "mixtrain loads a shared yaml-cpp or xxhash"
echo "--- the cuda tests without MIXTRAIN_REQUIRE_CUDA (here: skipped, not passed)"
env -u MIXTRAIN_REQUIRE_CUDA ctest --test-dir "$B" -L cuda --no-tests=error | tee /tmp/devcheck-skip.txt
grep -qE '\*\*\*Skipped' /tmp/devcheck-skip.txt || fail "the cuda tests were not reported as skipped"
grep -qE 'Passed' /tmp/devcheck-skip.txt && fail "a cuda test passed without a device"
echo "rehearsal: device_check.sh exit $check_rc (non-zero expected without a GPU); checks $([[ $failed -eq 0 ]] && echo ok || echo FAILED)"
exit $failed
