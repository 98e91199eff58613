"""store_flood.py PORT - attacks on a TCP store server whose key is known
(store_probe --mode serve), bounded in count and time, on loopback only.
Prints one "name: ok|FAIL detail" line per check.

  flood     400 connections that never say hello: the server keeps at
            most 128 of them (each new one closes the oldest), and a
            well-behaved client is served at once while they are open
  quota     an authenticated client: values within the quota are stored,
            the one that would pass it is refused with a reason, and a
            4 GiB announced value is refused before anything is allocated
"""
import os
import socket
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from store_wire import R_ERR, R_OK, SET, client, hdr, put, recv_reply  # noqa: E402


def flood(port):
    idle = []
    closed = 0
    for _ in range(400):
        try:
            c = socket.create_connection(("127.0.0.1", port), timeout=5)
            idle.append(c)
        except OSError:
            closed += 1
    time.sleep(0.5)
    for c in idle:
        c.setblocking(False)
        try:
            if c.recv(1) == b"":
                closed += 1
        except BlockingIOError:
            pass
        except OSError:
            closed += 1
    t0 = time.time()
    s = client(port)
    ok = s is not None
    if ok:
        t, _, _ = put(s, b"k", b"v")
        ok = t == R_OK
        s.close()
    dt = time.time() - t0
    for c in idle:
        c.close()
    print("flood: %s (%d of 400 idle connections closed by the server, a client served in %.2f s)"
          % ("ok" if ok and closed >= 400 - 128 and dt < 5 else "FAIL", closed, dt))


def quota(port, mb):
    s = client(port)
    if not s:
        print("quota: FAIL (hello refused)")
        return
    half = b"x" * (mb << 19)
    r1 = put(s, b"a", half)[0]
    r2 = put(s, b"b", half)[0]
    t, _, body = put(s, b"c", b"y")
    within = r1 == R_OK and r2 == R_OK
    refused = t == R_ERR and b"quota" in body
    print("quota: %s (two values of %d bytes stored, the next refused: %s)"
          % ("ok" if within and refused else "FAIL", len(half), body.decode(errors="replace")))
    s.close()
    s = client(port)
    s.sendall(hdr(SET, 0, 1, (4 << 30) - 1) + b"z")
    t, _, body = recv_reply(s)
    print("announced: %s (a 4 GiB value announced: %s)"
          % ("ok" if t == R_ERR and b"quota" in body else "FAIL", body.decode(errors="replace")))
    s.close()


if __name__ == "__main__":
    port = int(sys.argv[1])
    what = sys.argv[2]
    if what == "flood":
        flood(port)
    else:
        quota(port, int(sys.argv[3]))
