#!/usr/bin/env python3
"""The comparisons of scripts/gpu_check.sh, each printing one line that starts with PASS or FAIL.

    gpu_check_compare.py equal <cpu.json> <cuda.json>        ndmesh train --json of both devices
    gpu_check_compare.py resumed <full.json> <resumed.json>  a run resumed at step 10 against the full one
    gpu_check_compare.py offload <cuda.json> <offload.json>  --offload optimizer (pinned host) against without
    gpu_check_compare.py bf16 <fp32.json> <bf16.json> ...    bf16 tracking fp32 (pairs of runs)
    gpu_check_compare.py bf16-devices <cpu.json> <cuda.json> cuda bf16 against cpu bf16, the cpu run's steps
    gpu_check_compare.py speed <train.out> <warmup> <tokens per step> <speed.json>
    gpu_check_compare.py memory <train.json> <plan.json>     device peak against ndmesh plan memory
    gpu_check_compare.py torch <baseline.json> <speed.json>  PyTorch's tokens/s and the ratio
    gpu_check_compare.py calibration <hardware.toml>         ndmesh calibrate --device cuda's file: its rates
    gpu_check_compare.py plan <plan.json> <speed.json> <train.json>
                                                             ndmesh plan on that file against the measured run

Bounds: losses 1e-5 relative, the step-1 gradient norm 1e-5, later norms 1e-4 (as
tests/mpi/train_lib.sh); resumed losses 1e-4; bf16 against fp32 1% of the losses and 2% of the
step-1 norm; cuda bf16 against cpu bf16 2e-4, 5e-5 and 5e-3; memory within 10% of the plan; the planned step
time within 25% of the measured one. Exit 0 on PASS,
1 on FAIL; any error in reading the inputs is a FAIL line naming it.
"""
import json
import os
import re
import sys


def last_json(path):
    """The file as one JSON object (ndmesh plan --json), else its last line that starts with '{'
    (ndmesh train --json prints its object last, after the step lines)."""
    with open(path) as f:
        text = f.read()
    try:
        return json.loads(text)
    except ValueError:
        pass
    lines = [line.strip() for line in text.splitlines() if line.strip().startswith("{")]
    if not lines:
        raise ValueError(f"{path} has no JSON object")
    return json.loads(lines[-1])


def rel(xs, ys):
    return max((abs(x - y) / abs(x) if x else abs(y)) for x, y in zip(xs, ys)) if xs else 0.0


def equal(cpu_path, cuda_path):
    a, b = last_json(cpu_path), last_json(cuda_path)
    la, lb, ga, gb = a["losses"], b["losses"], a["grad_norms"], b["grad_norms"]
    if len(la) != len(lb) or len(ga) != len(gb) or not la:
        return False, f"different numbers of steps: {len(la)} and {len(lb)} losses, {len(ga)} and {len(gb)} norms"
    loss, first, later = rel(la, lb), rel(ga[:1], gb[:1]), rel(ga[1:], gb[1:])
    ok = loss < 1e-5 and first < 1e-5 and later < 1e-4
    return ok, (f"{len(la)} steps, largest relative difference: losses {loss:.3g} (bound 1e-5), "
                f"step-1 gradient norm {first:.3g} (1e-5), later gradient norms {later:.3g} (1e-4)")


def offload(cuda_path, offload_path):
    """--offload optimizer on cuda updates on the host with the CPU optimizer's loop, the run without
    it with the CUDA AdamW kernel (the same IEEE double operations, no FMA): equal within the
    equivalence bounds, and says whether bit for bit; the pinned bytes and PCIe traffic reported."""
    ok, line = equal(cuda_path, offload_path)
    a, b = last_json(cuda_path), last_json(offload_path)
    same = a["losses"] == b["losses"] and a["grad_norms"] == b["grad_norms"]
    host = b.get("memory_bytes", {}).get("optimizer_host", 0)
    pcie = b.get("offload_pcie", {})
    moved = pcie.get("bytes_to_host_per_step", 0) + pcie.get("bytes_to_device_per_step", 0)
    if b.get("offload") != "optimizer" or host <= 0 or pcie.get("bytes_to_device_per_step", 0) <= 0:
        return False, (f"the offload run reports no pinned offload: offload {b.get('offload')}, "
                       f"optimizer_host {host}, offload_pcie {pcie}")
    return ok, (f"against cuda without offload: {'bit for bit' if same else 'not bit for bit'}; {line}; "
                f"pinned host {host / 2**20:.2f} MiB, PCIe {moved / 2**20:.2f} MiB per step")


