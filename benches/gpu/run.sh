#!/usr/bin/env bash
# Runs gpumem's GPU checks and benchmarks on a host with an NVIDIA GPU and prebuilt release
# binaries (no Rust toolchain needed there), writing everything under OUT.
#
# usage: benches/gpu/run.sh BIN_DIR TRACE_DIR OUT_DIR
#   BIN_DIR holds: gpumem (release binary), it (integration tests: cargo test --release --no-run),
#                  alloc (allocator benchmark: cargo bench --bench alloc --no-run)
set -uo pipefail
bin=$(cd "$1" && pwd); traces=$(cd "$2" && pwd); out=$3
mkdir -p "$out"
log() { printf '\n== %s\n' "$*" | tee -a "$out/summary.txt"; }

log "device and driver ($(date -u +%Y-%m-%dT%H:%MZ))"
nvidia-smi --query-gpu=index,name,uuid,memory.total,memory.used,driver_version --format=csv | tee -a "$out/summary.txt"

log "gpumem devices --json vs nvidia-smi"
"$bin/gpumem" devices --backend cuda --json > "$out/devices.json" 2>> "$out/stderr.txt"
echo "exit=$?" | tee -a "$out/summary.txt"
python3 - "$out/devices.json" <<'PY' | tee -a "$out/summary.txt"
import json, subprocess, sys
ours = json.load(open(sys.argv[1]))
smi = subprocess.run(["nvidia-smi", "--query-gpu=index,name,uuid,memory.total", "--format=csv,noheader,nounits"],
                     capture_output=True, text=True).stdout.strip().splitlines()
for line, dev in zip(smi, ours):
    index, name, uuid, total_mib = [f.strip() for f in line.split(",")]
    same_total = abs(dev["total_memory_bytes"] / 2**20 - float(total_mib)) < 1
    print(f"gpu {index}: name {'OK' if dev['name'] == name else 'DIFF'} ({dev['name']!r} / {name!r}), "
          f"uuid {'OK' if dev['uuid'] == uuid else 'DIFF'} ({dev['uuid']}), "
          f"total {'OK' if same_total else 'DIFF'} ({dev['total_memory_bytes']} B / {total_mib} MiB)")
PY

log "integration tests with GPUMEM_REQUIRE_GPU=1"
# The tests run the binary from the path cargo baked in at build time.
baked=$(strings "$bin/it" | grep -m1 -o '/[^ ]*/target/release/gpumem$' || true)
if [ -n "$baked" ]; then mkdir -p "$(dirname "$baked")" && cp "$bin/gpumem" "$baked"; fi
GPUMEM_REQUIRE_GPU=1 "$bin/it" --test-threads=1 ${IT_FILTER:-} > "$out/tests.txt" 2>&1
echo "exit=$?" | tee -a "$out/summary.txt"
grep -E "^test result|FAILED|panicked" "$out/tests.txt" | tee -a "$out/summary.txt"

log "replay on CUDA (pooled, then direct)"
for strategy in pooled direct; do
  "$bin/gpumem" replay --backend cuda --json --strategy "$strategy" --plot "$out/replay-$strategy.svg" \
    "$traces"/*.trace.gz 2>> "$out/stderr.txt" | tee -a "$out/replay.jsonl"
done

log "allocator benchmark (criterion, cuda)"
GPUMEM_BENCH_BACKEND=cuda "$bin/alloc" --bench ${BENCH_FILTER:-} > "$out/bench.txt" 2>&1
echo "exit=$?" | tee -a "$out/summary.txt"
grep -E "^[a-zA-Z_]+/|time:" "$out/bench.txt" | paste - - | awk '{print $1, $(NF-4), $(NF-3)}' | tee -a "$out/summary.txt"
