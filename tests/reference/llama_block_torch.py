#!/usr/bin/env python3
"""A Llama block of ndmesh against PyTorch, forward and gradients, in float64.

Runs llama_block_dump (ndmesh's nn::Block with RMSNorm, rotary positions, grouped-query
attention, SwiGLU, no biases, at the positions a context-parallel rank holds), rebuilds the
block in PyTorch as Hugging Face's LlamaDecoderLayer computes it (RMSNorm x / sqrt(mean x^2 +
eps) * w; q and k rotated by rotate_half with inverse frequencies 1 / theta^(2i/d) at the given
position ids; causal softmax(q k^T / sqrt(d)) v with each key/value head shared by heads/kv
query heads; down(silu(gate x) * up x); two residual adds), from ndmesh's parameters, and
compares the output, the input's gradient and every parameter's gradient (autograd, given the
same output gradient) within 1e-9 relative to each tensor's largest value. Exit 77 when torch
is missing (Debian: python3-torch, which make deps installs).

usage: llama_block_torch.py <path to llama_block_dump>
"""
import json
import subprocess
import sys

try:
    import torch
except ImportError:
    print("SKIP: no torch for this python3 (apt-get install python3-torch)")
    sys.exit(77)

from compare import Comparison  # noqa: E402 (needs torch, checked above)

BOUND = 1e-9  # float64 on both sides: measured 7e-16; a wrong rotation, mask or gate is off by 1e-2 and more


def main():
    d = json.loads(subprocess.run([sys.argv[1]], check=True, capture_output=True, text=True).stdout)
    f64 = torch.float64
    C, H, KV, F = d["channels"], d["heads"], d["kv_heads"], d["ffn"]
    B, S = d["batch"], d["seq"]
    hd = C // H
    p = {name: torch.tensor(v["values"], dtype=f64).reshape(v["shape"]).requires_grad_(True)
         for name, v in d["params"].items()}
    names = sorted(p)
    want = {"block.ln1.weight", "block.attn.qkv.weight", "block.attn.proj.weight", "block.ln2.weight",
            "block.mlp.fc.weight", "block.mlp.proj.weight"}
    if set(names) != want:
        sys.exit(f"FAIL: parameters {names}, expected {sorted(want)} (a Llama block has no biases)")
    x = torch.tensor(d["x"], dtype=f64).reshape(B, S, C).requires_grad_(True)
    pos = torch.tensor(d["positions"], dtype=f64)

    def rmsnorm(t, w):
        return t * torch.rsqrt(t.pow(2).mean(-1, keepdim=True) + d["eps"]) * w

    inv_freq = 1.0 / (d["theta"] ** (torch.arange(0, hd, 2, dtype=f64) / hd))
    ang = pos[:, None] * inv_freq[None, :]
    emb = torch.cat([ang, ang], dim=-1)
    cos, sin = emb.cos(), emb.sin()

    def rotate_half(t):
        return torch.cat([-t[..., hd // 2:], t[..., :hd // 2]], dim=-1)

    def rope(t):  # [B, heads, S, hd]
        return t * cos + rotate_half(t) * sin

    h = rmsnorm(x, p["block.ln1.weight"])
    wq, wk, wv = torch.split(p["block.attn.qkv.weight"], [H * hd, KV * hd, KV * hd], dim=0)
    q = (h @ wq.T).view(B, S, H, hd).transpose(1, 2)
    k = (h @ wk.T).view(B, S, KV, hd).transpose(1, 2)
    v = (h @ wv.T).view(B, S, KV, hd).transpose(1, 2)
    q, k = rope(q), rope(k)
    k = k.repeat_interleave(H // KV, dim=1)
    v = v.repeat_interleave(H // KV, dim=1)
    scores = q @ k.transpose(-1, -2) / hd ** 0.5
    scores = scores.masked_fill(torch.triu(torch.ones(S, S, dtype=torch.bool), 1), float("-inf"))
    attn = (scores.softmax(-1) @ v).transpose(1, 2).reshape(B, S, H * hd)
    h1 = x + attn @ p["block.attn.proj.weight"].T
    g = rmsnorm(h1, p["block.ln2.weight"])
    gate, up = torch.split(g @ p["block.mlp.fc.weight"].T, [F, F], dim=-1)
    out = h1 + (torch.nn.functional.silu(gate) * up) @ p["block.mlp.proj.weight"].T
    out.backward(torch.tensor(d["dout"], dtype=f64).reshape(B, S, C))

    compare = Comparison(BOUND)

    compare("output", d["out"], out.detach())
    compare("input gradient", d["dx"], x.grad)
    for name in names:
        compare(f"gradient of {name}", d["grads"][name], p[name].grad)
    print(f"llama_block_torch.py: ok (largest relative difference {compare.worst:.3g}, bound {BOUND})")


if __name__ == "__main__":
    main()
