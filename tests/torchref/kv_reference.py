"""An independent float32 reference for greedy generation with a KV cache.

GPT-2 and Llama written for the test from Hugging Face's semantics, not
from gcompile's code: each prompt runs on its own (batch 1), the whole
prompt in one forward with an empty cache, then one token at a time with
past_key_values, positions offset by the cache's length.

Reads a JSON job on stdin, writes a JSON result on stdout:
  job    {"family": "gpt2"|"llama", "config": {...}, "weights": FILE.safetensors,
          "prompts": [[ids]...], "new_tokens": N, "dtype": "float32"|"float64", "threads": 1}
  result {"ids": [[new ids] per prompt], "logits": [[[vocab floats] per new token] per prompt]}
logits[p][t] are the logits token t of prompt p was chosen from (argmax,
the first of equal maxima, as torch.argmax).
"""
import json
import math
import struct
import sys

import numpy as np
import torch

DTYPES = {"F32": np.float32, "F64": np.float64, "F16": np.float16}


def read_safetensors(path):
    with open(path, "rb") as f:
        raw = f.read()
    (n,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8 : 8 + n])
    data = raw[8 + n :]
    out = {}
    for name, t in header.items():
        if name == "__metadata__":
            continue
        lo, hi = t["data_offsets"]
        buf = data[lo:hi]
        if t["dtype"] == "BF16":
            u = np.frombuffer(buf, dtype=np.uint16).astype(np.uint32) << 16
            arr = u.view(np.float32)
        else:
            arr = np.frombuffer(buf, dtype=DTYPES[t["dtype"]])
        out[name] = torch.from_numpy(arr.reshape(t["shape"]).copy())
    return out


class GPT2:
    """HF GPT2LMHeadModel: Conv1D weights [in, out], gelu_new, tied head."""

    def __init__(self, w, cfg):
        self.w = {k.removeprefix("transformer."): v for k, v in w.items()}
        self.layers, self.heads = cfg["layers"], cfg["heads"]
        self.eps = cfg.get("eps", 1e-5)

    def ln(self, x, name):
        return torch.nn.functional.layer_norm(x, x.shape[-1:], self.w[name + ".weight"], self.w[name + ".bias"], self.eps)

    def conv1d(self, x, name):
        return x @ self.w[name + ".weight"] + self.w[name + ".bias"]

    def forward(self, ids, cache):
        w, past = self.w, cache[0][0].shape[1] if cache else 0
        pos = torch.arange(past, past + len(ids))
        x = w["wte.weight"][ids] + w["wpe.weight"][pos]
        new_cache = []
        for i in range(self.layers):
            p = f"h.{i}"
            h = self.ln(x, p + ".ln_1")
            q, k, v = self.conv1d(h, p + ".attn.c_attn").split(x.shape[-1], dim=-1)
            q, k, v = (t.view(len(ids), self.heads, -1).transpose(0, 1) for t in (q, k, v))
            if cache:
                k, v = torch.cat([cache[i][0], k], 1), torch.cat([cache[i][1], v], 1)
            new_cache.append((k, v))
            a = attend(q, k, v, past)
            x = x + self.conv1d(a, p + ".attn.c_proj")
            h = self.conv1d(self.ln(x, p + ".ln_2"), p + ".mlp.c_fc")
            h = 0.5 * h * (1 + torch.tanh(math.sqrt(2 / math.pi) * (h + 0.044715 * h**3)))
            x = x + self.conv1d(h, p + ".mlp.c_proj")
        return self.ln(x, "ln_f") @ w["wte.weight"].T, new_cache


