#!/usr/bin/env bash
# Runs every GPU measurement gpumem publishes, in one go, on a host with an NVIDIA GPU, the
# NVIDIA driver and Python with PyTorch — no Rust toolchain needed there — and writes a report.
#
# usage: benches/gpu/run.sh BIN_DIR OUT_DIR [TRACE_DIR...]
#   BIN_DIR holds release builds: gpumem; it (cargo test --release --no-run: tests/it);
#           scrape (cargo bench --bench scrape --no-run); libgpumem.so (the C ABI, which the
#           Python package's test loads from beside `it`), all copied from target/release.
#   OUT_DIR receives report.md, every raw result (JSON lines, logs) and results.tgz.
#   TRACE_DIR: directories of *.trace.gz (default: benches/traces).
# Environment: QUICK=1 shortens every timing (a smoke run; replays once instead of the median of
# five, which single replays' spread of tens of percent on a GPU host calls for); IT_FILTER /
# SKIP_TESTS=1;
# SKIP_SPEED=1 leaves out the speed and waste measurements.
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
bin=$(cd "$1" && pwd); out=$(mkdir -p "$2" && cd "$2" && pwd); shift 2
trace_dirs=("$@"); [ ${#trace_dirs[@]} -gt 0 ] || trace_dirs=("$here/../traces")
traces=(); for d in "${trace_dirs[@]}"; do for f in "$d"/*.trace.gz; do [ -e "$f" ] && traces+=("$f"); done; done
seconds=2; repeat=5; [ "${QUICK:-0}" = 1 ] && seconds=0.3 && repeat=1
log() { printf '\n== %s\n' "$*"; }
export GPUMEM_LOG=warn

log "device"
nvidia-smi --query-gpu=index,name,uuid,memory.total,driver_version --format=csv | tee "$out/nvidia-smi.csv"
"$bin/gpumem" devices --backend cuda --json > "$out/devices.json"

if [ "${SKIP_TESTS:-0}" != 1 ]; then
  log "integration tests, GPU required"
  # shellcheck disable=SC2086 # IT_FILTER is a list of filters
  "$here/gpu_tests.sh" "$bin" "$out/tests.log" ${IT_FILTER:-}
fi

if [ "${SKIP_SPEED:-0}" != 1 ]; then
log "allocation speed (gpumem bench)"
"$bin/gpumem" bench --backend cuda --json --threads 1,8 --seconds "$seconds" > "$out/bench.jsonl" 2> "$out/bench.log"
echo "exit=$? ($(wc -l < "$out/bench.jsonl") cases)"

log "waste on traces: gpumem (CUDA backend)"
"$bin/gpumem" replay --backend cuda --json --repeat "$repeat" "${traces[@]}" > "$out/replay-gpumem.jsonl" 2> "$out/replay.log"
echo "exit=$?"
log "waste on traces: the CUDA driver pool (cuMemAllocAsync, release threshold max), same harness"
"$bin/gpumem" replay --backend cuda --strategy driver-pool --json --repeat "$repeat" "${traces[@]}" > "$out/replay-driver-pool.jsonl" 2>> "$out/replay.log"
echo "exit=$?"
log "cache settings: waste against time per operation (gpumem replay --sweep)"
"$bin/gpumem" replay --backend cuda --sweep "${traces[@]}" > "$out/sweep.txt" 2>> "$out/replay.log"
echo "exit=$?"
log "waste on traces: PyTorch"
for conf in "" "expandable_segments:True" "backend:cudaMallocAsync"; do
  PYTORCH_CUDA_ALLOC_CONF="$conf" python3 "$here/torch_replay.py" "${traces[@]}" >> "$out/replay-torch.jsonl" 2>> "$out/replay.log"
done

fi

log "truthfulness: gpumem against nvidia-smi on a steady GPU"
python3 "$here/truthfulness.py" "$bin/gpumem" "$out" | tee "$out/truthfulness.log"

log "exporter cost (criterion: scrape and hot path with and without the sampler)"
if [ -x "$bin/scrape" ] && [ "${SKIP_SPEED:-0}" != 1 ]; then
  "$bin/scrape" --bench --warm-up-time 0.5 --measurement-time "$seconds" > "$out/scrape.log" 2>&1
  echo "exit=$?"
fi

log "report"
python3 "$here/report.py" "$out" > "$out/report.md" && tail -n +1 "$out/report.md"
tar czf "$out/results.tgz" -C "$out" --exclude results.tgz . 2>/dev/null
