#!/usr/bin/env python3
"""Elastic data parallelism under faults, against the fault-free run measured just before.

Runs `ndmesh launch --elastic --replicas R -n N -- ndmesh train --tp N --json ...` twice for
the same wall time (the launcher's coordinator and replicas; each replica's lead prints one
JSON line per committed step, `{"elastic_step": S, ...}`):
  1. fault-free;
  2. with a fault every --every seconds: SIGKILL to one rank of one replica (round-robin
     over the replicas and their ranks); the launcher restarts the replica, which rejoins.
Reports the committed steps per second of each run and their ratio (the throughput kept),
and, for every kill, the time from the kill to the next committed step (any replica) and
to the killed replica's first committed step after its restart (its rejoin).

  bench/bench_elastic.py [--ndmesh build/bin/ndmesh] [--seconds 180] [--every 20]
                         [--replicas 3] [--ranks 2] [-- extra train flags]
"""
import argparse
import os
import re
import signal
import statistics
import subprocess
import sys
import threading
import time

TAG = re.compile(r"^\[r(\d+)\.(\d+)\] (.*)$")


def rank_pids(marker, replica, rank):
    """The pids of the ranks of `replica` with RANK=`rank` (their environment), of this run."""
    pids = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                cmd = f.read().split(b"\0")
            if b"train" not in cmd or marker.encode() not in cmd:
                continue
            with open(f"/proc/{entry}/environ", "rb") as f:
                env = dict(kv.split(b"=", 1) for kv in f.read().split(b"\0") if b"=" in kv)
        except OSError:
            continue
        if env.get(b"NDMESH_REPLICA_ID") == str(replica).encode() and env.get(b"RANK") == str(rank).encode():
            pids.append(int(entry))
    return pids


def run(args, faults):
    """Runs the job for args.seconds of committed steps; returns (commits, kills, status line)."""
    marker = str(9000 + (1 if faults else 0) + 2 * (os.getpid() % 1000))
    train = [args.ndmesh, "train", "--tp", str(args.ranks), "--steps", "100000000", "--seed", marker, "--json",
             "--eval-batches", "0"] + args.train
    cmd = [args.ndmesh, "launch", "--elastic", "--replicas", str(args.replicas), "--max-restarts", "1000",
           "-n", str(args.ranks), "--"] + train
    job = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, bufsize=1)
    commits = []  # (time, replica, step)
    lines = []
    first = threading.Event()

    def reader():
        for line in job.stdout:
            now = time.monotonic()
            lines.append(line.rstrip("\n"))
            m = TAG.match(line.rstrip("\n"))
            if not m or '"elastic_step"' not in m.group(3):
                continue
            step = int(re.search(r'"elastic_step":\s*(\d+)', m.group(3)).group(1))
            commits.append((now, int(m.group(1)), step))
            first.set()

    t = threading.Thread(target=reader, daemon=True)
    t.start()
    if not first.wait(timeout=300):
        job.kill()
        sys.exit("no committed step within 300 s:\n" + "\n".join(lines[-20:]))
    start = time.monotonic()
    kills = []  # (time, replica)
    k = 0
    while time.monotonic() - start < args.seconds:
        if job.poll() is not None:
            sys.exit(f"the job ended (status {job.returncode}):\n" + "\n".join(lines[-20:]))
        if faults and time.monotonic() - start >= args.every * (len(kills) + 1):
            replica, rank = k % args.replicas, (k // args.replicas) % args.ranks
            k += 1
            pids = rank_pids(marker, replica, rank)
            if pids:
                os.kill(pids[0], signal.SIGKILL)
                kills.append((time.monotonic(), replica))
        time.sleep(0.05)
    end = time.monotonic()
    job.send_signal(signal.SIGTERM)
    try:
        job.wait(timeout=30)
    except subprocess.TimeoutExpired:
        job.kill()
        job.wait()
    t.join(timeout=5)
    window = sorted({step for (when, _, step) in commits if start <= when <= end})
    return commits, kills, window, start, end


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--ndmesh", default=os.path.join(os.path.dirname(__file__), "..", "build", "bin", "ndmesh"))
    p.add_argument("--seconds", type=float, default=180)
    p.add_argument("--every", type=float, default=20)
    p.add_argument("--replicas", type=int, default=3)
    p.add_argument("--ranks", type=int, default=2)
    p.add_argument("train", nargs="*",
                   default=["--layers", "2", "--hidden", "64", "--heads", "4", "--kv-heads", "2", "--seq", "32",
                            "--markov-vocab", "32", "--threads", "1", "--batch", "12"])
    args = p.parse_args()
    print(f"-- {args.replicas} replicas x tp {args.ranks}, {args.seconds:g} s each run, "
          f"train {' '.join(args.train)}", flush=True)
    _, _, free, s0, e0 = run(args, faults=False)
    free_rate = len(free) / (e0 - s0)
    print(f"  fault-free: {len(free)} committed steps in {e0 - s0:.1f} s: {free_rate:.3f} steps/s", flush=True)
    commits, kills, faulty, s1, e1 = run(args, faults=True)
    rate = len(faulty) / (e1 - s1)
    print(f"  a SIGKILL every {args.every:g} s: {len(kills)} kills, {len(faulty)} committed steps in "
          f"{e1 - s1:.1f} s: {rate:.3f} steps/s", flush=True)
    print(f"  throughput kept: {rate / free_rate:.3f} of the fault-free run", flush=True)
    to_next, to_rejoin = [], []
    for when, replica in kills:
        nxt = [c for c in commits if c[0] > when]
        if nxt:
            to_next.append(nxt[0][0] - when)
        back = [c for c in commits if c[0] > when and c[1] == replica]
        if back:
            to_rejoin.append(back[0][0] - when)
    if to_next:
        print(f"  kill -> next committed step (any replica): median {statistics.median(to_next):.2f} s, "
              f"max {max(to_next):.2f} s over {len(to_next)} kills (fault-free step: {1 / free_rate:.2f} s)")
    if to_rejoin:
        print(f"  kill -> the killed replica's next committed step (restart, rejoin, heal): median "
              f"{statistics.median(to_rejoin):.2f} s, max {max(to_rejoin):.2f} s")


if __name__ == "__main__":
    main()
