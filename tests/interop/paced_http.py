#!/usr/bin/env python3
"""paced_http.py FILE PORT BYTES_PER_SEC: serves FILE once over HTTP/1.0 at that rate on
10.77.0.1, holding back while FILE.hold exists (tests/interop/run.sh guest_migrate)."""

import os
import socket
import sys
import time


def main(argv):
    path, port, rate = argv[0], int(argv[1]), float(argv[2])
    with open(path, "rb") as f:
        data = f.read()
    lsock = socket.socket()
    lsock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    lsock.bind(("10.77.0.1", port))
    lsock.listen(1)
    lsock.settimeout(140)
    c, _ = lsock.accept()
    c.recv(4096)
    c.sendall(b"HTTP/1.0 200 OK\r\nContent-Length: %d\r\n\r\n" % len(data))
    t0, step = time.time(), 32768
    hold = path + ".hold"  # while this file exists, nothing is sent
    sent = 0
    for off in range(0, len(data), step):
        while os.path.exists(hold):
            time.sleep(0.01)
            t0 = time.time() - sent / rate
        c.sendall(data[off : off + step])
        sent += step
        ahead = t0 + sent / rate - time.time()
        if ahead > 0:
            time.sleep(ahead)
    c.close()


if __name__ == "__main__":
    main(sys.argv[1:])
