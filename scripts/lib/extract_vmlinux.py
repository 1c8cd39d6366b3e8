#!/usr/bin/env python3
"""extract_vmlinux.py VMLINUZ OUT: the ELF vmlinux out of a bzImage with an xz payload
(Debian's kernel package), for the guests' PVH boot (scripts/peers/setup.sh)."""

import lzma
import sys


def extract(image):
    i = image.find(b"\xfd7zXZ\x00")
    if i < 0:
        raise ValueError("no xz payload")
    out = lzma.LZMADecompressor().decompress(image[i:])
    if out[:4] != b"\x7fELF":
        raise ValueError("payload is not an ELF")
    return out


def main(argv):
    with open(argv[0], "rb") as f:
        image = f.read()
    try:
        out = extract(image)
    except ValueError as e:
        sys.exit("%s in %s" % (e, argv[0]) if "xz" in str(e) else str(e))
    with open(argv[1], "wb") as f:
        f.write(out)


if __name__ == "__main__":
    main(sys.argv[1:])
