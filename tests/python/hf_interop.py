"""Hugging Face interop against transformers itself (an implementation nobody here wrote).

Tiny random GPT-2 and Llama models (GQA; tied and untied heads; every weight drawn, norms
included, so a swapped or transposed tensor changes the numbers) are saved by
save_pretrained, imported with `ndmesh checkpoint import-hf`, and `ndmesh eval`'s mean loss
over the consecutive windows of a token file must equal transformers' mean next-token loss on
the same tokens within 1e-5 relative, serially and under --tp 2 and --pp 2; a one-step
`ndmesh train --load` of the import on that file is a fresh run (step 1).
`export-hf` of the import must load with from_pretrained with no missing or unexpected keys
and give the same logits; a model fine-tuned for three steps exports and loads too (its loss
in transformers equals ndmesh eval's of the fine-tuned checkpoint); a bf16 file imports; a
bf16 export loads as bfloat16.

  hf_interop.py NDMESH WORKDIR [MPIRUN]
"""

import json
import os
import struct
import subprocess
import sys

import torch
import transformers
from transformers import AutoModelForCausalLM, GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM

NDMESH, WORK = sys.argv[1], sys.argv[2]
MPIRUN = sys.argv[3] if len(sys.argv) > 3 else ""
VOCAB, SEQ, BATCH, BATCHES = 100, 16, 2, 2
failures = []


def check(ok, what):
    print(("ok: " if ok else "FAIL: ") + what, flush=True)
    if not ok:
        failures.append(what)


def run(args, np=1):
    cmd = [NDMESH] + args
    if np > 1:
        cmd = [MPIRUN, "--allow-run-as-root", "--oversubscribe", "-np", str(np)] + cmd
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        raise SystemExit(f"FAIL: {' '.join(cmd)} exited {r.returncode}:\n{r.stdout}\n{r.stderr}")
    return r.stdout


def randomize(model, gen):
    """Every parameter drawn (norm weights around 1), so no tensor is at its default."""
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "ln" in name or "norm" in name:
                p.copy_(1 + 0.2 * torch.randn(p.shape, generator=gen))
            else:
                p.copy_(0.15 * torch.randn(p.shape, generator=gen))
    return model.eval()


def token_file(path, tokens):
    with open(path, "wb") as f:
        f.write(struct.pack("<256i", 20240520, 1, len(tokens), *([0] * 253)))
        f.write(struct.pack(f"<{len(tokens)}H", *tokens))


def hf_loss(model, tokens):
    """Mean next-token loss over the consecutive windows of SEQ tokens (llm.c's targets)."""
    n = BATCH * BATCHES
    with torch.no_grad():
        ids = torch.tensor([tokens[k * SEQ : (k + 1) * SEQ] for k in range(n)])
        targets = torch.tensor([tokens[k * SEQ + 1 : (k + 1) * SEQ + 1] for k in range(n)])
        logits = model(input_ids=ids).logits.double()
        return torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1)).item()


def ndmesh_loss(ckpt, data, extra=(), np=1):
    out = run(["eval", "--load", ckpt, "--data", data, "--seq", str(SEQ), "--batch", str(BATCH), "--batches",
               str(BATCHES), "--threads", "1", "--json", *extra], np)
    j = json.loads(out.strip().splitlines()[-1])
    assert j["tokens"] == BATCH * BATCHES * SEQ, j
    return j["loss"], j


def first_step(ckpt, data):
    out = run(["train", "--load", ckpt, "--data", data, "--vocab", str(VOCAB), "--seq", str(SEQ), "--batch", "2",
               "--steps", "1", "--threads", "1", "--json"])
    return json.loads(out.strip().splitlines()[-1])


def rel(a, b):
    return abs(a - b) / abs(b)


gen = torch.Generator().manual_seed(0)
tokens = torch.randint(0, VOCAB, (BATCHES * BATCH * SEQ + 1,), generator=gen).tolist()
data = os.path.join(WORK, "tokens.bin")
token_file(data, tokens)

