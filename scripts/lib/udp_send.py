#!/usr/bin/env python3
"""udp_send.py ADDR PAYLOAD COUNT: COUNT UDP datagrams of PAYLOAD bytes to ADDR:9 with
sendmmsg, 64 per call; prints how many went (scripts/bench_tap_rx.sh's sender)."""

import ctypes
import socket
import sys


class iovec(ctypes.Structure):
    _fields_ = [("base", ctypes.c_void_p), ("len", ctypes.c_size_t)]


class msghdr(ctypes.Structure):
    _fields_ = [
        ("name", ctypes.c_void_p), ("namelen", ctypes.c_uint32), ("iov", ctypes.POINTER(iovec)),
        ("iovlen", ctypes.c_size_t), ("control", ctypes.c_void_p), ("controllen", ctypes.c_size_t),
        ("flags", ctypes.c_int),
    ]  # fmt: skip


class mmsghdr(ctypes.Structure):
    _fields_ = [("hdr", msghdr), ("len", ctypes.c_uint)]


def main(argv):
    addr, payload, count = argv[0], int(argv[1]), int(argv[2])
    libc = ctypes.CDLL(None, use_errno=True)
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 1 << 22)
    s.connect((addr, 9))
    buf = ctypes.create_string_buffer(b"\x5a" * payload, payload)
    iov = iovec(ctypes.cast(buf, ctypes.c_void_p), payload)
    n = 64
    msgs = (mmsghdr * n)()
    for m in msgs:
        m.hdr.iov = ctypes.pointer(iov)
        m.hdr.iovlen = 1
    sent = 0
    while sent < count:
        r = libc.sendmmsg(s.fileno(), msgs, min(n, count - sent), 0)
        if r > 0:
            sent += r
    print(sent)


if __name__ == "__main__":
    main(sys.argv[1:])
