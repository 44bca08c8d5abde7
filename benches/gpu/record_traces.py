# Records allocation traces from PyTorch workloads, in the format of benches/traces/README.md, so
# the allocator is judged on workloads that differ from each other and from the ones it was tuned
# on. Randomly initialised models, nothing downloaded. Needs a GPU host with PyTorch,
# transformers and timm.
#
# usage: python3 record_traces.py [NAME...]   (default: every workload below)
# Writes NAME.trace.gz into $OUT (or /tmp) and prints one JSON line per trace.
import gzip, json, os, random, sys, time
import torch
import corpus_workloads
import unseen_workloads

OUT = os.environ.get("OUT", "/tmp")


def record(name, workload):
    torch.manual_seed(0)
    random.seed(0)
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
    meta = dict(name=name, events=len(lines), allocs=allocs, seconds=round(seconds, 2),
                device=torch.cuda.get_device_name(), torch=torch.__version__,
                torch_peak_allocated=stats["allocated_bytes.all.peak"],
                torch_peak_reserved=stats["reserved_bytes.all.peak"])
    # Written beside, then renamed: a full disk or a killed run leaves no truncated trace.
    path = f"{OUT}/{name}.trace.gz"
    with gzip.open(path + ".part", "wt") as out:
        out.write("# " + json.dumps(meta) + "\n" + "\n".join(lines) + "\n")
    os.replace(path + ".part", path)
    print(json.dumps(meta))
    sys.stdout.flush()
    torch.cuda.empty_cache()


CORPUS = ("llama_generate", "bert_serve", "cnn_serve", "encoder_varlen", "vit_train", "t5_generate",
          "moe_generate", "longctx_generate", "gpt2_train_cycled", "cnn_serve_cycled",
          "gpt2_train_large", "cnn_serve_large")
UNSEEN = ("detect_multiscale", "segment_multiscale", "unet_diffusion", "moe_train", "encoder_packed",
          "resnet_train", "convnext_multires", "llama_train_ckpt", "bert_mlm_dynpad",
          "lstm_seq2seq", "whisper_generate", "efficientnet_multires_train", "vae_decode",
          "graph_message_passing", "recsys_embedding_train", "contrastive_two_tower_train",
          "audio_ctc_train", "beam_search_generate", "seq2seq_train_varlen",
          "continuous_batching_serve", "gan_train_multires", "pointcloud_dgcnn_train",
          "speculative_decode_generate", "fft_longconv_train", "mae_pretrain_varmask",
          "ppo_rollout_train", "dit_sample_cfg", "lora_finetune_packed", "nerf_hierarchical_train")
WORKLOADS = {**{name: getattr(corpus_workloads, name) for name in CORPUS},
             **{name: getattr(unseen_workloads, name) for name in UNSEEN}}

names = sys.argv[1:] or list(WORKLOADS)
unknown = [name for name in names if name not in WORKLOADS]
if unknown:
    sys.exit(f"unknown workload(s) {unknown}; choose from {sorted(WORKLOADS)}")
for name in names:
    try:
        record(name, WORKLOADS[name])
    except Exception as error:  # one workload failing must not lose the others
        print(json.dumps(dict(name=name, failed=repr(error))))
