"""store_wire.py - the TCP store's wire protocol (src/rendezvous/store_tcp.h)
and handshake (src/rendezvous/auth.h) in Python, for tests that play a
client or a server the real code would never be: an outsider without the
secret, a client that sends a wrong MAC, a server that cannot prove the key.
Written from the protocol description, so the tests also check that the C
code speaks standard HMAC-SHA256.
"""
import hashlib
import hmac
import os
import socket
import struct

MAGIC, VERSION = 0x53445346, 2
HELLO, SET, GET, ADD, WAIT, CHECK, AUTH = 1, 2, 3, 4, 5, 6, 7
R_OK, R_VALUE, R_TIMEOUT, R_ERR, R_CHALLENGE = 64, 65, 66, 67, 68
LABEL_SERVER, LABEL_CLIENT = b"fsdpc store server", b"fsdpc store client"
PROBE_SECRET = b"fsdpc-probe-secret-0123"  # store_probe --mode serve


def derive(secret, context):
    """fsdp_auth_derive: HMAC-SHA256(secret, "fsdpc key\\0" context)."""
    return hmac.new(secret, b"fsdpc key\0" + context.encode(), hashlib.sha256).digest()


def mac(key, label, a, b):
    """fsdp_auth_mac: HMAC-SHA256(key, label "\\0" a b)."""
    return hmac.new(key, label + b"\0" + a + b, hashlib.sha256).digest()


def public_env_key(host, port, world, job=""):
    """The key of an env:// or tcp:// store without a secret (dist.c)."""
    return derive(b"", "fsdpc store|%s|%d|%d|%s" % (host, port, world, job))


def probe_key():
    return derive(PROBE_SECRET, "probe")


def hdr(t, arg, klen, vlen):
    return struct.pack("<IHHqIIQ", MAGIC, VERSION, t, arg, klen, 0, vlen)


def recv_exact(s, n):
    b = b""
    while len(b) < n:
        c = s.recv(n - len(b))
        if not c:
            return None
        b += c
    return b


def recv_reply(s):
    """(type, arg, body) of one message, or (None, None, b"") when closed."""
    try:
        b = recv_exact(s, 32)
    except (ConnectionResetError, socket.timeout):
        b = None
    if b is None:
        return None, None, b""
    _, _, t, arg, klen, _, vlen = struct.unpack("<IHHqIIQ", b)
    body = recv_exact(s, klen + vlen) or b""
    return t, arg, body


def near_miss(m):
    """The MAC m with its last byte flipped: refused only by a comparison
    of all its bytes."""
    return m[:-1] + bytes([m[-1] ^ 1])


def handshake(s, key, wrong_mac=False, verify_server=True, near=None, between=None):
    """Runs the client side on socket s. Returns (ok, why): ok when the
    server answered OK; why says what happened otherwise ("server failed"
    when its MAC does not check with key, "refused: ..." with its reason).
    wrong_mac sends 32 zero bytes as our MAC; verify_server=False sends our
    MAC whatever the server proved (an attacker trying to get in).
    near="last" sends the right MAC with its last byte flipped; near="echo"
    sends the server's own MAC back (what anyone can, without the key).
    between, when given, is called after the hello's first 4 bytes."""
    cchal = os.urandom(16)
    hello = hdr(HELLO, 0, 4, 16) + b"test" + cchal
    if between:
        s.sendall(hello[:4])
        between()
        hello = hello[4:]
    s.sendall(hello)
    t, _, body = recv_reply(s)
    if t != R_CHALLENGE or len(body) != 48:
        return False, "refused: %r" % body if t == R_ERR else "no challenge (type %r)" % t
    schal, smac = body[:16], body[16:]
    if verify_server and not wrong_mac and near != "echo" and \
            not hmac.compare_digest(smac, mac(key, LABEL_SERVER, cchal, schal)):
        return False, "server failed"
    cmac = mac(key, LABEL_CLIENT, cchal, schal)
    if wrong_mac:
        cmac = bytes(32)
    elif near == "last":
        cmac = near_miss(cmac)
    elif near == "echo":
        cmac = smac
    s.sendall(hdr(AUTH, 0, 0, 32) + cmac)
    t, _, body = recv_reply(s)
    if t == R_OK:
        return True, "ok"
    return False, "refused: " + body.decode(errors="replace") if t == R_ERR else "closed"


def accept_one(port):
    """Plays a server on 127.0.0.1:port: says "listening" on stdout, then
    returns the first connection (within 20 s)."""
    ls = socket.socket()
    ls.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    ls.bind(("127.0.0.1", port))
    ls.listen(8)
    print("listening", flush=True)
    ls.settimeout(20)
    return ls.accept()[0]


def client(port, key=None, host="127.0.0.1"):
    """A connected, authenticated socket, or None."""
    s = socket.create_connection((host, port), timeout=10)
    ok, _ = handshake(s, key if key is not None else probe_key())
    if ok:
        return s
    s.close()
    return None


def get(s, key, timeout_ms=0):
    s.sendall(hdr(GET, timeout_ms, len(key), 0) + key)
    return recv_reply(s)


def put(s, key, value):
    s.sendall(hdr(SET, 0, len(key), len(value)) + key + value)
    return recv_reply(s)
