#!/usr/bin/env python3
"""Writes the seed inputs of the vhost_msg fuzz target (see its input layout): a frontend's
whole opening sequence, split and packed, so the fuzzer starts from sessions that run rings;
and one under an IOMMU with runs of IOTLB messages.

    fuzz/seeds/vhost_msg.py fuzz/corpus/vhost_msg
"""
import struct
import sys
from pathlib import Path

VERSION, NEED_REPLY = 0x1, 0x8
NO_FD, EVENTFD = 0, 4
VERSION_1, RING_PACKED, PROTOCOL_FEATURES, EVENT_IDX = 1 << 32, 1 << 34, 1 << 30, 1 << 29
ACCESS_PLATFORM = 1 << 33
IOTLB_MSG, IOTLB_UPDATE, IOTLB_INVALIDATE = 22, 2, 3
MQ, REPLY_ACK, MEM_SLOTS = 1 << 0, 1 << 3, 1 << 15
UADDR, PAGES = 0x7000_0000_0000, 32


def memfd(pages):
    return 1 | (pages - 1) << 3


def msg(code, body=b"", flags=VERSION, fds=NO_FD):
    assert len(body) < 256
    return bytes([code, flags, fds, len(body)]) + body


def session(features, need_reply=0):
    f = VERSION | need_reply
    out = [msg(3), msg(1), msg(2, struct.pack("<Q", features), f), msg(15),
           msg(16, struct.pack("<Q", MQ | REPLY_ACK | MEM_SLOTS), f),
           msg(36),  # GET_MAX_MEM_SLOTS
           msg(5, struct.pack("<II4Q", 1, 0, 0, PAGES * 4096, UADDR, 0), f, memfd(PAGES))]
    for q in (0, 1):
        base = UADDR + q * 0x8000
        out += [msg(8, struct.pack("<II", q, 256), f), msg(10, struct.pack("<II", q, 0), f),
                msg(9, struct.pack("<II4Q", q, 0, base, base + 0x2000, base + 0x1000, 0), f),
                msg(13, struct.pack("<Q", q), f, EVENTFD), msg(12, struct.pack("<Q", q), f, EVENTFD),
                msg(18, struct.pack("<II", q, 1), f)]
    out += [msg(11, struct.pack("<II", 0, 0)),  # GET_VRING_BASE: stops ring 0
            msg(37, struct.pack("<Q4Q", 0, 0x100000, 4096, UADDR + 0x100000, 0), f, memfd(1)),
            msg(38, struct.pack("<Q4Q", 0, 0x100000, 4096, UADDR + 0x100000, 0), f),
            msg(34)]  # RESET_DEVICE
    return b"".join(out)


def iotlb(iova, size, uaddr, perm, kind, flags):
    return msg(IOTLB_MSG, struct.pack("<QQQBB6x", iova, size, uaddr, perm, kind), flags)


def iommu_session(need_reply):
    """Under an IOMMU (ACCESS_PLATFORM): the opening sequence with the rings granted first,
    then a pipelined run of grants and revocations (take_iotlb_run: one read, one publish,
    one write of acks), a revocation of everything (QEMU's flush: 0 + 0) and grants again."""
    f = VERSION | need_reply
    out = [msg(3), msg(1), msg(2, struct.pack("<Q", VERSION_1 | PROTOCOL_FEATURES | ACCESS_PLATFORM), f),
           msg(15), msg(16, struct.pack("<Q", MQ | REPLY_ACK), f),
           msg(5, struct.pack("<II4Q", 1, 0, 0, PAGES * 4096, UADDR, 0), f, memfd(PAGES)),
           iotlb(0x1_0000_0000, 0x10000, UADDR, 3, IOTLB_UPDATE, f)]
    for q in (0, 1):
        base = 0x1_0000_0000 + q * 0x8000
        out += [msg(8, struct.pack("<II", q, 256), f), msg(10, struct.pack("<II", q, 0), f),
                msg(9, struct.pack("<II4Q", q, 0, base, base + 0x2000, base + 0x1000, 0), f),
                msg(13, struct.pack("<Q", q), f, EVENTFD), msg(12, struct.pack("<Q", q), f, EVENTFD),
                msg(18, struct.pack("<II", q, 1), f)]
    for k in range(6):
        out.append(iotlb(0x2_0000_0000 + k * 4096, 4096, UADDR + 0x10000 + k * 4096, 1 + k % 3, IOTLB_UPDATE, f))
    out += [iotlb(0x2_0000_1000, 8192, 0, 0, IOTLB_INVALIDATE, f),
            iotlb(0, 0, 0, 0, IOTLB_INVALIDATE, f),
            iotlb(0x1_0000_0000, 0x10000, UADDR, 3, IOTLB_UPDATE, f),
            msg(11, struct.pack("<II", 0, 0))]
    return b"".join(out)


def main():
    out = Path(sys.argv[1])
    out.mkdir(parents=True, exist_ok=True)
    seeds = {
        "seed-split": bytes([0]) + session(VERSION_1 | PROTOCOL_FEATURES | EVENT_IDX),
        "seed-split-need-reply": bytes([1]) + session(VERSION_1 | PROTOCOL_FEATURES, NEED_REPLY),
        "seed-packed": bytes([0]) + session(VERSION_1 | PROTOCOL_FEATURES | RING_PACKED),
        "seed-legacy": bytes([0]) + session(0),
        "seed-iommu": bytes([0]) + iommu_session(0),
        "seed-iommu-need-reply": bytes([1]) + iommu_session(NEED_REPLY),
    }
    for name, data in seeds.items():
        (out / name).write_bytes(data)


if __name__ == "__main__":
    main()
