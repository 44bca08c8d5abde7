#!/usr/bin/env bash
# The allocator's frontier in one GPU call of under ten minutes: every trace beside the CUDA
# driver's pool at the default and at the setting named for it, cold misses by size against the
# pool's own, and PyTorch end to end (the default allocator twice for the noise floor, expandable
# segments, gpumem). Each step has a time budget so the whole fits one call; the baselines are
# measured in the same call as what they are compared with. Then `frontier_report.py OUT_DIR`
# prints the tables.
#
# usage: benches/gpu/frontier.sh BIN_DIR OUT_DIR
#   BIN_DIR holds gpumem and libgpumem.so from target/release.
#   OUT_DIR, new or empty, receives every raw result and results.tgz (one archive, for hosts that
#   return few files). Exits 1 if any run failed or ran out of time; its log is in OUT_DIR.
# Environment: BUDGET (seconds for the whole run, default 570); CPUS (cores PyTorch's processes
# are pinned to, default 2-7); NAMED (the named settings, default named_settings.txt here).
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
[ $# -eq 2 ] || { echo "usage: $0 BIN_DIR OUT_DIR" >&2; exit 2; }
bin=$(cd "$1" 2>/dev/null && pwd) || { echo "no such directory: $1" >&2; exit 2; }
for f in gpumem libgpumem.so; do
  [ -e "$bin/$f" ] || { echo "$bin has no $f: copy it from target/release" >&2; exit 2; }
done
# The setting named for each trace the default does not win on both axes: what `replay --sweep`
# named for it (named_settings.txt, written by sweep_named.sh). Placement on mapped pages with
# 32 MiB chunks is also run on every trace, as the one setting that serves most of them.
placed=(GPUMEM_CACHE_MODE=fixed GPUMEM_PLACE_ON_MAPPED_PAGES=true GPUMEM_MAX_CHUNK_BYTES=32MiB)
named_file=${NAMED:-$here/named_settings.txt}
[ -f "$named_file" ] && [ -r "$named_file" ] || { echo "cannot read $named_file" >&2; exit 2; }
declare -A named
named_count=0
while IFS=$'\t' read -r trace setting; do
  case "$trace" in '' | '#'*) continue ;; esac
  [[ $trace =~ ^[A-Za-z0-9_]+$ ]] || { echo "$named_file: \"$trace\" is not a trace's name" >&2; exit 2; }
  # Values are sizes, counts and booleans: nothing a shell would glob or a path could hide in.
  read -ra words <<< "$setting"
  for word in "${words[@]}"; do
    [[ $word =~ ^GPUMEM_[A-Z_]+=[A-Za-z0-9.]+$ ]] ||
      { echo "$named_file: \"$word\" (for $trace) is not a GPUMEM_ variable's setting" >&2; exit 2; }
  done
  [ -f "$here/../traces/$trace.trace.gz" ] || { echo "$named_file: no trace named $trace" >&2; exit 2; }
  named[$trace]=$setting
  named_count=$((named_count + 1))
done < "$named_file"
[ "$named_count" -gt 0 ] || { echo "$named_file names no setting" >&2; exit 2; }
# A fresh directory: torch_workloads.py appends to its results, so an earlier run's would mix in.
if [ -e "$2" ] && [ -n "$(ls -A "$2" 2>/dev/null)" ]; then
  echo "$2 is not empty: give a new directory for this run's results" >&2; exit 2
fi
out=$(mkdir -p "$2" 2>/dev/null && cd "$2" && pwd) || { echo "cannot create $2" >&2; exit 2; }
budget=${BUDGET:-570}
cpus=${CPUS:-2-7}
traces=("$here"/../traces/*.trace.gz)
export GPUMEM_LOG=warn

# Seconds a step may take: its own cap, or what is left of the budget if that is less (at least
# one: `timeout 0` would mean no limit at all).
allow() {
  local left=$((budget - SECONDS))
  if [ "$left" -lt 1 ]; then echo 1; elif [ "$left" -lt "$1" ]; then echo "$left"; else echo "$1"; fi
}
step() { printf '== %s (%d s in)\n' "$1" "$SECONDS"; }
failed=0
done_step() { printf '   exit %d (%d s in)\n' "$1" "$SECONDS"; [ "$1" -eq 0 ] || failed=$((failed + 1)); }

step "device"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee "$out/device.txt"

replay=("$bin/gpumem" replay --backend cuda --against-driver-pool --json)

step "every trace at the default, beside the driver pool (medians of 3 alternated rounds)"
timeout "$(allow 120)" "${replay[@]}" --repeat 3 "${traces[@]}" > "$out/default.jsonl" 2> "$out/replay.log"
done_step $?

step "every trace placed on mapped pages, 32 MiB chunks, beside the driver pool"
env "${placed[@]}" timeout "$(allow 120)" "${replay[@]}" --repeat 3 "${traces[@]}" > "$out/placed.jsonl" 2>> "$out/replay.log"
done_step $?

step "each trace the sweep named a setting for, at that setting, beside the driver pool (medians of 5)"
: > "$out/own.jsonl"
for t in "${!named[@]}"; do
  # shellcheck disable=SC2086 # the setting is a list of VAR=value words
  env ${named[$t]} timeout "$(allow 60)" "${replay[@]}" --repeat 5 "$here/../traces/$t.trace.gz" \
    >> "$out/own.jsonl" 2>> "$out/replay.log" || { printf '   %s: exit %d\n' "$t" $?; failed=$((failed + 1)); }
done
printf '   done (%d s in)\n' "$SECONDS"

step "cold misses by size, against the driver pool's own (two runs)"
for i in 1 2; do
  timeout "$(allow 60)" "$bin/gpumem" bench --backend cuda --allocators pool-miss-cold,driver-async-miss \
    --threads 1 --seconds 1 --sizes 256,64KiB,1MiB,16MiB,256MiB,1GiB --json \
    > "$out/cold$i.jsonl" 2>> "$out/bench.log"
  done_step $?
done

modes=default,default_again,expandable,gpumem
step "PyTorch: the CNN server, ten rounds a process, three interleaved processes a mode"
mkdir -p "$out/torch"
OUT="$out/torch" timeout "$(allow 240)" python3 "$here/torch_workloads.py" --cpus "$cpus" --rounds 10 \
  --library "$bin/libgpumem.so" --workloads cnn_serve --modes "$modes" --repeat 3 > "$out/torch/cnn.txt" 2>&1
done_step $?
step "PyTorch: GPT-2 training, four rounds a process, three interleaved processes a mode"
# torch_workloads.py appends to results.jsonl, so both workloads land in one table.
OUT="$out/torch" timeout "$(allow 260)" python3 "$here/torch_workloads.py" --cpus "$cpus" --rounds 4 \
  --library "$bin/libgpumem.so" --workloads gpt2_train --modes "$modes" --repeat 3 > "$out/torch/gpt2.txt" 2>&1
done_step $?

# The archive is written beside its final name and moved there whole: a full disk leaves none.
# (Its entries are named one by one: archiving "." would read the directory the archive grows in.)
mapfile -t entries < <(cd "$out" && ls -A | grep -v '^results\.tgz')
if ! tar czf "$out/results.tgz.part" -C "$out" "${entries[@]}"; then
  rm -f "$out/results.tgz.part"; echo "could not write $out/results.tgz" >&2; exit 1
fi
mv "$out/results.tgz.part" "$out/results.tgz"
step "done"
if [ "$failed" -gt 0 ]; then
  echo "$failed run(s) failed or ran out of time: their logs are in $out" >&2; exit 1
fi
