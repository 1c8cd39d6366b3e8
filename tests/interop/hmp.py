#!/usr/bin/env python3
"""hmp.py SOCKET COMMAND: one QEMU human monitor command over its unix socket; prints the
answer (tests/interop/run.sh guest_migrate)."""

import socket
import sys


def answer(s):
    b = b""
    try:
        while not b.endswith(b"(qemu) "):
            c = s.recv(4096)
            if not c:
                break
            b += c
    except TimeoutError:
        pass
    return b.decode(errors="replace")


def main(argv):
    s = socket.socket(socket.AF_UNIX)
    s.connect(argv[0])
    s.settimeout(5)
    answer(s)
    s.sendall(argv[1].encode() + b"\n")
    print(answer(s).replace("\r", ""))


if __name__ == "__main__":
    main(sys.argv[1:])
