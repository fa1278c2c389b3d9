#!/usr/bin/env bash
# Rehearses scripts/device_check.sh on this machine (no GPU) as the device tool would run it: in
# a fresh clone of HEAD (committed files only) with the deps bundle copied in, and CMake kept
# off this machine's own -dev packages (the /usr prefix ignored, pkg-config hidden), so the build
# can only succeed from the bundle. Then checks what a machine without a GPU must show:
#   - the phases ran in the documented order; configure, build and sanity passed; env, cuda,
#     smoke and bench failed (no device: MIXTRAIN_REQUIRE_CUDA=1 turns every skip into a failure);
#   - every package CMake chose is the bundle's, no compile read a bundled package's header from
#     /usr/include, mixtrain loads yaml-cpp, xxHash and PCRE2 from the bundle;
#   - without MIXTRAIN_REQUIRE_CUDA, ctest -L cuda exits 0 and reports every cuda test Skipped
#     (none Passed, none Failed).
#
#   scripts/device_rehearse.sh [CLONE_DIR]
#
# CLONE_DIR and OUT default to new `mktemp -d` folders; the clone is removed after a passing
# rehearsal unless KEEP=1 (a failing one keeps it for reading). Needs .venv (scripts/setup.sh);
# makes .device-deps (scripts/device_deps.sh) when missing. JOBS defaults to 2 (the development
# VM's cores), LIMIT_SCALE to 12. CCACHE_BASEDIR=/tmp: ccache records paths relative to the
# build folder, so a clone anywhere under /tmp reuses an earlier rehearsal's compiles.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
[[ -x .venv/bin/python ]] || {
  echo "device_rehearse: no .venv/bin/python here: run scripts/setup.sh first" >&2
  exit 1
}
[[ -d .device-deps ]] || scripts/device_deps.sh || exit 1

DEST=${1:-$(mktemp -d /tmp/mixtrain-rehearsal.XXXXXX)}
export OUT=${OUT:-$(mktemp -d /tmp/mixtrain-devout.XXXXXX)}
export JOBS=${JOBS:-2}
rm -rf "$DEST"
git clone -q --no-hardlinks . "$DEST" || exit 1
cp -a .device-deps "$DEST/"
ln -s "$(readlink -f .venv)" "$DEST/.venv"
cd "$DEST" || exit 1
echo "rehearsal: clone $DEST ($(git rev-parse --short HEAD)), results $OUT"

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
echo "--- the phases: order and status"
cat "$OUT/summary.txt"
order=$(awk -F' *[|] *' 'NR > 1 && NF >= 4 { printf "%s ", $1 }' "$OUT/summary.txt")
[[ $order == "env configure build cuda smoke sanity bench " ]] || fail "phase order: $order"
phase_status() { awk -F' *[|] *' -v p="$1" '$1 == p { print $2 }' "$OUT/summary.txt"; }
for p in configure build sanity; do
  [[ $(phase_status $p) == ok ]] || fail "phase $p: $(phase_status $p), not ok"
done
for p in env cuda smoke bench; do  # no device here: each must have run and failed
  [[ $(phase_status $p) == FAILED ]] || fail "phase $p: $(phase_status $p), not FAILED (no GPU here)"
done
((check_rc != 0)) || fail "device_check.sh passed without a GPU"

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
echo "--- ldd $B/mixtrain (yaml-cpp, xxhash, pcre2: the bundle's shared libraries)"
ldd "$B/mixtrain" | grep -vE 'site-packages|linux-vdso|ld-linux'
ldd "$B/mixtrain" >"$B/ldd.txt"
for lib in libyaml-cpp libxxhash libpcre2-8; do
  grep -qE "^\s*$lib\.so.* => $DEST/\.device-deps/lib/" "$B/ldd.txt" ||
    fail "mixtrain does not load $lib from the bundle"
done

echo "--- the cuda tests without MIXTRAIN_REQUIRE_CUDA: ctest exits 0, every test Skipped"
listed=$(ctest --test-dir "$B" -N -L cuda | sed -n 's/^ *Test *#[0-9]*: \([^ ]*\).*/\1/p' | sort)
env -u MIXTRAIN_REQUIRE_CUDA ctest --test-dir "$B" -L cuda --no-tests=error >"$B/skip.txt" 2>&1
skip_rc=$?
cat "$B/skip.txt"
((skip_rc == 0)) || fail "ctest -L cuda exited $skip_rc without a device (skips must not fail it)"
skipped=$(sed -n 's/^ *[0-9]*\/[0-9]* Test *#[0-9]*: \([^ ]*\) .*\*\*\*Skipped.*/\1/p' "$B/skip.txt" | sort)
[[ -n $listed ]] || fail "no test is labelled cuda"
[[ $skipped == "$listed" ]] || fail "not every cuda test was Skipped: listed [$(echo $listed)], skipped [$(echo $skipped)]"
grep -qE 'Test *#[0-9]+: .* (Passed|\*\*\*Failed|\*\*\*Timeout|\*\*\*Exception)' "$B/skip.txt" &&
  fail "a cuda test passed or failed without a device"

if ((failed)); then
  echo "rehearsal: FAILED; the clone is kept: $DEST, results: $OUT"
elif [[ ${KEEP:-0} == 1 ]]; then
  echo "rehearsal: ok (device_check.sh exit $check_rc, as it must be without a GPU); kept: $DEST, results: $OUT"
else
  cd / && rm -rf "$DEST"
  echo "rehearsal: ok (device_check.sh exit $check_rc, as it must be without a GPU); results: $OUT"
fi
exit $failed
