#!/usr/bin/env python3
"""PyTorch's GPT-2 small (fp32 with TF32 off, or bf16): the baseline of ndmesh's tokens/s on one GPU.

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

The bf16 baseline of the GPT-2 small benchmark (what a GPU user runs):

    python3 scripts/gpt2_torch_baseline.py --vocab 50257 --pad-vocab 128 --batch 16 \
        --precision bf16 [--compile] --data tokens.bin --warmup 5 --steps 30

--precision bf16: bf16 autocast (fp32 master weights, fp32 AdamW, fused), flash SDPA, TF32
allowed for what stays fp32; --compile: torch.compile(model) (the warm-up steps compile);
--pad-vocab M: the embedding rows padded to a multiple of M (the loss reads the first
--vocab logits); --data: a raw uint16 token file (nanoGPT's train.bin, or llm.c's .bin
with its 1024-byte header: scripts/make_token_file.py), read as consecutive batches.
The JSON adds mfu: (6 N + 6 L T C) FLOPs a token (N the parameters, L layers, T the
sequence, C the width) times tokens/s over --peak-tflops (989: an H100's dense bf16).
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
    p.add_argument("--precision", choices=("fp32", "bf16"), default="fp32")
    p.add_argument("--compile", action="store_true")
    p.add_argument("--pad-vocab", type=int, default=1)
    p.add_argument("--data", default="")
    p.add_argument("--peak-tflops", type=float, default=989.0)
    a = p.parse_args()
    for name in ("layers", "hidden", "heads", "seq", "vocab", "batch", "steps", "pad_vocab"):
        if getattr(a, name) < 1:
            print(f"gpt2_torch_baseline.py: --{name.replace('_', '-')}={getattr(a, name)} must be >= 1",
                  file=sys.stderr)
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

    bf16 = a.precision == "bf16"
    # fp32 with TF32 off, as ndmesh's CUBLAS_COMPUTE_32F; bf16: autocast, TF32 for the rest.
    torch.backends.cuda.matmul.allow_tf32 = bf16
    torch.backends.cudnn.allow_tf32 = bf16
    torch.set_float32_matmul_precision("high" if bf16 else "highest")
    padded = (a.vocab + a.pad_vocab - 1) // a.pad_vocab * a.pad_vocab
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
            self.wte = nn.Embedding(padded, a.hidden)
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
            if padded != a.vocab:
                logits = logits[..., : a.vocab]
            return F.cross_entropy(logits.reshape(-1, a.vocab).float(), targets.view(-1))

    model = GPT().to(dev)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-4, weight_decay=0.1, fused=bf16)
    params = sum(x.numel() for x in model.parameters())
    run = torch.compile(model) if a.compile else model
    batches = []
    if a.data:
        import numpy as np

        raw = np.memmap(a.data, dtype=np.uint16, mode="r")
        header = np.frombuffer(raw[:512].tobytes(), dtype=np.int32) if raw.size >= 512 else None
        tokens = raw[512:] if header is not None and header[0] == 20240520 else raw  # llm.c's header
        need = a.batch * (a.seq + 1)
        if tokens.size < need:
            print(f"gpt2_torch_baseline.py: --data {a.data} has {tokens.size} tokens, a batch needs {need}",
                  file=sys.stderr)
            return 2
        for i in range(min(a.warmup + a.steps, tokens.size // need)):
            chunk = torch.from_numpy(tokens[i * need:(i + 1) * need].astype(np.int64)).view(a.batch, a.seq + 1)
            batches.append(chunk.to(dev))
    else:
        batches.append(torch.randint(0, a.vocab, (a.batch, a.seq + 1), device=dev))
    count = [0]

    def step() -> float:
        data = batches[count[0] % len(batches)]
        count[0] += 1
        x, y = data[:, :-1].contiguous(), data[:, 1:].contiguous()
        opt.zero_grad(set_to_none=True)
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=bf16):
            loss = run(x, y)
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
    tps = a.steps * a.batch * a.seq / total
    flops_per_token = 6 * params + 6 * a.layers * a.seq * a.hidden
    print(json.dumps({
        "precision": a.precision,
        "compiled": a.compile,
        "mfu": tps * flops_per_token / (a.peak_tflops * 1e12),
        "flops_per_token": flops_per_token,
        "tokens_per_second": tps,
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
