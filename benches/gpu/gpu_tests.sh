#!/usr/bin/env bash
# Runs the integration tests on a GPU host from a test binary built elsewhere, with a missing GPU
# a failure (GPUMEM_REQUIRE_GPU=1), one test at a time.
#
# usage: benches/gpu/gpu_tests.sh BIN_DIR LOG_FILE [FILTER...]
#   BIN_DIR holds `it` (cargo test --release --no-run: tests/it) and `gpumem`, from target/release;
#   FILTER: test name filters, as cargo test takes them (default: every test).
# Prints the result lines; exits with the tests' status.
set -uo pipefail
[ $# -ge 2 ] || { echo "usage: $0 BIN_DIR LOG_FILE [FILTER...]" >&2; exit 2; }
bin=$(cd "$1" 2>/dev/null && pwd) || { echo "gpu_tests.sh: no such directory: $1" >&2; exit 2; }
log=$2
shift 2
for needed in it gpumem; do
  [ -x "$bin/$needed" ] || { echo "gpu_tests.sh: $bin has no $needed (copy it from target/release)" >&2; exit 2; }
done
repository=$(cd "$(dirname "$0")/../.." && pwd)
# The tests find the gpumem binary and the repository's files at the paths cargo baked in at
# build time: make those paths lead to this checkout where they do not exist here.
manifest=$(strings "$bin/it" | grep -m1 -o '/[^ ]*/target/release/gpumem' | sed 's#/target/release/gpumem$##')
if [ -n "$manifest" ] && [ ! -e "$manifest" ]; then
  mkdir -p "$(dirname "$manifest")" && ln -s "$repository" "$manifest"
fi
[ -n "$manifest" ] && mkdir -p "$manifest/target/release" && cp "$bin/gpumem" "$manifest/target/release/gpumem"
GPUMEM_REQUIRE_GPU=1 "$bin/it" --test-threads=1 "$@" > "$log" 2>&1
status=$?
echo "tests exit $status"
grep -E "^test result|FAILED|panicked" "$log"
exit "$status"
