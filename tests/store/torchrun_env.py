#!/usr/bin/env python3
"""Starts the ranks of one node the way torchrun does, without PyTorch's launcher.

Debian's torchrun (PyTorch 1.13) does not start on this Python, so the tests launch with
this script instead. Each rank gets exactly the variables torchrun 2.x gives a worker:
RANK, LOCAL_RANK, GROUP_RANK, ROLE_RANK, ROLE_NAME, LOCAL_WORLD_SIZE, WORLD_SIZE,
GROUP_WORLD_SIZE, ROLE_WORLD_SIZE, MASTER_ADDR, MASTER_PORT, TORCHELASTIC_RESTART_COUNT,
TORCHELASTIC_MAX_RESTARTS, TORCHELASTIC_RUN_ID, TORCHELASTIC_USE_AGENT_STORE,
TORCH_NCCL_ASYNC_ERROR_HANDLING and OMP_NUM_THREADS=1. With --agent-store, node 0's launcher
serves a real PyTorch TCPStore at MASTER_ADDR:MASTER_PORT (torch.distributed.TCPStore, as
torchrun's agent does; needs Debian's python3-torch) and the ranks are its clients;
otherwise rank 0 serves the store. Like torchrun, when a rank exits non-zero the others
are terminated, and the exit status is the first failure's.

  torchrun_env.py [--agent-store] [--nnodes N --node-rank K] [--master-addr A]
                  [--master-port P] [--omit-rank R] [--set R:NAME=VALUE]... -np N prog args...

-np (or --nproc-per-node) is the number of ranks on this node, so the script also takes
the place of `mpirun ... -np N` in the shared test scripts. --omit-rank never starts rank
R (a rank that never arrives); --set changes one variable of one rank, and --keep-going
leaves the other ranks running when one fails, so that they must end by themselves
(fault tests).
"""
import argparse
import os
import signal
import socket
import subprocess
import sys
import time


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def agent_store(addr, port, world_size):
    # The agent's store, as torch.distributed.elastic serves it (is_master=True).
    import datetime

    try:
        import torch.distributed as dist
    except ImportError as e:
        sys.exit(f"torchrun_env.py: --agent-store needs PyTorch (Debian: apt-get install python3-torch): {e}")
    return dist.TCPStore(addr, port, world_size, True, datetime.timedelta(seconds=600), wait_for_workers=False)


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("-np", "--nproc-per-node", dest="nproc", type=int, required=True)
    p.add_argument("--nnodes", type=int, default=1)
    p.add_argument("--node-rank", type=int, default=0)
    p.add_argument("--master-addr", default="127.0.0.1")
    p.add_argument("--master-port", type=int, default=0, help="0: a free port (single node only)")
    p.add_argument("--agent-store", action="store_true")
    p.add_argument("--omit-rank", type=int, action="append", default=[])
    p.add_argument("--set", action="append", default=[], metavar="R:NAME=VALUE")
    p.add_argument("--keep-going", action="store_true",
                   help="do not end the other ranks when one fails (tests that peers end by themselves)")
    p.add_argument("prog", nargs=argparse.REMAINDER)
    a = p.parse_args()
    prog = a.prog[1:] if a.prog and a.prog[0] == "--" else a.prog
    if not prog:
        p.error("no program to start")
    if a.master_port == 0:
        if a.nnodes > 1:
            p.error("--master-port is needed with --nnodes > 1 (every node must use the same)")
        a.master_port = free_port()
    world = a.nproc * a.nnodes
    store = agent_store(a.master_addr, a.master_port, world) if a.agent_store and a.node_rank == 0 else None
    overrides = {}
    for s in a.set:
        rank, kv = s.split(":", 1)
        name, value = kv.split("=", 1)
        overrides.setdefault(int(rank), {})[name] = value

    procs = []
    for local in range(a.nproc):
        rank = a.node_rank * a.nproc + local
        if rank in a.omit_rank:
            continue
        env = dict(os.environ)
        env.update({
            "LOCAL_RANK": str(local), "RANK": str(rank), "GROUP_RANK": str(a.node_rank),
            "ROLE_RANK": str(rank), "ROLE_NAME": "default", "LOCAL_WORLD_SIZE": str(a.nproc),
            "WORLD_SIZE": str(world), "GROUP_WORLD_SIZE": str(a.nnodes), "ROLE_WORLD_SIZE": str(world),
            "MASTER_ADDR": a.master_addr, "MASTER_PORT": str(a.master_port),
            "TORCHELASTIC_RESTART_COUNT": "0", "TORCHELASTIC_MAX_RESTARTS": "0",
            "TORCHELASTIC_RUN_ID": "none", "TORCHELASTIC_USE_AGENT_STORE": str(a.agent_store),
            "TORCH_NCCL_ASYNC_ERROR_HANDLING": "1", "OMP_NUM_THREADS": env.get("OMP_NUM_THREADS", "1"),
        })
        env.update(overrides.get(rank, {}))
        procs.append(subprocess.Popen(prog, env=env))
    # When the ranks started (after the agent's store, whose PyTorch import can take seconds
    # under load), so that tests time the job from here.
    print(f"torchrun_env: ranks started at {time.time():.3f}", file=sys.stderr, flush=True)

    # Like torchrun's agent: the first rank to fail ends the others.
    status = 0
    try:
        while procs:
            for proc in list(procs):
                rc = proc.poll()
                if rc is None:
                    continue
                procs.remove(proc)
                if rc != 0 and status == 0:
                    status = rc if rc > 0 else 128 - rc
                    for other in [] if a.keep_going else procs:
                        other.send_signal(signal.SIGTERM)
            time.sleep(0.02)
    except KeyboardInterrupt:
        for proc in procs:
            proc.send_signal(signal.SIGTERM)
        status = 130
    del store
    return status


if __name__ == "__main__":
    sys.exit(main())
