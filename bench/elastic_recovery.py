#!/usr/bin/env python3
"""Elastic data parallelism under faults (docs/elastic.md): a coordinator and R replicas of
2 ranks (tp 2) under mpirun, first without faults for --seconds (the baseline, measured in
the same run), then for as long again with one rank SIGKILLed every --fault-every seconds
(replicas in turn); the killed replica is restarted at once, as a supervisor would.

Prints: committed steps per second of both runs and their ratio (throughput kept), and for
every kill the time to the next committed step (of any replica) and to the first step
computed by all R replicas again (the restarted one healed and rejoined).

  bench/elastic_recovery.py --ndmesh build/bin/ndmesh [--seconds 180] [--fault-every 20]
"""
import argparse
import json
import os
import signal
import subprocess
import sys
import threading
import time


def children(pid):
    try:
        out = subprocess.run(["pgrep", "-P", str(pid)], capture_output=True, text=True).stdout
    except FileNotFoundError:
        return []
    return [int(x) for x in out.split()]


class Run:
    def __init__(self, args, log_dir, name):
        self.args, self.log_dir, self.name = args, log_dir, name
        self.steps = []  # (time, step, replicas)
        self.lock = threading.Lock()
        self.procs = {}
        coord_log = open(os.path.join(log_dir, f"{name}-coordinator.err"), "w")
        self.coord = subprocess.Popen(
            [args.ndmesh, "coordinator", "--port", "0", "--min-replicas", str(max(1, args.replicas - 1)),
             "--heartbeat-timeout-s", str(args.heartbeat_timeout)],
            stdout=subprocess.PIPE, stderr=coord_log, text=True, start_new_session=True)
        line = self.coord.stdout.readline()
        if not line.startswith("coordinator listening on "):
            sys.exit(f"the coordinator printed {line!r}")
        self.addr = line.split()[-1]
        for r in range(args.replicas):
            self.start(r)

    def start(self, r):
        env = dict(os.environ, NDMESH_COORDINATOR=self.addr, NDMESH_REPLICA_ID=str(r), NDMESH_LOG="warn")
        flags = ["--steps", "1000000", "--batch", str(self.args.batch), "--micro-batch", "1", "--layers", "2",
                 "--hidden", str(self.args.hidden), "--heads", "4", "--seq", "64", "--threads", "1",
                 "--eval-batches", "0", "--json"]
        err = open(os.path.join(self.log_dir, f"{self.name}-r{r}.err"), "a")
        p = subprocess.Popen(self.args.mpirun.split() + ["-np", "2", self.args.ndmesh, "train", "--tp", "2"] + flags,
                             env=env, stdout=subprocess.PIPE, stderr=err, text=True, start_new_session=True)
        self.procs[r] = p
        threading.Thread(target=self.read, args=(p,), daemon=True).start()

    def read(self, p):
        for line in p.stdout:
            if line.startswith('{"elastic_step"'):
                x = json.loads(line)
                with self.lock:
                    self.steps.append((time.monotonic(), x["elastic_step"], x["replicas"]))

    def committed(self):
        with self.lock:
            return max((s for _, s, _ in self.steps), default=0)

    def restart_dead(self):
        for r, p in list(self.procs.items()):
            if p.poll() is not None:
                self.start(r)

    def kill_rank(self, r):
        ranks = [c for c in children(self.procs[r].pid)]
        if not ranks:
            return False
        os.kill(ranks[-1], signal.SIGKILL)
        return True

    def stop(self):
        for p in list(self.procs.values()) + [self.coord]:
            try:
                os.killpg(p.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            p.wait()


def measure(args, log_dir, name, faults):
    run = Run(args, log_dir, name)
    try:
        deadline = time.monotonic() + 120
        while run.committed() < 3:  # warmed up: every replica joined and a few steps done
            if time.monotonic() > deadline:
                sys.exit(f"{name}: no steps within 120 s (logs in {log_dir})")
            time.sleep(0.05)
        t0, s0 = time.monotonic(), run.committed()
        kills, k = [], 0
        next_fault = t0 + args.fault_every
        while time.monotonic() < t0 + args.seconds:
            run.restart_dead()
            if faults and time.monotonic() >= next_fault:
                victim = k % args.replicas
                if run.kill_rank(victim):
                    kills.append(time.monotonic())
                    k += 1
                next_fault += args.fault_every
            time.sleep(0.02)
        t1, s1 = time.monotonic(), run.committed()
        with run.lock:
            steps = list(run.steps)
    finally:
        run.stop()
    recover, rejoin = [], []
    for tk in kills:
        after = [t for t, _, _ in steps if t > tk]
        if after:
            recover.append(min(after) - tk)
        full = [t for t, _, n in steps if t > tk + 0.5 and n == args.replicas]
        if full:
            rejoin.append(min(full) - tk)
    return (s1 - s0) / (t1 - t0), recover, rejoin, len(kills)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ndmesh", required=True)
    ap.add_argument("--mpirun", default="mpirun --allow-run-as-root --oversubscribe")
    ap.add_argument("--replicas", type=int, default=3)
    ap.add_argument("--seconds", type=float, default=180)
    ap.add_argument("--fault-every", type=float, default=20)
    ap.add_argument("--heartbeat-timeout", type=float, default=2)
    ap.add_argument("--batch", type=int, default=12)
    ap.add_argument("--hidden", type=int, default=128)
    ap.add_argument("--logs", default="")
    args = ap.parse_args()
    log_dir = args.logs or subprocess.run(["mktemp", "-d"], capture_output=True, text=True).stdout.strip()
    base, _, _, _ = measure(args, log_dir, "baseline", faults=False)
    rate, recover, rejoin, kills = measure(args, log_dir, "faults", faults=True)
    med = lambda xs: sorted(xs)[len(xs) // 2] if xs else float("nan")
    print(f"replicas {args.replicas} x tp 2, {args.seconds:g} s each, a SIGKILL every {args.fault_every:g} s")
    print(f"fault-free: {base:.2f} committed steps/s")
    print(f"with faults: {rate:.2f} committed steps/s over {kills} kills: {rate / base:.3f} of the fault-free rate")
    print(f"kill -> next committed step: median {med(recover):.2f} s, max {max(recover, default=float('nan')):.2f} s "
          f"({len(recover)} kills)")
    print(f"kill -> all {args.replicas} replicas computing again (restart, rejoin, heal): median {med(rejoin):.2f} s, "
          f"max {max(rejoin, default=float('nan')):.2f} s")
    print(json.dumps({"fault_free_steps_per_s": base, "faults_steps_per_s": rate, "ratio": rate / base,
                      "kills": kills, "kill_to_commit_s": recover, "kill_to_all_replicas_s": rejoin}))


if __name__ == "__main__":
    main()