def resumed(full_path, resumed_path):
    a, b = last_json(full_path), last_json(resumed_path)
    tail, got = a["losses"][10:], b["losses"]
    if len(got) != len(tail) or not got:
        return False, f"the resumed run has {len(got)} steps, the full run {len(tail)} after step 10"
    d = rel(tail, got)
    return d < 1e-4, (f"saved on cuda at step 10, resumed on cpu: losses of steps 11-{10 + len(got)} within "
                      f"{d:.3g} of the uninterrupted cpu run (bound 1e-4)")


def bf16(*paths):
    """Pairs of (fp32, bf16) runs of one model: bf16 tracks fp32 within 1% of the loss at every
    step and within 2% of the step-1 gradient norm."""
    parts, ok = [], True
    for fp32_path, bf16_path in zip(paths[::2], paths[1::2]):
        a, b = last_json(fp32_path), last_json(bf16_path)
        la, lb, ga, gb = a["losses"], b["losses"], a["grad_norms"], b["grad_norms"]
        if len(la) != len(lb) or not la or not ga or not gb:
            return False, f"{bf16_path}: {len(lb)} losses against {len(la)} in {fp32_path}"
        loss, first = rel(la, lb), rel(ga[:1], gb[:1])
        ok = ok and loss <= 0.01 and first <= 0.02
        # Where the largest step lies, and the 25-step means (what the per-step noise of two
        # trajectories that have drifted apart leaves): to read a failure by.
        worst = max(range(len(la)), key=lambda i: abs(la[i] - lb[i]) / abs(la[i]) if la[i] else 0.0) + 1
        means = [(sum(la[i:i + 25]), sum(lb[i:i + 25])) for i in range(0, len(la), 25)]
        parts.append(f"{os.path.basename(bf16_path)}: {len(la)} steps, losses within {100 * loss:.2f}% (bound 1%) "
                     f"at step {worst}, 25-step means within {100 * rel(*zip(*means)):.2f}%, "
                     f"step-1 gradient norm {100 * first:.2f}% (2%), final loss {lb[-1]:.4f} against {la[-1]:.4f}")
    return ok, "; ".join(parts)


def bf16_devices(cpu_path, cuda_path):
    """cuda bf16 against cpu bf16 over the cpu run's steps (the first steps of the same schedule).
    Both round the same operands to bf16, but their fp32 sums run in other orders (and the tensor
    cores' adder tree is not IEEE fp32 step by step): an operand that lands within that distance of
    a rounding midpoint rounds to the other neighbour. Bounds: losses 2e-4, step-1 gradient norm
    5e-5 (bf16 and fp32 differ there by 2e-4: a cuda run that does not round fails it), later
    norms 5e-3 (tests/mpi/train_bf16.sh measures the same drift between CPU layouts: losses 3.5e-5,
    step-1 norm 8.9e-7, later norms 8.8e-4)."""
    a, b = last_json(cpu_path), last_json(cuda_path)
    n = len(a["losses"])
    la, lb, ga, gb = a["losses"], b["losses"][:n], a["grad_norms"], b["grad_norms"][:n]
    if not n or len(lb) != n or len(ga) != n or len(gb) != n:
        return False, f"{cuda_path}: {len(lb)} of {n} steps to compare with {cpu_path}"
    loss, first, later = rel(la, lb), rel(ga[:1], gb[:1]), rel(ga[1:], gb[1:])
    ok = loss < 2e-4 and first < 5e-5 and later < 5e-3
    return ok, (f"cuda bf16 against cpu bf16 over {n} steps: losses {loss:.3g} (bound 2e-4), step-1 gradient "
                f"norm {first:.3g} (5e-5), later gradient norms {later:.3g} (5e-3)")


