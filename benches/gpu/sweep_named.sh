#!/usr/bin/env bash
# Names, for each trace the default does not beat the driver pool on, a setting that does:
# `replay --sweep` on the GPU (every setting of the grid and the driver's pool, alternated rounds,
# medians), and of the settings it names, the fastest within the pool's memory, whose lead on
# time survives the next call's rounds best. One trace at a time, so that a trace that fails or
# runs out of time keeps the results of those before it. Writes each trace's table to
# OUT_DIR/sweep/TRACE.txt and the named settings to OUT_DIR/named_settings.txt, one line per
# trace: the trace, a tab, the variables that select its setting. frontier.sh reads that file
# (benches/gpu/named_settings.txt) for its named runs.
#
# usage: benches/gpu/sweep_named.sh BIN_DIR OUT_DIR [TRACE...]
#   BIN_DIR holds gpumem from target/release; OUT_DIR must be new or empty.
#   TRACE names a trace of benches/traces without its extension; the default is the traces
#   that frontier.sh's last tables showed the default losing to the pool on time.
# Environment: BUDGET (seconds for the whole run, default 540); ROUNDS (alternated rounds a
# setting, default 3). Exits 1 if a trace's sweep failed or ran out of time.
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
[ $# -ge 2 ] || { echo "usage: $0 BIN_DIR OUT_DIR [TRACE...]" >&2; exit 2; }
bin=$(cd "$1" 2>/dev/null && pwd) || { echo "no such directory: $1" >&2; exit 2; }
[ -x "$bin/gpumem" ] || { echo "$bin has no gpumem: copy it from target/release" >&2; exit 2; }
if [ -e "$2" ] && [ -n "$(ls -A "$2" 2>/dev/null)" ]; then
  echo "$2 is not empty: give a new directory for this run's results" >&2; exit 2
fi
dest=$2
shift 2
traces=("$@")
if [ ${#traces[@]} -eq 0 ]; then
  traces=(cnn_serve cnn_serve_cycled cnn_serve_large gpt2_train llama_train_ckpt lstm_seq2seq
    moe_train segment_multiscale vae_decode vit_train)
fi
for t in "${traces[@]}"; do
  [[ $t =~ ^[A-Za-z0-9_]+$ ]] && [ -f "$here/../traces/$t.trace.gz" ] ||
    { echo "no trace named $t in benches/traces" >&2; exit 2; }
done
out=$(mkdir -p "$dest/sweep" 2>/dev/null && cd "$dest" && pwd) || { echo "cannot create $dest" >&2; exit 2; }
budget=${BUDGET:-540}
rounds=${ROUNDS:-3}
export GPUMEM_LOG=warn

nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee "$out/device.txt"
failed=0
: > "$out/named_settings.txt"
for t in "${traces[@]}"; do
  # Sweeps differ tenfold in length (cnn_serve_large's blocks reach gigabytes), so each may use
  # what is left of the budget; one that runs out leaves the results of those before it.
  left=$((budget - SECONDS))
  [ "$left" -ge 1 ] || left=1
  printf '== %s (%d s in)\n' "$t" "$SECONDS"
  if ! timeout "$left" "$bin/gpumem" replay --backend cuda --sweep --repeat "$rounds" \
      "$here/../traces/$t.trace.gz" > "$out/sweep/$t.txt" 2> "$out/sweep/$t.log"; then
    echo "   $t: the sweep failed or ran out of time (its log: sweep/$t.log)" >&2
    failed=$((failed + 1))
    continue
  fi
  # The verdict names settings by the variables that select them: the fastest within the
  # pool's memory where it is not the leanest winner itself, whose lead on time is the widest.
  named=$(sed -n 's/^  fastest within its memory: \(GPUMEM_[^(]*\) (.*/\1/p' "$out/sweep/$t.txt")
  [ -n "$named" ] ||
    named=$(sed -n 's/^  beats the driver pool on both: \(GPUMEM_[^(]*\) (.*/\1/p' "$out/sweep/$t.txt")
  if [ -n "$named" ]; then
    printf '%s\t%s\n' "$t" "${named% }" >> "$out/named_settings.txt" ||
      { echo "cannot write $out/named_settings.txt" >&2; exit 1; }
    grep -A2 '^  driver pool' "$out/sweep/$t.txt" | sed 's/^/   /'
  else
    echo "   $t: no setting beat the driver pool on both axes"
  fi
done
printf '== done (%d s)\n' "$SECONDS"
if [ "$failed" -gt 0 ]; then
  echo "$failed trace(s) failed or ran out of time: their logs are in $out/sweep" >&2; exit 1
fi
