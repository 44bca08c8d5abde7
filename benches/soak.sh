#!/usr/bin/env bash
# The long soak (issue 9): `gpumem demo` under a steady scrape load for SOAK_SECONDS (default
# 1800), sampling its resident memory, open descriptors and scrape latency once a second;
# fails on any error or growth trend, and prints one line per minute. The same test CI runs
# for 30 s (tests/it/reliability/soak.rs), made longer. Loopback only. Figures:
# docs/reliability.md.
#
#   benches/soak.sh                              # 30 minutes at 80 requests/s
#   SOAK_SECONDS=600 benches/soak.sh             # 10 minutes
#   SOAK_WRK=1 SOAK_SECONDS=600 benches/soak.sh  # plus wrk -t2 -c16 on /metrics (apt-get install wrk)
set -euo pipefail
cd "$(dirname "$0")/.."

export SOAK_SECONDS="${SOAK_SECONDS:-1800}"
if [ "${SOAK_WRK:-0}" = 1 ] && ! command -v wrk >/dev/null 2>&1; then
  echo "soak: SOAK_WRK=1 but wrk is not installed (apt-get install wrk)" >&2
  exit 2
fi
cargo test --release --test it reliability::soak -- --nocapture --test-threads 1