def bf16_bench(eager_path, compiled_path, ndmesh_path):
    """GPT-2 small in bf16: PyTorch eager and torch.compile, and ndmesh's tokens/s as ratios of them."""
    parts, runs = [], {}
    for name, path in (("eager", eager_path), ("compiled", compiled_path)):
        try:
            t = last_json(path)
        except (OSError, ValueError) as e:
            parts.append(f"PyTorch {name}: no result ({e})")
            continue
        runs[name] = t
        parts.append(f"PyTorch {t['torch']} {name} bf16: tokens/s {t['tokens_per_second']:.0f}, MFU "
                     f"{100 * t['mfu']:.1f}%, peak {t['device_peak'] / 2**30:.2f} GiB")
    if not runs:
        return False, "; ".join(parts)
    try:
        n = last_json(ndmesh_path)
        tps = n["tokens_per_second"]
        flops = next(iter(runs.values()))["flops_per_token"]
        line = f"ndmesh bf16: tokens/s {tps:.0f}, MFU {100 * tps * flops / 989e12:.1f}%"
        if "device_peak" in n:
            line += f", peak {n['device_peak'] / 2**30:.2f} GiB"
        for name, t in runs.items():
            line += f"; ndmesh/PyTorch {name} {tps / t['tokens_per_second']:.3f}"
        parts.insert(0, line)
    except (OSError, ValueError, KeyError):
        parts.insert(0, "ndmesh bf16: no tokens/s (see the step's ndmesh line)")
    return True, "; ".join(parts)


def speed(out_path, warmup, tokens_per_step, speed_path):
    # Step k's line gives the mean tokens/s since the start, so step k ended at k * tokens / tok/s.
    warmup, tokens = int(warmup), float(tokens_per_step)
    ends = {}
    with open(out_path) as f:
        for line in f:
            m = re.match(r"step (\d+)/\d+ .* tok/s (\d+)", line)
            if m and int(m.group(2)) > 0:
                ends[int(m.group(1))] = int(m.group(1)) * tokens / int(m.group(2))
    if warmup not in ends or not ends or max(ends) - warmup < 30:
        return False, f"{len(ends)} step lines in {out_path}: need steps {warmup} to {warmup + 30} at least"
    last = max(ends)
    seconds = ends[last] - ends[warmup]
    tps = (last - warmup) * tokens / seconds
    with open(speed_path, "w") as f:
        json.dump({"tokens_per_second": tps, "timed_steps": last - warmup, "warmup_steps": warmup,
                   "step_seconds": seconds / (last - warmup)}, f)
    return True, (f"tokens/s {tps:.0f} over steps {warmup + 1}-{last} ({1e3 * seconds / (last - warmup):.1f} ms a "
                  f"step; the first {warmup}, left out, took {ends[warmup]:.2f} s)")


def memory(train_path, plan_path):
    peak = last_json(train_path)["memory_bytes"]["device_peak"]
    planned = last_json(plan_path)["memory_bytes"]["total"]
    ok = peak > 0 and abs(peak / planned - 1) <= 0.10
    return ok, (f"device peak {peak / 2**30:.3f} GiB, ndmesh plan memory {planned / 2**30:.3f} GiB: "
                f"measured/planned {peak / planned:.3f} (bound: within 10%)")


def torch(baseline_path, speed_path):
    t = last_json(baseline_path)
    line = (f"PyTorch {t['torch']} (CUDA {t['cuda']}) on {t['gpu']}, fp32, TF32 off: tokens/s "
            f"{t['tokens_per_second']:.0f} over {t['timed_steps']} steps after {t['warmup_steps']}, "
            f"peak {t['device_peak'] / 2**30:.3f} GiB")
    try:
        n = last_json(speed_path)["tokens_per_second"]
        line += f"; ndmesh/PyTorch tokens/s {n / t['tokens_per_second']:.3f}"
    except (OSError, ValueError, KeyError):
        line += "; no ndmesh tokens/s to compare with"
    return True, line


def toml_numbers(path):
    """The `key = number` lines of a hardware file, by section ("hardware.peak_tflops", ...)."""
    out, section = {}, ""
    with open(path) as f:
        for line in f:
            line = line.split("#", 1)[0].strip()
            m = re.match(r"^\[([a-z_]+)\]$", line)
            if m:
                section = m.group(1)
                continue
            m = re.match(r"^([a-z0-9_]+) = (-?[0-9.eE+-]+)$", line)
            if m:
                out[f"{section}.{m.group(1)}"] = float(m.group(2))
    return out


