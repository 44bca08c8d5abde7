# The corpus's workloads that record_traces.py records (those the defaults were chosen on, and
# the held-out three): randomly initialised models run on the GPU, each a function that drives
# one workload from start to end. The unseen sets are in unseen_workloads.py. Needs PyTorch,
# transformers and timm.
import random

import torch

DEV = "cuda"


def llama(hidden=1024, layers=8, heads=16, kv_heads=4, positions=2048):
    from transformers import LlamaConfig, LlamaForCausalLM
    config = LlamaConfig(hidden_size=hidden, intermediate_size=hidden * 11 // 4, num_hidden_layers=layers,
                         num_attention_heads=heads, num_key_value_heads=kv_heads, vocab_size=32000,
                         max_position_embeddings=positions)
    return LlamaForCausalLM(config).to(DEV).half().eval()


def llama_generate():
    """A small Llama (GQA, RoPE, SwiGLU) generating with a growing KV cache at several batch shapes."""
    model = llama()
    with torch.no_grad():
        for batch, prompt, new in [(1, 64, 128), (8, 256, 64), (4, 1000, 32), (16, 33, 96), (2, 700, 128)]:
            ids = torch.randint(0, 32000, (batch, prompt), device=DEV)
            model.generate(ids, max_new_tokens=new, do_sample=True, pad_token_id=0)


def bert_serve():
    """An encoder serving requests of varying batch and length, as an embedding service does."""
    from transformers import BertConfig, BertModel
    model = BertModel(BertConfig(hidden_size=768, num_hidden_layers=12, num_attention_heads=12)).to(DEV).half().eval()
    shapes = [(1, 16), (32, 128), (7, 512), (64, 64), (3, 300), (128, 32), (16, 256), (2, 511)] * 6
    with torch.no_grad():
        for batch, length in shapes:
            model(torch.randint(0, 30000, (batch, length), device=DEV))


def cnn_serve():
    """A ResNet-50 served at batch sizes that change from request to request, fp16, channels-last."""
    import timm
    model = timm.create_model("resnet50", pretrained=False).to(DEV).half().eval()
    model = model.to(memory_format=torch.channels_last)
    with torch.no_grad():
        for _ in range(60):
            batch = random.choice([1, 2, 3, 5, 8, 12, 16, 24, 32, 48, 64, 96])
            image = torch.randn(batch, 3, 224, 224, device=DEV, dtype=torch.half)
            model(image.to(memory_format=torch.channels_last))


def encoder_varlen():
    """A RoBERTa-large encoder over batches whose size and padded length are drawn per request."""
    from transformers import RobertaConfig, RobertaModel
    config = RobertaConfig(hidden_size=1024, num_hidden_layers=12, num_attention_heads=16,
                           intermediate_size=4096, max_position_embeddings=514)
    model = RobertaModel(config).to(DEV).half().eval()
    with torch.no_grad():
        for _ in range(80):
            batch, length = random.randint(1, 48), random.randint(8, 512)
            ids = torch.randint(3, 50000, (batch, length), device=DEV)
            mask = torch.ones_like(ids)
            for row in range(batch):  # ragged requests padded to the batch's longest
                mask[row, random.randint(1, length):] = 0
            model(input_ids=ids, attention_mask=mask)


def vit_train():
    """A ViT-Small trained with AdamW and bf16 autocast at a batch size that varies per step."""
    import timm
    model = timm.create_model("vit_small_patch16_224", pretrained=False, num_classes=1000).to(DEV).train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    for _ in range(24):
        batch = random.choice([16, 24, 32, 48, 64, 96])
        classifier_step(model, optimizer, torch.randn(batch, 3, 224, 224, device=DEV))


def classifier_step(model, optimizer, images):
    """One bf16-autocast training step of an image classifier on random labels, gradients
    released after."""
    labels = torch.randint(0, 1000, (images.shape[0],), device=DEV)
    with torch.autocast("cuda", dtype=torch.bfloat16):
        loss = torch.nn.functional.cross_entropy(model(images), labels)
    loss.backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)


def t5_generate():
    """An encoder-decoder (T5) generating with beam search from sources of varying batch and length."""
    from transformers import T5Config, T5ForConditionalGeneration
    config = T5Config(d_model=768, d_ff=3072, num_layers=8, num_decoder_layers=8, num_heads=12,
                      vocab_size=32128, decoder_start_token_id=0, pad_token_id=0, eos_token_id=1)
    model = T5ForConditionalGeneration(config).to(DEV).half().eval()
    with torch.no_grad():
        for batch, source, new, beams in [(1, 120, 48, 4), (8, 400, 32, 2), (16, 64, 40, 1),
                                          (4, 900, 24, 4), (2, 250, 64, 3)]:
            ids = torch.randint(2, 32000, (batch, source), device=DEV)
            model.generate(ids, max_new_tokens=new, min_new_tokens=new, num_beams=beams)


