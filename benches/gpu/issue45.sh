#!/usr/bin/env bash
# The PyTorch drop-in's measurements (issue 45) on a GPU host with PyTorch and no Rust, in two
# parts that each fit one device call of ten minutes:
#
#   benches/gpu/issue45.sh compat   # the compatibility table: every row of torch_dropin.py under
#                                   # PyTorch's allocator and under gpumem, CUDA IPC both ways
#                                   # included, the OOM loop, the snapshot through the viewer's
#                                   # code, and the alloc + free cost (about 7 minutes)
#   benches/gpu/issue45.sh e2e      # torch_workloads.py's workloads, the default, its second run
#                                   # (the noise floor), expandable segments and gpumem in turn,
#                                   # three rounds, every process on the same cores (CPUS, 2-9):
#                                   # gpt2_train and cnn_serve by default, about 6 minutes;
#                                   # WORKLOADS=hf_generate on its own (about 7: 30 s a process);
#                                   # WORKLOADS may name the recorded sets' workloads too
#                                   # (unseen_workloads.py), ROUNDS their timed rounds a process,
#                                   # MODES the allocators (torch_workloads.py --modes), SIZE
#                                   # the models' size (--size large: processes of 33 to 57 GB);
#                                   # OTHER_LIBRARY and/or OTHER_CONFIG give mode gpumem_other
#                                   # (a second build or setting, interleaved with the rest)
#
# Needs a stripped release libgpumem.so at .gpu/libgpumem.so (cargo build --release -p
# gpumem-cdylib) and $OUT, where the results go. The layer is compiled first (about 20 s).
set -euo pipefail
repository="$(cd "$(dirname "$0")/../.." && pwd)"
part="${1:-}"
case "$part" in
  compat | e2e) ;;
  *) echo "usage: benches/gpu/issue45.sh compat|e2e" >&2; exit 2 ;;
esac
: "${OUT:?OUT must name the directory the results go to}"
library="$repository/.gpu/libgpumem.so"
[ -f "$library" ] || { echo "issue45.sh: no $library (copy a release libgpumem.so there)" >&2; exit 2; }
export GPUMEM_LIBRARY="$library" PYTHONPATH="$repository/python" HF_HUB_OFFLINE=1
export GPUMEM_TORCH_LAYER_DIR="${GPUMEM_TORCH_LAYER_DIR:-/tmp/gpumem-layer}"
mkdir -p "$OUT"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee "$OUT/device.txt"
python -c 'import torch; print("torch", torch.__version__)' | tee -a "$OUT/device.txt"
( time python -m gpumem.torch build ) 2>&1 | tail -4 | tee "$OUT/layer-build.txt"
case "$part" in
  compat)
    python "$repository/benches/gpu/torch_dropin.py" --modes default,gpumem --timeout 240 \
      2>&1 | tee "$OUT/compat.md"
    ;;
  e2e)
    # Unpinned, one allocator's processes spread as far as any gap between allocators
    # (gpt2_train 168-242 ms a round under the default, H200, 2026-11-27); pinned, much less.
    python "$repository/benches/gpu/torch_workloads.py" --repeat "${REPEAT:-3}" --cpus "${CPUS:-2-9}" \
      --workloads "${WORKLOADS:-gpt2_train,cnn_serve}" ${ROUNDS:+--rounds "$ROUNDS"} ${SIZE:+--size "$SIZE"} \
      --timeout "${TIMEOUT:-240}" ${OTHER_LIBRARY:+--other-library "$OTHER_LIBRARY"} \
      ${OTHER_CONFIG:+--other-config "$OTHER_CONFIG"} \
      --modes "${MODES:-default,default_again,expandable,gpumem}" 2>&1 | tee "$OUT/e2e.md"
    ;;
esac