def calibration(toml_path):
    n = toml_numbers(toml_path)
    keys = ["peak_tflops", "bf16_tflops", "attention_tflops", "memory_gbps", "host_to_device_gbps",
            "device_to_host_gbps", "memory_gib"]
    missing = [k for k in keys if f"hardware.{k}" not in n]
    if missing:
        return False, f"{toml_path} lacks hardware.{', hardware.'.join(missing)}"
    v = {k: n[f"hardware.{k}"] for k in keys + ["gemm_overhead_us", "reserved_gib", "bf16_attention_tflops"]
         if f"hardware.{k}" in n}
    # cuDNN's bf16 attention is measured where cuDNN attention runs (the file's comment says why not).
    cudnn = (f"bf16 attention (cuDNN) {v['bf16_attention_tflops']:.1f} TFLOP/s" if "bf16_attention_tflops" in v
             else "bf16 attention (cuDNN) not measured")
    bad = [k for k in keys if not v[k] > 0]
    line = (f"fp32 products {v['peak_tflops']:.1f} TFLOP/s, bf16 {v['bf16_tflops']:.1f} TFLOP/s, "
            f"{v.get('gemm_overhead_us', 0):.2f} us per product; fp32 attention {v['attention_tflops']:.1f} "
            f"TFLOP/s, {cudnn}; device copies {v['memory_gbps']:.0f} GB/s; pinned "
            f"host to device {v['host_to_device_gbps']:.1f} GB/s, device to host {v['device_to_host_gbps']:.1f} GB/s; "
            f"memory {v['memory_gib']:.2f} GiB ({v.get('reserved_gib', 0):.2f} not free)")
    if bad:
        return False, f"not positive: {', '.join(bad)}; {line}"
    return True, line


def plan(plan_path, speed_path, train_path):
    p = last_json(plan_path)
    predicted, planned = p["step_time_s"], p["memory_bytes"]["total"]
    measured = last_json(speed_path)["step_seconds"]
    peak = last_json(train_path)["memory_bytes"]["device_peak"]
    time_ok = predicted > 0 and measured > 0 and abs(predicted / measured - 1) <= 0.25
    memory_ok = peak > 0 and planned > 0 and abs(peak / planned - 1) <= 0.10
    terms = ", ".join(f"{k} {1e3 * v:.1f}" for k, v in sorted(p.get("time_s", {}).items()) if v > 0)
    return time_ok and memory_ok, (
        f"ndmesh plan on the calibrated file ({p.get('hardware', '?')}): step {1e3 * predicted:.1f} ms predicted "
        f"({terms} ms), {1e3 * measured:.1f} ms measured: predicted/measured {predicted / measured:.3f} "
        f"(bound: within 25%); device memory {planned / 2**30:.3f} GiB predicted, peak {peak / 2**30:.3f} GiB "
        f"measured: measured/predicted {peak / planned:.3f} (bound: within 10%)")


def main():
    commands = {"equal": (equal, 2), "resumed": (resumed, 2), "offload": (offload, 2), "bf16": (bf16, 4),
                "bf16-devices": (bf16_devices, 2), "speed": (speed, 4), "memory": (memory, 2), "torch": (torch, 2),
                "bf16-bench": (bf16_bench, 3), "calibration": (calibration, 1), "plan": (plan, 3)}
    if len(sys.argv) < 2 or sys.argv[1] not in commands or len(sys.argv) != 2 + commands[sys.argv[1]][1]:
        print(f"FAIL usage: gpu_check_compare.py {'|'.join(commands)} <files> (got {sys.argv[1:]})")
        return 1
    fn = commands[sys.argv[1]][0]
    try:
        ok, line = fn(*sys.argv[2:])
    except Exception as e:  # noqa: BLE001: whatever goes wrong is the step's FAIL line
        ok, line = False, f"{sys.argv[1]}: {type(e).__name__}: {e}"
    print(("PASS " if ok else "FAIL ") + line)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