class Llama:
    """HF LlamaForCausalLM: nn.Linear weights [out, in], RMSNorm, rotate-half RoPE, repeat_kv, SwiGLU."""

    def __init__(self, w, cfg):
        self.w, self.cfg = w, cfg
        self.heads, self.kv = cfg["heads"], cfg.get("kv_heads", cfg["heads"])
        self.hd = cfg.get("head_dim") or cfg["hidden"] // cfg["heads"]
        self.eps, self.theta = cfg.get("rms_norm_eps", 1e-5), cfg.get("rope_theta", 10000.0)
        self.inv = 1.0 / (self.theta ** (torch.arange(0, self.hd, 2, dtype=torch.float64) / self.hd))

    def rms(self, x, name):
        var = x.pow(2).mean(-1, keepdim=True)
        return x * torch.rsqrt(var + self.eps) * self.w[name + ".weight"]

    def lin(self, x, name):
        return x @ self.w[name + ".weight"].T

    def rope(self, x, pos):
        f = pos.to(torch.float64)[:, None] * self.inv[None, :]
        emb = torch.cat([f, f], -1)
        cos, sin = emb.cos().to(x.dtype), emb.sin().to(x.dtype)
        half = self.hd // 2
        rot = torch.cat([-x[..., half:], x[..., :half]], -1)
        return x * cos + rot * sin

    def forward(self, ids, cache):
        w, past = self.w, cache[0][0].shape[1] if cache else 0
        n = len(ids)
        pos = torch.arange(past, past + n)
        x = w["model.embed_tokens.weight"][ids]
        new_cache = []
        for i in range(self.cfg["layers"]):
            p = f"model.layers.{i}"
            h = self.rms(x, p + ".input_layernorm")
            q = self.lin(h, p + ".self_attn.q_proj").view(n, self.heads, self.hd).transpose(0, 1)
            k = self.lin(h, p + ".self_attn.k_proj").view(n, self.kv, self.hd).transpose(0, 1)
            v = self.lin(h, p + ".self_attn.v_proj").view(n, self.kv, self.hd).transpose(0, 1)
            q, k = self.rope(q, pos), self.rope(k, pos)
            if cache:
                k, v = torch.cat([cache[i][0], k], 1), torch.cat([cache[i][1], v], 1)
            new_cache.append((k, v))
            rep = self.heads // self.kv
            kr, vr = k.repeat_interleave(rep, 0), v.repeat_interleave(rep, 0)
            x = x + self.lin(attend(q, kr, vr, past), p + ".self_attn.o_proj")
            h = self.rms(x, p + ".post_attention_layernorm")
            g = self.lin(h, p + ".mlp.gate_proj")
            x = x + self.lin(torch.nn.functional.silu(g) * self.lin(h, p + ".mlp.up_proj"), p + ".mlp.down_proj")
        return self.lin(self.rms(x, "model.norm"), "lm_head"), new_cache


def attend(q, k, v, past):
    """q [h, n, hd] at positions past…past+n−1 over k, v [h, past+n, hd], causal by absolute position."""
    n, total = q.shape[1], k.shape[1]
    s = q @ k.transpose(1, 2) / math.sqrt(q.shape[-1])
    qpos = torch.arange(past, past + n)[:, None]
    s = s.masked_fill(torch.arange(total)[None, :] > qpos, float("-inf"))
    return (torch.softmax(s, -1) @ v).transpose(0, 1).reshape(n, -1)


def main():
    job = json.load(sys.stdin)
    torch.set_num_threads(job.get("threads", 1))
    dt = torch.float64 if job.get("dtype") == "float64" else torch.float32
    w = {k: v.to(dt) for k, v in read_safetensors(job["weights"]).items()}
    model = (GPT2 if job["family"] == "gpt2" else Llama)(w, job["config"])
    res = {"ids": [], "logits": []}
    with torch.no_grad():
        for prompt in job["prompts"]:
            logits, cache = model.forward(torch.tensor(prompt), None)
            row, ids, rows = logits[-1], [], []
            for _ in range(job["new_tokens"]):
                rows.append(row.double().tolist())
                nxt = int(torch.argmax(row))
                ids.append(nxt)
                logits, cache = model.forward(torch.tensor([nxt]), cache)
                row = logits[-1]
            res["ids"].append(ids)
            res["logits"].append(rows)
    json.dump(res, sys.stdout)


if __name__ == "__main__":
    main()
