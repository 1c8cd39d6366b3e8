#!/usr/bin/env python3
"""A traffic source with no socket buffer: XDP frames made in the kernel and redirected into a
veth, the way an XDP program forwards from a NIC (scripts/bench_afxdp.sh SRC=xdp-live).

    xdp_live.py IFNAME SECONDS FRAME_LEN [PPS]
        loads a four-instruction XDP program, `return bpf_redirect(IFINDEX, 0)`, and runs it
        with BPF_PROG_TEST_RUN in live-frames mode (BPF_F_TEST_XDP_LIVE_FRAMES, Linux 5.18+):
        the kernel makes each frame in a page pool and sends it through the interface's
        ndo_xdp_xmit, as XDP_REDIRECT from a driver does. On a veth the frame lands in the
        peer's receive ring as an XDP frame (the peer needs its NAPI: an XDP program, or GRO
        on) and the peer's XDP program, or the stack, takes it from there. Prints one line,
        `XDPLIVE frames=N secs=S`: the frames the program ran on (each one redirected).
        With PPS, paced to that many frames a second (runs of 256, each when it is due):
        a source that leaves a receiver sharing its CPU room to run.

The frame: broadcast destination, source 02:00:00:00:00:09, EtherType 0x88b5 (local
experimental), zero payload, FRAME_LEN bytes (no FCS). Runs on the calling CPU (pin it with
taskset) in batches of 64 until SECONDS have passed.
"""

import ctypes
import os
import socket
import struct
import sys
import time

SYS_BPF = 321  # x86_64
BPF_PROG_LOAD = 5
BPF_PROG_TEST_RUN = 10
BPF_PROG_TYPE_XDP = 6
BPF_F_TEST_XDP_LIVE_FRAMES = 1 << 1
BPF_FUNC_REDIRECT = 23

libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long


def bpf(cmd, attr):
    buf = ctypes.create_string_buffer(attr, 160)
    r = libc.syscall(SYS_BPF, cmd, buf, ctypes.c_uint(160))
    if r < 0:
        e = ctypes.get_errno()
        raise OSError(e, "bpf(%d): %s" % (cmd, os.strerror(e)))
    return r


def insn(code, dst=0, src=0, off=0, imm=0):
    return struct.pack("<BBhi", code, (src << 4) | dst, off, imm)


def program(ifindex):
    """r1 = ifindex; r2 = 0; call bpf_redirect; exit (r0: XDP_REDIRECT, or XDP_ABORTED)."""
    return (
        insn(0xB7, dst=1, imm=ifindex)  # BPF_ALU64 | BPF_MOV | BPF_K
        + insn(0xB7, dst=2, imm=0)
        + insn(0x85, imm=BPF_FUNC_REDIRECT)  # BPF_JMP | BPF_CALL
        + insn(0x95)  # BPF_JMP | BPF_EXIT
    )


def load(ifindex):
    code = program(ifindex)
    insns = ctypes.create_string_buffer(code, len(code))
    lic = ctypes.create_string_buffer(b"GPL")
    log = ctypes.create_string_buffer(4096)
    attr = struct.pack(
        "<IIQQIIQII16s",
        BPF_PROG_TYPE_XDP,
        len(code) // 8,
        ctypes.addressof(insns),
        ctypes.addressof(lic),
        1,
        len(log),
        ctypes.addressof(log),
        0,
        0,
        b"pvnet_xdplive",
    )
    try:
        return bpf(BPF_PROG_LOAD, attr)
    except OSError as e:
        sys.exit("xdp_live: loading the program: %s\n%s" % (e, log.value.decode(errors="replace")))


def frame(n):
    head = b"\xff" * 6 + bytes([2, 0, 0, 0, 0, 9]) + b"\x88\xb5"
    return head + bytes(max(n - len(head), 0))


def run(prog, data, repeat):
    buf = ctypes.create_string_buffer(data, len(data))
    # prog_fd, retval, data_size_in, data_size_out, data_in, data_out, repeat, duration,
    # ctx_size_in, ctx_size_out, ctx_in, ctx_out, flags, cpu, batch_size
    attr = struct.pack(
        "<IIIIQQIIIIQQIII",
        prog,
        0,
        len(data),
        0,
        ctypes.addressof(buf),
        0,
        repeat,
        0,
        0,
        0,
        0,
        0,
        BPF_F_TEST_XDP_LIVE_FRAMES,
        0,
        64,
    )
    bpf(BPF_PROG_TEST_RUN, attr)


def main(argv):
    if len(argv) not in (4, 5):
        sys.exit(__doc__)
    ifname, secs, flen = argv[1], float(argv[2]), int(argv[3])
    pps = float(argv[4]) if len(argv) == 5 else 0.0
    prog = load(socket.if_nametoindex(ifname))
    data = frame(flen)
    repeat = 256 if pps > 0 else 1 << 16
    frames = 0
    t0 = time.monotonic()
    try:
        while time.monotonic() - t0 < secs:
            if pps > 0:
                wait = t0 + frames / pps - time.monotonic()
                if wait > 0:
                    time.sleep(wait)
            run(prog, data, repeat)
            frames += repeat
    except (InterruptedError, KeyboardInterrupt):
        pass
    print("XDPLIVE frames=%d secs=%.3f" % (frames, time.monotonic() - t0), flush=True)


if __name__ == "__main__":
    main(sys.argv)
