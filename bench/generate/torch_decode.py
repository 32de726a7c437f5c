"""PyTorch eager decode speed: the baseline of gcompile's BenchmarkDecode.

The models of tests/torchref/kv_reference.py (Hugging Face semantics,
past_key_values concatenated each step, as HF's eager cache does) at
examples/gpt's and examples/llama's default sizes, random weights, float32,
one sequence. For each prompt length: the prefill of the prompt, then
--new-tokens decode steps past it; the median over --repeat runs.

  python3 bench/generate/torch_decode.py --threads 2 --prompt-lens 64,256,1024,4096
"""
import argparse
import json
import os
import statistics
import sys
import time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "tests", "torchref"))
from kv_reference import GPT2, Llama  # noqa: E402


def gpt_weights(layers, h, vocab, ctx):
    w = {"wte.weight": [vocab, h], "wpe.weight": [ctx, h], "ln_f.weight": [h], "ln_f.bias": [h]}
    for i in range(layers):
        p = f"h.{i}"
        w.update({p + ".ln_1.weight": [h], p + ".ln_1.bias": [h], p + ".ln_2.weight": [h], p + ".ln_2.bias": [h],
                  p + ".attn.c_attn.weight": [h, 3 * h], p + ".attn.c_attn.bias": [3 * h],
                  p + ".attn.c_proj.weight": [h, h], p + ".attn.c_proj.bias": [h],
                  p + ".mlp.c_fc.weight": [h, 4 * h], p + ".mlp.c_fc.bias": [4 * h],
                  p + ".mlp.c_proj.weight": [4 * h, h], p + ".mlp.c_proj.bias": [h]})
    return {k: torch.randn(s) * 0.02 for k, s in w.items()}


def llama_weights(layers, h, heads, kv, ffn, vocab):
    hd = h // heads
    w = {"model.embed_tokens.weight": [vocab, h], "model.norm.weight": [h], "lm_head.weight": [vocab, h]}
    for i in range(layers):
        p = f"model.layers.{i}"
        w.update({p + ".input_layernorm.weight": [h], p + ".post_attention_layernorm.weight": [h],
                  p + ".self_attn.q_proj.weight": [heads * hd, h], p + ".self_attn.k_proj.weight": [kv * hd, h],
                  p + ".self_attn.v_proj.weight": [kv * hd, h], p + ".self_attn.o_proj.weight": [h, heads * hd],
                  p + ".mlp.gate_proj.weight": [ffn, h], p + ".mlp.up_proj.weight": [ffn, h], p + ".mlp.down_proj.weight": [h, ffn]})
    return {k: torch.randn(s) * 0.02 for k, s in w.items()}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--family", default="gpt2,llama")
    ap.add_argument("--prompt-lens", default="64,256,1024,4096")
    ap.add_argument("--new-tokens", type=int, default=64)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--repeat", type=int, default=3)
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    torch.manual_seed(1)
    records = []
    for fam in a.family.split(","):
        for p in [int(x) for x in a.prompt_lens.split(",")]:
            if fam == "gpt2":
                model = GPT2(gpt_weights(2, 128, 256, p + a.new_tokens), {"layers": 2, "heads": 4})
            else:
                model = Llama(llama_weights(2, 128, 4, 2, 352, 256), {"layers": 2, "hidden": 128, "heads": 4, "kv_heads": 2, "ffn": 352})
            prompt = torch.tensor([(i * 7) % 256 for i in range(p)])
            pre, dec = [], []
            with torch.no_grad():
                for _ in range(a.repeat):
                    t0 = time.perf_counter()
                    _, cache = model.forward(prompt, None)
                    t1 = time.perf_counter()
                    for _ in range(a.new_tokens):
                        _, cache = model.forward(torch.tensor([1]), cache)
                    t2 = time.perf_counter()
                    pre.append(t1 - t0)
                    dec.append((t2 - t1) / a.new_tokens)
            r = {"family": fam, "prompt_len": p, "threads": a.threads, "prefill_ms": 1e3 * statistics.median(pre),
                 "decode_ms_per_token": 1e3 * statistics.median(dec), "decode_tokens_per_s": 1 / statistics.median(dec)}
            records.append(r)
            print(f"{fam} prompt_len={p} threads={a.threads} prefill_ms={r['prefill_ms']:.1f} "
                  f"decode_ms_per_token={r['decode_ms_per_token']:.3f} decode_tokens_per_s={r['decode_tokens_per_s']:.0f}", flush=True)
    print(json.dumps(records))


if __name__ == "__main__":
    main()
