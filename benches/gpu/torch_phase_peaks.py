# Peak live bytes per training phase (forward, backward, optimizer step; each peak reset before)
# under PyTorch's default allocator or gpumem, for GPT-2 training at two shapes. It found why
# gpumem's whole-run allocated peak once read 25 % above PyTorch's: per phase the two agreed
# within 7 MiB, so the gap was in how gpumem added up its pools' peaks (docs/gpu-results.md).
#
# usage: python3 benches/gpu/torch_phase_peaks.py default
#        GPUMEM_LIBRARY=libgpumem.so python3 benches/gpu/torch_phase_peaks.py gpumem [PYTHON_DIR]
# PYTHON_DIR is the repository's python/ directory (default: next to this script's repository).
import json
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
mode = sys.argv[1] if len(sys.argv) > 1 else "default"
if mode not in ("default", "gpumem"):
    sys.exit("usage: torch_phase_peaks.py default|gpumem [PYTHON_DIR]")
if mode == "gpumem":
    sys.path.insert(0, sys.argv[2] if len(sys.argv) > 2 else os.path.join(HERE, "..", "..", "python"))
    import gpumem.torch as gt

    gt.use()
import torch  # noqa: E402  (after gpumem.torch.use(), which must precede the first tensor)
from transformers import GPT2Config, GPT2LMHeadModel  # noqa: E402


def peak_and_current():
    if mode == "gpumem":
        stats = gt.memory_stats(0)
        return stats["allocated_bytes.all.peak"], stats["allocated_bytes.all.current"]
    return torch.cuda.max_memory_allocated(), torch.cuda.memory_allocated()


def reset():
    if mode == "gpumem":
        gt.reset_peak_memory_stats()
    else:
        torch.cuda.reset_peak_memory_stats()


def mib(pair):
    return [value >> 20 for value in pair]


torch.manual_seed(0)
config = GPT2Config(n_layer=6, n_embd=512, n_head=8, n_positions=1024, vocab_size=50257)
model = GPT2LMHeadModel(config).cuda()
optimizer = torch.optim.AdamW(model.parameters(), lr=3e-4)
generator = torch.Generator(device="cpu").manual_seed(1)
print(mode, "after the model: peak, current MiB", mib(peak_and_current()))
for batch, length in [(8, 128), (2, 1024), (2, 1024)]:
    ids = torch.randint(0, config.vocab_size, (batch, length), generator=generator).cuda()
    phases = {}
    reset()
    with torch.autocast("cuda", dtype=torch.bfloat16):
        loss = model(ids, labels=ids).loss
    torch.cuda.synchronize()
    phases["forward"] = mib(peak_and_current())
    reset()
    loss.backward()
    torch.cuda.synchronize()
    phases["backward"] = mib(peak_and_current())
    reset()
    optimizer.step()
    torch.cuda.synchronize()
    phases["step"] = mib(peak_and_current())
    optimizer.zero_grad(set_to_none=True)
    print(mode, batch, length, json.dumps(phases), flush=True)