def moe_generate():
    """A Mixtral-style mixture-of-experts stack (8 experts, top-2) generating at several batches."""
    from transformers import MixtralConfig, MixtralForCausalLM
    config = MixtralConfig(hidden_size=1024, intermediate_size=2048, num_hidden_layers=6,
                           num_attention_heads=16, num_key_value_heads=4, num_local_experts=8,
                           num_experts_per_tok=2, vocab_size=32000, max_position_embeddings=4096)
    model = MixtralForCausalLM(config).to(DEV).half().eval()
    with torch.no_grad():
        for batch, prompt, new in [(1, 100, 64), (12, 300, 48), (4, 1200, 32), (24, 40, 64), (2, 600, 80)]:
            ids = torch.randint(0, 32000, (batch, prompt), device=DEV)
            model.generate(ids, max_new_tokens=new, do_sample=True, pad_token_id=0)


def longctx_generate():
    """A Llama generating after long prompts (4k to 16k tokens), where the KV cache dominates."""
    model = llama(hidden=1024, layers=8, positions=32768)
    with torch.no_grad():
        for batch, prompt, new in [(1, 16000, 48), (2, 8000, 48), (1, 4000, 96), (4, 6000, 32)]:
            ids = torch.randint(0, 32000, (batch, prompt), device=DEV)
            model.generate(ids, max_new_tokens=new, do_sample=True, pad_token_id=0)


GPT2_SHAPES = [(8, 128), (4, 512), (16, 64), (2, 1024), (8, 256), (4, 256), (12, 128), (6, 384)]
CNN_BATCHES = [1, 8, 32, 4, 64, 16, 2, 48, 128, 8]


def train_gpt2(layers, width, heads, rounds, batch_scale=1):
    """GPT-2 trained with AdamW and bf16 autocast over GPT2_SHAPES (batches times
    `batch_scale`), `rounds` times: the loop of benches/gpu/torch_workloads.py."""
    from transformers import GPT2Config, GPT2LMHeadModel
    config = GPT2Config(n_layer=layers, n_embd=width, n_head=heads, n_positions=1024, vocab_size=50257)
    model = GPT2LMHeadModel(config).to(DEV)
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-4)
    for _ in range(rounds):
        for batch, length in GPT2_SHAPES:
            ids = torch.randint(0, config.vocab_size, (batch * batch_scale, length), device=DEV)
            with torch.autocast("cuda", dtype=torch.bfloat16):
                loss = model(ids, labels=ids).loss
            loss.backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)


def serve_resnet50(batches, side, rounds):
    """ResNet-50 (timm) inference on `side` x `side` images at each of `batches`, `rounds`
    times, fp16, channels-last: the CNN of benches/gpu/torch_workloads.py."""
    import timm
    model = timm.create_model("resnet50", pretrained=False).to(DEV).half().eval()
    model = model.to(memory_format=torch.channels_last)
    with torch.inference_mode():
        for _ in range(rounds):
            for batch in batches:
                image = torch.randn(batch, 3, side, side, device=DEV, dtype=torch.half)
                model(image.contiguous(memory_format=torch.channels_last))


def gpt2_train_cycled():
    """GPT-2 (6 x 512) over eight batch x sequence shapes, cycled four times: the steady state
    (the same shapes coming round again) is where an allocator that returns memory pays for it."""
    train_gpt2(layers=6, width=512, heads=8, rounds=4)


def cnn_serve_cycled():
    """ResNet-50 at ten batch sizes (1 to 128) cycled five times, the same sizes coming round
    again."""
    serve_resnet50(CNN_BATCHES, side=224, rounds=5)


def gpt2_train_large():
    """GPT-2 medium (24 x 1024) at eight times gpt2_train_cycled's batches, two rounds:
    torch_workloads.py --size large, a process holding ~55 GB (blocks of up to 3.5 GB)."""
    train_gpt2(layers=24, width=1024, heads=16, rounds=2, batch_scale=8)


def cnn_serve_large():
    """ResNet-50 serving 384 x 384 images at ten batch sizes from 16 to 2,048, cycled three
    times: torch_workloads.py --size large (~32 GB at the largest batch)."""
    serve_resnet50([16, 128, 512, 64, 1024, 256, 32, 768, 2048, 128], side=384, rounds=3)
