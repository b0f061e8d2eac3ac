#!/usr/bin/env python3
"""A c10d TCPStore server of the generation whose every query opens with a magic number
(PyTorch 2.x before VALIDATE), emulated byte for byte from PyTorch's own sources, because
no installed PyTorch serves it (Debian's 1.13 is "v1", pip's 2.x answers VALIDATE + PING):

  - pytorch/pytorch commit 00321a02d719de5729aeac5871792398114a1570,
    torch/csrc/distributed/c10d/TCPStoreBackend.cpp, TCPStoreMasterDaemon::query(): the
    server reads a uint32 prefix; when it is not queryMagicNumber it logs "a miscellaneous
    query is detected" and returns (those 4 bytes are dropped, nothing is answered, the
    connection stays open); otherwise it reads the QueryType byte and runs its handler; an
    unknown type throws and the connection is closed. One thread serves every client, and
    each read is a blocking read of the whole field (recvBytes), so a client that sends part
    of a field stalls the server until it sends the rest or closes.
  - the same commit's TCPStore.cpp, SendBuffer: the client sends the 4 bytes of
    queryMagicNumber as the host stores them (little-endian here), the QueryType byte, then
    the arguments (strings and byte vectors as a uint64 length and the bytes, counts as
    uint64); it never sends VALIDATE.
  - QueryType without VALIDATE (kumpera/pytorch 7a034b03, TCPStoreBackend.hpp): SET=0,
    COMPARE_SET=1, GET=2, ADD=3, CHECK=4, WAIT=5, GETNUMKEYS=6, DELETE_KEY=7, APPEND=8,
    MULTI_GET=9, MULTI_SET=10, CANCEL_WAIT=11; CheckResponseType READY=0, NOT_READY=1;
    WaitResponseType STOP_WAITING=0, WAIT_CANCELED=1.
  - the value of queryMagicNumber is defined in that commit's TCPStoreBackend.hpp, which the
    sources at hand do not hold; the one-time VALIDATE of the next generation sends
    validationMagicNumber = 0x3C85F7CE, taken here as the same number (--magic changes it).

  query_magic_store.py [--port P] [--magic 0x...] [--silent]
Prints "port <P>" once listening. --silent: accepts and reads, never answers (a server of
no generation). Runs until it is ended (SIGTERM).
"""
import argparse
import select
import socket
import struct
import sys

SET, COMPARE_SET, GET, ADD, CHECK, WAIT, GETNUMKEYS, DELETE_KEY, APPEND, MULTI_GET, MULTI_SET, CANCEL_WAIT = range(12)


class Closed(Exception):
    pass


def recv_bytes(sock, n):
    # tcputil::recvBytes: a blocking read of exactly n bytes; a closed peer throws.
    out = b""
    while len(out) < n:
        chunk = sock.recv(n - len(out))
        if not chunk:
            raise Closed()
        out += chunk
    return out


def recv_value(sock, fmt):
    return struct.unpack("<" + fmt, recv_bytes(sock, struct.calcsize("<" + fmt)))[0]


def recv_string(sock):
    return recv_bytes(sock, recv_value(sock, "Q"))


def send_vector(sock, data):
    sock.sendall(struct.pack("<Q", len(data)) + data)


class Daemon:
    def __init__(self, magic, silent):
        self.magic, self.silent = magic, silent
        self.store = {}
        self.waiting = {}  # key -> [socket]
        self.awaited = {}  # socket -> keys still awaited
        self.misc = 0

    def wake(self, key):
        for s in self.waiting.pop(key, []):
            self.awaited[s] -= 1
            if self.awaited[s] == 0:
                del self.awaited[s]
                s.sendall(b"\x00")  # STOP_WAITING

    def clear(self, sock):
        for key in list(self.waiting):
            self.waiting[key] = [s for s in self.waiting[key] if s is not sock]
            if not self.waiting[key]:
                del self.waiting[key]
        self.awaited.pop(sock, None)

    def query(self, sock):
        if self.silent:
            recv_bytes(sock, 1)
            return
        prefix = recv_value(sock, "I")
        if prefix != self.magic:
            self.misc += 1  # "a miscellaneous query is detected": nothing answered
            return
        qt = recv_value(sock, "B")
        if qt == SET:
            key = recv_string(sock)
            self.store[key] = recv_string(sock)
            self.wake(key)
        elif qt == COMPARE_SET:
            key, current, new = recv_string(sock), recv_string(sock), recv_string(sock)
            if key not in self.store:
                if not current:
                    self.store[key] = new
                    send_vector(sock, new)
                else:
                    send_vector(sock, current)
            else:
                if self.store[key] == current:
                    self.store[key] = new
                send_vector(sock, self.store[key])
        elif qt == ADD:
            key = recv_string(sock)
            value = recv_value(sock, "q") + (int(self.store[key]) if key in self.store else 0)
            self.store[key] = str(value).encode()
            sock.sendall(struct.pack("<q", value))
            self.wake(key)
        elif qt == GET:
            send_vector(sock, self.store[recv_string(sock)])  # tcpStore_.at(): a missing key throws
        elif qt == CHECK:
            keys = [recv_string(sock) for _ in range(recv_value(sock, "Q"))]
            sock.sendall(b"\x00" if all(k in self.store for k in keys) else b"\x01")
        elif qt == WAIT:
            keys = [recv_string(sock) for _ in range(recv_value(sock, "Q"))]
            missing = [k for k in keys if k not in self.store]
            if not missing:
                sock.sendall(b"\x00")
            else:
                for k in missing:
                    self.waiting.setdefault(k, []).append(sock)
                self.awaited[sock] = len(missing)
        elif qt == GETNUMKEYS:
            sock.sendall(struct.pack("<q", len(self.store)))
        elif qt == DELETE_KEY:
            sock.sendall(struct.pack("<q", 1 if self.store.pop(recv_string(sock), None) is not None else 0))
        elif qt == APPEND:
            key = recv_string(sock)
            self.store[key] = self.store.get(key, b"") + recv_string(sock)
            self.wake(key)
        elif qt == MULTI_GET:
            n = recv_value(sock, "Q")
            for _ in range(n):
                send_vector(sock, self.store[recv_string(sock)])
        elif qt == MULTI_SET:
            for _ in range(recv_value(sock, "Q")):
                key = recv_string(sock)
                self.store[key] = recv_string(sock)
                self.wake(key)
        elif qt == CANCEL_WAIT:
            self.clear(sock)
            sock.sendall(b"\x01")  # WAIT_CANCELED
        else:
            raise Closed()  # TORCH_CHECK(false, "Unexpected query type")


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--port", type=int, default=0)
    p.add_argument("--magic", type=lambda v: int(v, 0), default=0x3C85F7CE)
    p.add_argument("--silent", action="store_true")
    a = p.parse_args()
    listener = socket.socket()
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listener.bind(("127.0.0.1", a.port))
    listener.listen(128)
    print(f"port {listener.getsockname()[1]}", flush=True)
    daemon = Daemon(a.magic, a.silent)
    clients = []
    while True:
        ready, _, _ = select.select([listener] + clients, [], [])
        for s in ready:
            if s is listener:
                c, _ = listener.accept()
                c.setblocking(True)
                clients.append(c)
            else:
                try:
                    daemon.query(s)
                except (Closed, KeyError, ValueError, OSError):
                    daemon.clear(s)
                    clients.remove(s)
                    s.close()


if __name__ == "__main__":
    sys.exit(main())
