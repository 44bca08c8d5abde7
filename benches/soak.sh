#!/usr/bin/env bash
# The long soak (issue 9): `gpumem demo` under steady scrape load for SOAK_SECONDS (default
# 1800), sampling its resident memory, open descriptors and scrape latency; fails on any error
# or growth trend. The same test CI runs for 30 s (tests/it/reliability/soak.rs), made longer,
# with `wrk` hammering /metrics from a second process when it is installed
# (apt-get install wrk). Loopback only. Results: docs/reliability.md.
#
#   benches/soak.sh                   # 30 minutes
#   SOAK_SECONDS=600 benches/soak.sh  # 10 minutes
set -euo pipefail
cd "$(dirname "$0")/.."

export SOAK_SECONDS="${SOAK_SECONDS:-1800}"
if command -v wrk >/dev/null 2>&1; then
  export SOAK_WRK=1
else
  echo "soak: wrk not found; running with the built-in load only" >&2
fi
cargo test --release --test it reliability::soak -- --nocapture --test-threads 1