models = {
    "gpt2-tied": GPT2LMHeadModel(GPT2Config(vocab_size=VOCAB, n_positions=32, n_embd=32, n_layer=2, n_head=4)),
    "gpt2-untied": GPT2LMHeadModel(
        GPT2Config(vocab_size=VOCAB, n_positions=32, n_embd=32, n_layer=2, n_head=4, tie_word_embeddings=False)),
    "llama-gqa": LlamaForCausalLM(
        LlamaConfig(vocab_size=VOCAB, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
                    num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=32)),
    "llama-gqa-tied": LlamaForCausalLM(
        LlamaConfig(vocab_size=VOCAB, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
                    num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=32,
                    rope_theta=500000.0, tie_word_embeddings=True)),
}
print(f"transformers {transformers.__version__}, torch {torch.__version__}", flush=True)
for name, model in models.items():
    model = randomize(model, gen)
    if model.config.tie_word_embeddings:
        model.tie_weights()
    hf_dir, ckpt = os.path.join(WORK, name + "-hf"), os.path.join(WORK, name + ".ckpt")
    model.save_pretrained(hf_dir)
    # Leave out the keys transformers writes with their defaults: the import's defaults must be
    # transformers' own (GPT-2: tied, n_inner 4 * n_embd; Llama: rms_norm_eps 1e-6, untied, ...).
    config_path = os.path.join(hf_dir, "config.json")
    config = json.load(open(config_path))
    for key in ["n_inner", "layer_norm_epsilon", "activation_function", "rms_norm_eps", "num_key_value_heads",
                "hidden_act"] + (["tie_word_embeddings"] if name == "gpt2-tied" else []):
        if key == "num_key_value_heads" and config.get(key) != config.get("num_attention_heads"):
            continue
        config.pop(key, None)
    json.dump(config, open(config_path, "w"))
    run(["checkpoint", "import-hf", hf_dir, ckpt])
    want = hf_loss(model, tokens)
    got, _ = ndmesh_loss(ckpt, data)
    check(rel(got, want) < 1e-5, f"{name}: ndmesh eval {got:.9f} vs transformers {want:.9f} (rel {rel(got, want):.2e})")
    summary = first_step(ckpt, data)
    check(summary["first_step"] == 1 and summary["steps"] == 1, f"{name}: a fresh run from the import (step 1)")
    if MPIRUN and name in ("llama-gqa", "gpt2-tied"):
        for flags in (["--tp", "2"], ["--pp", "2"]):
            got2, _ = ndmesh_loss(ckpt, data, flags, np=2)
            check(rel(got2, want) < 1e-5, f"{name} {' '.join(flags)}: eval {got2:.9f} vs transformers {want:.9f}")

    # Export of the import: the same model for transformers.
    out = os.path.join(WORK, name + "-out")
    run(["checkpoint", "export-hf", ckpt, out])
    back, info = AutoModelForCausalLM.from_pretrained(out, output_loading_info=True)
    check(not info["missing_keys"] and not info["unexpected_keys"] and not info["mismatched_keys"],
          f"{name}: export loads with no missing/unexpected keys ({info})")
    meta = json.loads(open(os.path.join(out, "model.safetensors"), "rb").read()[8:][:4096].split(b"}}")[0] + b"}}")
    check(meta.get("__metadata__") == {"format": "pt"}, f"{name}: __metadata__ is {{'format': 'pt'}}")
    with torch.no_grad():
        ids = torch.tensor([tokens[:SEQ]])
        a, b = model(input_ids=ids).logits, back.eval()(input_ids=ids).logits
    check(torch.allclose(a, b, rtol=1e-5, atol=1e-5), f"{name}: exported logits match (max diff {(a - b).abs().max():.2e})")

    # Three fine-tuning steps, exported: loads, and its loss in transformers is ndmesh's.
    tuned, tuned_out = os.path.join(WORK, name + "-tuned.ckpt"), os.path.join(WORK, name + "-tuned-hf")
    run(["train", "--load", ckpt, "--data", data, "--vocab", str(VOCAB), "--seq", str(SEQ), "--batch", "2",
         "--steps", "3", "--lr", "1e-2", "--warmup", "0", "--threads", "1", "--save", tuned])
    run(["checkpoint", "export-hf", tuned, tuned_out])
    tuned_model, info = AutoModelForCausalLM.from_pretrained(tuned_out, output_loading_info=True)
    check(not info["missing_keys"] and not info["unexpected_keys"], f"{name}: the fine-tuned export loads")
    t_want, (t_got, _) = hf_loss(tuned_model.eval(), tokens), ndmesh_loss(tuned, data)
    check(rel(t_got, t_want) < 1e-5 and rel(t_want, want) > 1e-4,
          f"{name}: fine-tuned loss {t_got:.9f} in ndmesh vs {t_want:.9f} in transformers (was {want:.9f})")

# bf16: a bf16 file imports (the loss of its bf16 values), and a bf16 export loads as bfloat16.
model = models["llama-gqa"]
bf16_dir, bf16_ckpt = os.path.join(WORK, "bf16-hf"), os.path.join(WORK, "bf16.ckpt")
model.to(torch.bfloat16).save_pretrained(bf16_dir)
# The bf16 values exactly, in float32 (loaded afresh: .to() would also round the rotary
# frequencies, which are computed, not stored).
model = AutoModelForCausalLM.from_pretrained(bf16_dir, torch_dtype=torch.float32).eval()
run(["checkpoint", "import-hf", bf16_dir, bf16_ckpt])
want, (got, _) = hf_loss(model, tokens), ndmesh_loss(bf16_ckpt, data)
check(rel(got, want) < 1e-5, f"bf16 import: loss {got:.9f} vs transformers {want:.9f}")
bf16_out = os.path.join(WORK, "bf16-out")
run(["checkpoint", "export-hf", bf16_ckpt, bf16_out, "--dtype", "bf16"])
back = AutoModelForCausalLM.from_pretrained(bf16_out, torch_dtype="auto")
check(back.dtype == torch.bfloat16, f"bf16 export loads as {back.dtype}")
check(rel(hf_loss(back.to(torch.float32).eval(), tokens), want) < 1e-5, "bf16 export of bf16 values is exact")

# An existing output folder is refused without --force (exit 2, one line naming it).
r = subprocess.run([NDMESH, "checkpoint", "export-hf", bf16_ckpt, bf16_out], capture_output=True, text=True)
check(r.returncode == 2 and bf16_out in r.stderr and "--force" in r.stderr, f"existing folder refused: {r.stderr!r}")

if failures:
    raise SystemExit(f"{len(failures)} check(s) failed")
print("hf_interop.py: ok")
