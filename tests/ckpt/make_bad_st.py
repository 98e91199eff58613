"""make_bad_st.py GOOD.safetensors OUTDIR - writes malformed variants of a
good safetensors file, one per kind of damage, named <kind>.safetensors."""
import json
import os
import struct
import sys

good, out = sys.argv[1], sys.argv[2]
raw = open(good, "rb").read()
n = struct.unpack("<Q", raw[:8])[0]
hdr = json.loads(raw[8:8 + n])
data = raw[8 + n:]


def write(kind, header, body=data, length=None):
    h = header if isinstance(header, bytes) else json.dumps(header).encode()
    with open(os.path.join(out, kind + ".safetensors"), "wb") as f:
        f.write(struct.pack("<Q", len(h) if length is None else length) + h + body)


def edit(fn):
    h = json.loads(json.dumps(hdr))
    fn(h)
    return h


names = [k for k in hdr if k != "__metadata__"]
first, second = names[0], names[1]
open(os.path.join(out, "short.safetensors"), "wb").write(b"\x10\x00\x00")
hb = json.dumps(hdr).encode()
write("beyond", hb, length=len(hb) + len(data) + 100)
write("cap", json.dumps(hdr).encode(), length=1 << 40)
write("notjson", b"[1, 2, 3]")
write("truncjson", json.dumps(hdr).encode()[:-7])
write("overlap", edit(lambda h: h[second].update(
    data_offsets=[h[second]["data_offsets"][0] - 4, h[second]["data_offsets"][1] - 4])))
write("uncovered", hdr, body=data + b"\0" * 8)
write("sizemismatch", edit(lambda h: h[first].update(shape=[h[first]["shape"][0] - 1,
                                                            h[first]["shape"][1]])))
write("dtype", edit(lambda h: h[first].update(dtype="F8_E4M3")))
write("dup", json.dumps(hdr).encode()[:-1] + b',"%s":%s}' % (
    first.encode(), json.dumps(hdr[first]).encode()))
write("negative", edit(lambda h: h[first].update(data_offsets=[-1, 10])))
# a tensor dropped (its bytes with it would shift the others: keep the
# bytes but rename the tensor to something unknown)
write("unknown", edit(lambda h: h.update({"transformer.h.0.mlp.c_gate.weight": h.pop(
    "transformer.h.0.mlp.c_fc.weight")})))
write("notransp", edit(lambda h: h["transformer.h.0.attn.c_attn.weight"].update(
    shape=h["transformer.h.0.attn.c_attn.weight"]["shape"][::-1])))
write("noheads", edit(lambda h: h.pop("__metadata__")))
write("badeps", edit(lambda h: h["__metadata__"].update(fsdpc_ln_eps="1e-5x")))
# checksums: one bit of a tensor's bytes flipped; the checksums dropped (a
# file from another tool); a checksum that is not 16 hex digits
attn = "transformer.h.0.attn.c_attn.weight"
begin, end = hdr[attn]["data_offsets"]
body = bytearray(data)
body[(begin + end) // 2] ^= 1
write("flipped", hdr, body=bytes(body))
write("nosum", edit(lambda h: [h["__metadata__"].pop(k) for k in list(h["__metadata__"])
                               if k.startswith("fsdpc.xxh3_64.")]))
write("badsum", edit(lambda h: h["__metadata__"].update(
    {"fsdpc.xxh3_64.transformer.wte.weight": "12345"})))
