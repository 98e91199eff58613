"""store_flood.py PORT - attacks on a TCP store server whose key is known
(store_probe --mode serve), bounded in count and time, on loopback only.
Prints one "name: ok|FAIL detail" line per check.

  flood     400 connections that never say hello: the server keeps at
            most 64 of them (each new one closes the oldest of its
            address), and a well-behaved client is served at once while
            they are open
  quota     an authenticated client: values within the quota are stored,
            the one that would pass it is refused with a reason, and a
            4 GiB announced value is refused before anything is allocated
  inflight MB
            10 authenticated clients each announce a value just under the
            quota (MB) and send half of it, then the rest: the table holds
            four quotas, values still arriving included, so 4 are stored
            and 6 refused on their header (an ERR, then closed)
  evict     a client that has begun its hello outlives 400 silent
            connections from its own address, and a silent client outlives
            200 silent ones, and 300 that stall in their hello, from another
            address (per-source caps): each then logs in
  storm SECONDS STOPFILE
            opens connections that never send anything as fast as one
            process can (non-blocking connects, at most 2,000 open, the
            oldest closed first) for at most SECONDS or until STOPFILE
            exists, at most 1,000,000 in all; prints the rate. From
            $FLOOD_SOURCE (a 127/8 address) when set
"""
import os
import socket
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from store_wire import (HELLO, R_ERR, R_OK, SET, client, handshake, hdr, probe_key,  # noqa: E402
                        put, recv_reply)


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
          % ("ok" if ok and closed >= 400 - 64 and dt < 5 else "FAIL", closed, dt))


def idle_conns(port, n, source, first=b""):
    """n connections from source that send first (nothing by default) and
    then stall; the list."""
    out = []
    for _ in range(n):
        c = socket.socket()
        c.bind((source, 0))
        c.connect(("127.0.0.1", port))
        if first:
            c.sendall(first)
        out.append(c)
    return out


def count_closed(conns):
    closed = 0
    for c in conns:
        c.setblocking(False)
        try:
            closed += c.recv(1) == b""
        except BlockingIOError:
            pass
        except OSError:
            closed += 1
        c.close()
    return closed


def evict(port):
    held = []

    def flood(n, source, first=b""):
        held.extend(idle_conns(port, n, source, first))
        time.sleep(0.1)  # the server accepts them (at thousands a second)

    a = socket.create_connection(("127.0.0.1", port), timeout=5)
    ok, why = handshake(a, probe_key(), between=lambda: flood(400, "127.0.0.1"))
    a.close()
    closed = count_closed(held)
    print("begun hello: %s (logged in after 400 silent connections from its own address, "
          "%d of them closed: %s)" % ("ok" if ok else "FAIL", closed, why))
    held = []
    a = socket.create_connection(("127.0.0.1", port), timeout=5)
    flood(200, "127.0.0.2")
    ok, why = handshake(a, probe_key())
    a.close()
    closed = count_closed(held)
    print("other source: %s (a silent client logged in after 200 silent connections from "
          "127.0.0.2, %d of them closed: %s)" % ("ok" if ok else "FAIL", closed, why))
    held = []
    a = socket.create_connection(("127.0.0.1", port), timeout=5)
    flood(300, "127.0.0.2", hdr(HELLO, 0, 4, 16)[:4])
    ok, why = handshake(a, probe_key())
    a.close()
    closed = count_closed(held)
    print("stalled hellos: %s (a silent client logged in after 300 connections from "
          "127.0.0.2 that sent 4 bytes of a hello and stalled, %d of them closed: %s)"
          % ("ok" if ok else "FAIL", closed, why))


def storm(port, seconds, stopfile):
    import errno
    t0 = time.time()
    opened = failed = 0
    ring = []
    source = os.environ.get("FLOOD_SOURCE", "")
    if source and not source.startswith("127."):
        sys.exit("storm: the source must be a loopback address")
    end = t0 + min(seconds, 60)
    while opened < 1000000:
        if opened % 512 == 0 and (time.time() >= end or os.path.exists(stopfile)):
            break
        c = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        if source:
            c.bind((source, 0))
        c.setblocking(False)
        e = c.connect_ex(("127.0.0.1", port))
        if e not in (0, errno.EINPROGRESS):
            failed += 1
        opened += 1
        if opened == 2000:
            print("storming", flush=True)
        ring.append(c)
        if len(ring) > 2000:
            ring.pop(0).close()
    dt = time.time() - t0
    for c in ring:
        c.close()
    print("storm: %d connections in %.1f s (%.0f a second), %d refused at once"
          % (opened, dt, opened / dt, failed), flush=True)


def inflight(port, mb):
    size = (mb << 20) - 64
    conns = [client(port) for _ in range(10)]
    for i, s in enumerate(conns):
        try:
            s.sendall(hdr(SET, 0, 2, size) + b"v%d" % i + b"x" * (size // 2))
        except OSError:
            pass  # refused and closed already
    time.sleep(0.2)
    stored = refused = 0
    for s in conns:
        try:
            s.sendall(b"x" * (size - size // 2))
        except OSError:
            pass
        t, _, body = recv_reply(s)
        stored += t == R_OK
        refused += t != R_OK  # an ERR, or the reset that follows it
        s.close()
    print("inflight: %s (%d of 10 values of %d bytes stored, %d refused; the table holds %d)"
          % ("ok" if stored == 4 and refused == 6 else "FAIL", stored, size, refused,
             4 * (mb << 20)))


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
    elif what == "inflight":
        inflight(port, int(sys.argv[3]))
    elif what == "evict":
        evict(port)
    elif what == "storm":
        storm(port, float(sys.argv[3]), sys.argv[4])
    else:
        quota(port, int(sys.argv[3]))
