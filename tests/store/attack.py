#!/usr/bin/env python3
"""attack.py <pid>: attacks the TCP store of a running `ndmesh launch --store` job.

Finds the job's rank 0 among the descendants of <pid> (the launcher) (RANK=0 in its environment) and the
store's port (MASTER_PORT), then, on 127.0.0.1 only:
  1. sends the 22-byte frame VALIDATE + MULTI_SET with a count of 2^26 and expects the
     server to drop that connection within 5 s;
  2. opens a client that sets a 1 MiB value and asks for it again and again without ever
     reading the replies, and expects to be dropped within 20 s.
Meanwhile and until rank 0 exits it samples rank 0's resident memory, and prints one line
per attack and the peak ("peak_rss_mib N"). Exit 1 when an attack was not dropped."""
import os
import socket
import struct
import sys
import time

MAGIC = struct.pack("<BI", 0, 0x3C85F7CE)  # VALIDATE


def s(b):
    return struct.pack("<Q", len(b)) + b


def descendants(pid):
    parent = {}
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                with open(f"/proc/{name}/stat") as f:
                    parent[int(name)] = int(f.read().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                pass
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        kids = [c for c, pp in parent.items() if pp == p]
        out += kids
        todo += kids
    return out


def environ(pid):
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            items = f.read().split(b"\0")
    except OSError:
        return {}
    return dict(i.decode(errors="replace").split("=", 1) for i in items if b"=" in i)


def rss_mib(pid):
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    return 0.0


launcher = int(sys.argv[1])
deadline = time.time() + 30
rank0 = port = None
while rank0 is None and time.time() < deadline:
    for c in descendants(launcher):
        env = environ(c)
        if env.get("RANK") == "0" and "MASTER_PORT" in env:
            rank0, port = c, int(env["MASTER_PORT"])
    time.sleep(0.02)
if rank0 is None:
    sys.exit("FAIL: no rank 0 among the launcher's descendants within 30 s")
peak = 0.0


def sample():
    global peak
    peak = max(peak, rss_mib(rank0))


def connect():
    while time.time() < deadline:
        try:
            return socket.create_connection(("127.0.0.1", port), timeout=1)
        except OSError:
            sample()
            time.sleep(0.02)
    sys.exit(f"FAIL: the store at 127.0.0.1:{port} did not answer within 30 s")


def dropped_within(sock, seconds):
    sock.settimeout(0.05)
    until = time.time() + seconds
    while time.time() < until:
        sample()
        try:
            if sock.recv(65536) == b"":
                return True
        except socket.timeout:
            pass
        except OSError:
            return True
    return False


ok = True
start = time.time()
a = connect()
frame = MAGIC + struct.pack("<BQQ", 11, 1 << 26, 0)  # MULTI_SET, count 2^26, a first key's length
assert len(frame) == 22
a.sendall(frame)
if dropped_within(a, 5):
    print(f"22-byte MULTI_SET of 2^26 keys: dropped after {time.time() - start:.2f} s")
else:
    print("FAIL: the 22-byte MULTI_SET of 2^26 keys was not dropped within 5 s")
    ok = False
a.close()

b = connect()
b.sendall(MAGIC + b"\x01" + s(b"/attack/big") + s(b"x" * (1 << 20)))  # SET 1 MiB
b.setblocking(False)
get = b"\x03" + s(b"/attack/big")
gets, start, was_dropped = 0, time.time(), False
while time.time() - start < 20:
    sample()
    try:
        b.send(get)
        gets += 1
    except BlockingIOError:
        time.sleep(0.005)
    except OSError:
        was_dropped = True
        break
if was_dropped:
    print(f"a client that never reads: dropped after {gets} GETs of 1 MiB ({time.time() - start:.2f} s)")
else:
    print(f"FAIL: a client that never read {gets} replies of 1 MiB was not dropped within 20 s")
    ok = False
b.close()
while os.path.exists(f"/proc/{rank0}") and rss_mib(rank0) > 0:
    sample()
    time.sleep(0.01)
print(f"peak_rss_mib {peak:.0f}")
sys.exit(0 if ok else 1)
