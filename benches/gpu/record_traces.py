# Records allocation traces from more PyTorch workloads than shared/traces holds, in the same
# format (see shared/traces/README.md), so the allocator is judged on workloads it was not tuned
# on. Randomly initialised models, nothing downloaded. Needs a GPU host with PyTorch and
# transformers. Writes NAME.trace.gz into $OUT (or /tmp) and prints one JSON line per trace.
import gzip, json, os, sys, time
import torch

OUT = os.environ.get("OUT", "/tmp")
DEV = "cuda"
torch.manual_seed(0)


def record(name, workload):
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats()
    torch.cuda.memory._record_memory_history(max_entries=3_000_000, context=None, stacks="python")
    started = time.time()
    workload()
    torch.cuda.synchronize()
    seconds = time.time() - started
    snapshot = torch.cuda.memory._snapshot()
    torch.cuda.memory._record_memory_history(enabled=None)
    stats = torch.cuda.memory_stats()
    slot_of, next_slot, lines, allocs = {}, 0, [], 0
    for event in snapshot["device_traces"][0]:
        if event["action"] == "alloc":
            slot_of[event["addr"]] = next_slot
            lines.append(f"a {next_slot} {event['size']} {event.get('stream', 0)}")
            next_slot += 1
            allocs += 1
        elif event["action"] == "free_completed":
            slot = slot_of.pop(event["addr"], None)
            if slot is not None:
                lines.append(f"f {slot}")
    meta = dict(name=name, events=len(lines), allocs=allocs, seconds=seconds,
                torch_peak_allocated=stats["allocated_bytes.all.peak"],
                torch_peak_reserved=stats["reserved_bytes.all.peak"])
    with gzip.open(f"{OUT}/{name}.trace.gz", "wt") as out:
        out.write("# " + json.dumps(meta) + "\n" + "\n".join(lines) + "\n")
    print(json.dumps(meta))
    sys.stdout.flush()
    torch.cuda.empty_cache()


def llama_generate():
    """A small Llama (GQA, RoPE, SwiGLU) generating with a growing KV cache at several batch shapes."""
    from transformers import LlamaConfig, LlamaForCausalLM
    config = LlamaConfig(hidden_size=1024, intermediate_size=2816, num_hidden_layers=8,
                         num_attention_heads=16, num_key_value_heads=4, vocab_size=32000)
    model = LlamaForCausalLM(config).to(DEV).half().eval()
    with torch.no_grad():
        for batch, prompt, new in [(1, 64, 128), (8, 256, 64), (4, 1000, 32), (16, 33, 96), (2, 700, 128)]:
            ids = torch.randint(0, 32000, (batch, prompt), device=DEV)
            model.generate(ids, max_new_tokens=new, do_sample=True, pad_token_id=0)
    del model


def bert_serve():
    """An encoder serving requests of varying batch and length, as an embedding service does."""
    from transformers import BertConfig, BertModel
    model = BertModel(BertConfig(hidden_size=768, num_hidden_layers=12, num_attention_heads=12)).to(DEV).half().eval()
    shapes = [(1, 16), (32, 128), (7, 512), (64, 64), (3, 300), (128, 32), (16, 256), (2, 511)] * 6
    with torch.no_grad():
        for batch, length in shapes:
            model(torch.randint(0, 30000, (batch, length), device=DEV))
    del model


def t5_train():
    """Sequence-to-sequence training (encoder and decoder, cross-attention), fp32 with AdamW."""
    from transformers import T5Config, T5ForConditionalGeneration
    config = T5Config(d_model=512, d_ff=2048, num_layers=6, num_heads=8, vocab_size=32128,
                      decoder_start_token_id=0, pad_token_id=0)
    model = T5ForConditionalGeneration(config).to(DEV)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    for batch, source, target in [(8, 256, 64), (16, 128, 128), (4, 512, 32), (12, 200, 100), (2, 1000, 50)]:
        inputs = torch.randint(0, 32000, (batch, source), device=DEV)
        labels = torch.randint(0, 32000, (batch, target), device=DEV)
        model(input_ids=inputs, labels=labels).loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    del model, optimizer


for name, workload in [("llama_generate", llama_generate), ("bert_serve", bert_serve), ("t5_train", t5_train)]:
    try:
        record(name, workload)
    except Exception as error:  # a missing model class must not lose the other traces
        print(name, "FAILED", repr(error))
