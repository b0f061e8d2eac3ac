#!/usr/bin/env python3
"""PyTorch's GPT-2 small in fp32 with TF32 off: the baseline of ndmesh's tokens/s on one GPU.

scripts/gpu_check.sh runs it on the same GPU in the same call as `ndmesh train --device cuda`
with the same shape (layers, hidden, heads, sequence, vocabulary, batch: the flags below, the
defaults being the check's GPT-2 small body), the same optimizer (AdamW) and no dropout:

    python3 scripts/gpt2_torch_baseline.py --layers 12 --hidden 768 --heads 12 --seq 1024 \
        --vocab 1024 --batch 8 --warmup 5 --steps 30

The model is llm.c's train_gpt2.py GPT: learned positions, pre-LayerNorm blocks, GELU (tanh),
causal attention through F.scaled_dot_product_attention, tied embeddings. tokens/s counts the
--steps timed steps only (after --warmup untimed ones, which build cuBLAS's plans and the
caching allocator's pool), each step ending with torch.cuda.synchronize(). Prints one JSON
line: tokens_per_second, step_seconds, device_peak (torch.cuda.max_memory_allocated), the
torch and CUDA versions and the GPU's name. Exit 2 with one line when torch or a GPU is missing.
"""
import argparse
import json
import math
import sys
import time


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--layers", type=int, default=12)
    p.add_argument("--hidden", type=int, default=768)
    p.add_argument("--heads", type=int, default=12)
    p.add_argument("--seq", type=int, default=1024)
    p.add_argument("--vocab", type=int, default=1024)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--seed", type=int, default=1)
    a = p.parse_args()
    for name in ("layers", "hidden", "heads", "seq", "vocab", "batch", "steps"):
        if getattr(a, name) < 1:
            print(f"gpt2_torch_baseline.py: --{name}={getattr(a, name)} must be >= 1", file=sys.stderr)
            return 2
    if a.hidden % a.heads:
        print(f"gpt2_torch_baseline.py: --hidden={a.hidden} is not a multiple of --heads={a.heads}", file=sys.stderr)
        return 2
    try:
        import torch
        import torch.nn as nn
        import torch.nn.functional as F
    except Exception as e:  # noqa: BLE001 (any import failure is the same one line)
        print(f"gpt2_torch_baseline.py: cannot import torch ({e}); install PyTorch with CUDA", file=sys.stderr)
        return 2
    if not torch.cuda.is_available():
        print(f"gpt2_torch_baseline.py: torch {torch.__version__} sees no CUDA GPU", file=sys.stderr)
        return 2

    # fp32 with TF32 off, as ndmesh's CUBLAS_COMPUTE_32F.
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    torch.set_float32_matmul_precision("highest")
    torch.manual_seed(a.seed)
    dev = torch.device("cuda")

    class Block(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.ln1 = nn.LayerNorm(a.hidden)
            self.qkv = nn.Linear(a.hidden, 3 * a.hidden)
            self.proj = nn.Linear(a.hidden, a.hidden)
            self.ln2 = nn.LayerNorm(a.hidden)
            self.fc = nn.Linear(a.hidden, 4 * a.hidden)
            self.fc_proj = nn.Linear(4 * a.hidden, a.hidden)

        def forward(self, x):
            b, t, c = x.shape
            q, k, v = self.qkv(self.ln1(x)).split(c, dim=2)
            q, k, v = (z.view(b, t, a.heads, c // a.heads).transpose(1, 2) for z in (q, k, v))
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            x = x + self.proj(y.transpose(1, 2).contiguous().view(b, t, c))
            return x + self.fc_proj(F.gelu(self.fc(self.ln2(x)), approximate="tanh"))

    class GPT(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.wte = nn.Embedding(a.vocab, a.hidden)
            self.wpe = nn.Embedding(a.seq, a.hidden)
            self.blocks = nn.ModuleList(Block() for _ in range(a.layers))
            self.ln_f = nn.LayerNorm(a.hidden)
            for m in self.modules():
                if isinstance(m, (nn.Linear, nn.Embedding)):
                    nn.init.normal_(m.weight, std=0.02)

        def forward(self, idx, targets):
            pos = torch.arange(idx.shape[1], device=idx.device)
            x = self.wte(idx) + self.wpe(pos)
            for blk in self.blocks:
                x = blk(x)
            logits = self.ln_f(x) @ self.wte.weight.t()  # tied
            return F.cross_entropy(logits.view(-1, a.vocab), targets.view(-1))

    model = GPT().to(dev)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-4, weight_decay=0.1, fused=False)
    params = sum(x.numel() for x in model.parameters())
    data = torch.randint(0, a.vocab, (a.batch, a.seq + 1), device=dev)
    x, y = data[:, :-1].contiguous(), data[:, 1:].contiguous()

    def step() -> float:
        opt.zero_grad(set_to_none=True)
        loss = model(x, y)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        return loss.item()  # synchronizes

    for _ in range(a.warmup):
        step()
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    times = []
    loss = math.nan
    for _ in range(a.steps):
        t0 = time.perf_counter()
        loss = step()
        torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
    total = sum(times)
    print(json.dumps({
        "tokens_per_second": a.steps * a.batch * a.seq / total,
        "step_seconds": total / a.steps,
        "step_seconds_min": min(times),
        "step_seconds_max": max(times),
        "timed_steps": a.steps,
        "warmup_steps": a.warmup,
        "parameters": params,
        "last_loss": loss,
        "device_peak": torch.cuda.max_memory_allocated(),
        "gpu": torch.cuda.get_device_name(0),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "tf32": torch.backends.cuda.matmul.allow_tf32,
    }))
    return 0


if __name__ == "__main__":
    sys.exit(main())
