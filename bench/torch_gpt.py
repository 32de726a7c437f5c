"""The reference GPT (examples/gpt/model.go) in PyTorch eager, timed on the
same device as gcompile: a GPU beside the CUDA backend (bench/gpu/run.sh),
or the CPU beside the CPU backend (bench/cpu/compare.sh).

Same architecture: token + learned position embeddings, pre-LayerNorm
blocks (fused q,k,v; causal softmax attention; GELU tanh MLP of 4h), final
LayerNorm, LM head tied to the token embedding, mean cross-entropy, AdamW.
Mixed precision is bf16 autocast with fp32 master weights, like
`--precision bf16` (GPU only). Prints median step time, tokens/s and model FLOPs
utilisation, with FLOPs per step from Narayanan et al. (2021) without
recompute: 72·B·s·l·h²·(1 + s/(6h) + V/(12·l·h)).
"""
import argparse
import json
import math
import statistics
import time

import torch
import torch.nn as nn
import torch.nn.functional as F


class Block(nn.Module):
    def __init__(self, h, heads):
        super().__init__()
        self.heads = heads
        self.ln_1, self.ln_2 = nn.LayerNorm(h), nn.LayerNorm(h)
        self.c_attn, self.attn_proj = nn.Linear(h, 3 * h), nn.Linear(h, h)
        self.c_fc, self.mlp_proj = nn.Linear(h, 4 * h), nn.Linear(4 * h, h)

    def forward(self, x, sdpa):
        b, s, h = x.shape
        q, k, v = self.c_attn(self.ln_1(x)).split(h, dim=2)
        q, k, v = (t.view(b, s, self.heads, h // self.heads).transpose(1, 2) for t in (q, k, v))
        if sdpa:
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        else:
            att = (q @ k.transpose(-2, -1)) / math.sqrt(h // self.heads)
            mask = torch.ones(s, s, device=x.device, dtype=torch.bool).tril()
            y = att.masked_fill(~mask, float("-inf")).softmax(-1) @ v
        x = x + self.attn_proj(y.transpose(1, 2).reshape(b, s, h))
        return x + self.mlp_proj(F.gelu(self.c_fc(self.ln_2(x)), approximate="tanh"))


class GPT(nn.Module):
    def __init__(self, layers, h, heads, vocab, seq):
        super().__init__()
        self.wte, self.wpe = nn.Embedding(vocab, h), nn.Embedding(seq, h)
        self.blocks = nn.ModuleList(Block(h, heads) for _ in range(layers))
        self.ln_f = nn.LayerNorm(h)

    def forward(self, tokens, targets, sdpa):
        x = self.wte(tokens) + self.wpe.weight[: tokens.shape[1]]
        for blk in self.blocks:
            x = blk(x, sdpa)
        logits = self.ln_f(x) @ self.wte.weight.t()
        return F.cross_entropy(logits.view(-1, logits.shape[-1]).float(), targets.view(-1))


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    p.add_argument("--threads", type=int, default=0, help="CPU: intra-op threads (0: PyTorch's default)")
    p.add_argument("--layers", type=int, default=24)
    p.add_argument("--hidden", type=int, default=2048)
    p.add_argument("--heads", type=int, default=16)
    p.add_argument("--vocab", type=int, default=51200)
    p.add_argument("--seq", type=int, default=2048)
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--precision", default="bf16", choices=["bf16", "fp32"])
    p.add_argument("--attention", default="naive", choices=["naive", "sdpa"],
                   help="naive matches gcompile's unfused attention; sdpa is PyTorch's fused kernel (PyTorch >= 2.0)")
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--peak-tflops", type=float, default=989.0, help="dense peak of the device (H100 SXM bf16: 989)")
    args = p.parse_args()
    dev = args.device
    if dev == "cpu":
        # Autocast on a CPU is bf16 emulation, not what gcompile's CPU
        # backend runs; compare fp32 with fp32.
        args.precision = "fp32"
        if args.threads:
            torch.set_num_threads(args.threads)
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.manual_seed(1)
    model = GPT(args.layers, args.hidden, args.heads, args.vocab, args.seq).to(dev)
    # The fused AdamW exists only for CUDA tensors (and only from PyTorch 2.0).
    extra = {"fused": True} if dev == "cuda" else {}
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, weight_decay=0.1, **extra)
    params = sum(p.numel() for p in model.parameters())
    b, s, l, h, v = args.batch, args.seq, args.layers, args.hidden, args.vocab
    flops = 72 * b * s * l * h * h * (1 + s / (6 * h) + v / (12 * l * h))
    gen = torch.Generator(device=dev).manual_seed(2)
    tokens = torch.randint(0, v, (b, s), device=dev, generator=gen)
    targets = torch.randint(0, v, (b, s), device=dev, generator=gen)
    times, losses = [], []
    for step in range(args.warmup + args.steps):
        if dev == "cuda":
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
        else:
            t0 = time.perf_counter()
        with torch.autocast(dev, dtype=torch.bfloat16, enabled=args.precision == "bf16"):
            loss = model(tokens, targets, args.attention == "sdpa")
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        if dev == "cuda":
            end.record()
            end.synchronize()
            ms = start.elapsed_time(end)
        else:
            ms = (time.perf_counter() - t0) * 1e3
        losses.append(loss.item())
        if step >= args.warmup:
            times.append(ms)
    ms = statistics.median(times)
    out = {"device": torch.cuda.get_device_name() if dev == "cuda" else "cpu",
           "threads": torch.get_num_threads(), "torch": torch.__version__, "params": params,
           "layers": l, "hidden": h, "heads": args.heads, "vocab": v, "seq": s, "batch": b,
           "precision": args.precision, "attention": args.attention, "median_step_ms": ms,
           "tokens_per_s": b * s / (ms * 1e-3), "model_tflops_per_step": flops / 1e12,
           "mfu": flops / (ms * 1e-3) / (args.peak_tflops * 1e12),
           "max_mem_gib": torch.cuda.max_memory_allocated() / 2**30 if dev == "cuda" else None,
           "first_losses": losses[:3], "spread_ms": [min(times), max(times)]}
    print("torch_gpt", json.dumps(out))


if __name__ == "__main__":
    main()
