#!/usr/bin/env python3
"""A mixture-of-experts MLP of ndmesh against PyTorch, forward and gradients, in float64.

Runs moe_dump (ndmesh's nn::Moe: 4 SwiGLU experts, top-2, one shared expert) for the softmax
router and for the sigmoid router with its balancing bias, rebuilds the layer in PyTorch
(Mixtral's routing: softmax, top-k, the chosen probabilities renormalised; DeepSeek-V3's:
sigmoid scores, top-k of score + bias, the chosen scores normalised; each expert
down(silu(gate x) * up x); the shared expert added) with the auxiliary loss
coeff * E * sum_e f_e * P_e, and compares the output, the auxiliary loss, the input's gradient
and every parameter's gradient of <out, dout> + aux_weight * aux (autograd) within 1e-9
relative to each tensor's largest value. Exit 77 when torch is missing.

usage: moe_torch.py <path to moe_dump>
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

BOUND = 1e-9


def check(dump, router):
    d = json.loads(subprocess.run([dump, router], check=True, capture_output=True, text=True).stdout)
    f64 = torch.float64
    C, E, K, F, N = d["channels"], d["experts"], d["top_k"], d["expert_ffn"], d["rows"]
    p = {name: torch.tensor(v["values"], dtype=f64).reshape(v["shape"]).requires_grad_(True)
         for name, v in d["params"].items()}
    x = torch.tensor(d["x"], dtype=f64).reshape(N, C).requires_grad_(True)

    def swiglu_mlp(t, prefix, width):
        gate, up = torch.split(t @ p[prefix + ".fc.weight"].T, [width, width], dim=-1)
        return (torch.nn.functional.silu(gate) * up) @ p[prefix + ".proj.weight"].T

    logits = x @ p["moe.router.weight"].T
    if router == "softmax":
        probs = logits.softmax(-1)
        choice = probs.detach()
        q = probs
    else:
        probs = torch.sigmoid(logits)
        choice = probs.detach() + p["moe.router.bias"].detach()
        q = probs / probs.sum(-1, keepdim=True)
    idx = torch.topk(choice, K, dim=-1).indices  # [N, K]
    w = probs.gather(1, idx)
    w = w / w.sum(-1, keepdim=True)
    out = torch.zeros(N, C, dtype=f64)
    for e in range(E):
        rows, slots = (idx == e).nonzero(as_tuple=True)
        if len(rows) == 0:
            continue
        y = swiglu_mlp(x[rows], f"moe.experts.{e}", F)
        out = out.index_add(0, rows, w[rows, slots].unsqueeze(1) * y)
    out = out + swiglu_mlp(x, "moe.shared", d["shared"] * F)
    f = torch.stack([(idx == e).sum() for e in range(E)]).to(f64) / (N * K)
    aux = d["aux_coeff"] * E * (f * q.mean(0)).sum()
    loss = (out * torch.tensor(d["dout"], dtype=f64).reshape(N, C)).sum() + d["aux_weight"] * aux
    loss.backward()

    compare = Comparison(BOUND, router)

    compare("output", d["out"], out.detach())
    compare("auxiliary loss", [d["aux"]], aux.detach().reshape(1))
    compare("input gradient", d["dx"], x.grad)
    for name in sorted(p):
        if name == "moe.router.bias":  # picks the experts, weighs nothing: no gradient
            continue
        if p[name].grad is None:  # an expert no token chose: no gradient on either side
            sys.exit(f"FAIL: {router}: no token chose {name}'s expert; pick another seed so that the test covers it")
        compare(f"gradient of {name}", d["grads"][name], p[name].grad)
    return compare.worst


def main():
    worst = max(check(sys.argv[1], "softmax"), check(sys.argv[1], "sigmoid"))
    print(f"moe_torch.py: ok (largest relative difference {worst:.3g}, bound {BOUND})")


if __name__ == "__main__":
    main()
