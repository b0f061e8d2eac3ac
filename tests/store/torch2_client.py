#!/usr/bin/env python3
"""torch2_client.py: a PyTorch 2.x TCPStore client against ndmesh's store.

Run as rank 1 of an `ndmesh launch --store -n 2` job before rank 1's ndmesh starts: rank 0
(ndmesh) serves the store at MASTER_ADDR:MASTER_PORT and waits there for rank 1. Uses every
command of the 2.x client that ndmesh serves and checks the answers; reads the WORLD_SIZE
rank 0 published under the job's keys."""
import datetime
import os
import sys

import torch
import torch.distributed as dist

c = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), None, False,
                  datetime.timedelta(seconds=30))
job = f"ndmesh/{os.environ.get('TORCHELASTIC_RUN_ID', 'none')}/attempt_0/"
c.wait([job + "world_size"])
assert c.get(job + "world_size") == os.environ["WORLD_SIZE"].encode(), c.get(job + "world_size")
c.set("torch2/a", b"one")
assert c.get("torch2/a") == b"one"
assert c.add("torch2/n", 40) == 40 and c.add("torch2/n", 2) == 42
assert c.compare_set("torch2/a", b"one", b"two") == b"two"
assert c.compare_set("torch2/a", b"one", b"three") == b"two"
assert c.check(["torch2/a", "torch2/n"]) and not c.check(["torch2/missing"])
c.append("torch2/a", b"+")
c.multi_set(["torch2/x", "torch2/y"], [b"x", b"y"])
assert c.multi_get(["torch2/a", "torch2/x", "torch2/y"]) == [b"two+", b"x", b"y"]
assert c.delete_key("torch2/x") and not c.delete_key("torch2/x")
keys = c.num_keys()
assert keys >= 5, keys
try:
    c.wait(["torch2/never"], datetime.timedelta(milliseconds=200))
    sys.exit("FAIL: a wait for a key never set returned")
except Exception:  # torch raises DistStoreError (a timeout) here
    pass
c.set("torch2/after_timeout", b"ok")
assert c.get("torch2/after_timeout") == b"ok"
print(f"torch {torch.__version__} client against ndmesh's store: set get add compare_set check append "
      f"multi_set multi_get delete_key num_keys wait ok", flush=True)
