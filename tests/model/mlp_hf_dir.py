#!/usr/bin/env python3
"""mlp_hf_dir.py - a Hugging Face-style directory of the test "mlp"
architecture (tests/model/mlp_hf.c), written here with numpy alone, and
checks of what fsdpc makes of it.

  mlp_hf_dir.py write DIR V T C H L TIED SEED   config.json + model.safetensors
  mlp_hf_dir.py same SRC OUT                    OUT's tensors are SRC's, bit for bit
  mlp_hf_dir.py model SRC MODEL.h5              the model file holds SRC's tensors
                                                in fsdpc's layout (h5py)
"""
import json
import os
import struct
import sys

import numpy as np


def write_st(path, tensors):
    hdr, off, blobs = {"__metadata__": {"format": "pt"}}, 0, []
    for name, a in tensors.items():
        b = np.ascontiguousarray(a, dtype="<f4").tobytes()
        hdr[name] = {"dtype": "F32", "shape": list(a.shape), "data_offsets": [off, off + len(b)]}
        off += len(b)
        blobs.append(b)
    h = json.dumps(hdr).encode()
    h += b" " * (-len(h) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h + b"".join(blobs))


def read_st(path):
    with open(path, "rb") as f:
        data = f.read()
    n = struct.unpack("<Q", data[:8])[0]
    hdr = json.loads(data[8:8 + n])
    out = {}
    for name, e in hdr.items():
        if name == "__metadata__":
            continue
        assert e["dtype"] == "F32", (name, e["dtype"])
        b, end = e["data_offsets"]
        out[name] = np.frombuffer(data[8 + n + b:8 + n + end], dtype="<f4").reshape(e["shape"])
    return out


def write(d, V, T, C, H, L, tied, seed):
    rng = np.random.default_rng(seed)
    r = lambda *s: (rng.standard_normal(s) * 0.2).astype(np.float32)
    t = {"model.wte.weight": r(V, C), "model.wpe.weight": r(T, C)}
    for l in range(L):
        p = "model.h.%d." % l
        t[p + "fc1.weight"] = r(H, C)
        t[p + "fc1.bias"] = r(H)
        t[p + "fc1.mask"] = np.ones(H, np.float32)  # a buffer: import skips it
        t[p + "fc2.weight"] = r(H, C)               # stored (in, out): fsdpc's (C, H) transposed
        t[p + "fc2.bias"] = r(C)
    t["lm_head.weight"] = t["model.wte.weight"].copy() if tied else r(V, C)
    t["model.lm_head.bias"] = r(V)
    os.makedirs(d, exist_ok=True)
    write_st(os.path.join(d, "model.safetensors"), t)
    cfg = {"architectures": ["MlpLMForCausalLM"], "model_type": "mlp_lm", "vocab_size": V,
           "n_positions": T, "hidden_size": C, "intermediate_size": H, "num_hidden_layers": L,
           "hidden_act": "relu", "tie_word_embeddings": bool(tied), "eos_token_id": V - 1}
    with open(os.path.join(d, "config.json"), "w") as f:
        json.dump(cfg, f, indent=2)


def same(src, out):
    a = read_st(os.path.join(src, "model.safetensors"))
    b = read_st(os.path.join(out, "model.safetensors"))
    cfg = json.load(open(os.path.join(out, "config.json")))
    tied = cfg["tie_word_embeddings"]
    want = {k for k in a if not k.endswith(".mask") and not (tied and k == "lm_head.weight")}
    if set(b) != want:
        print("names differ: only in source %s, only in export %s"
              % (sorted(want - set(b)), sorted(set(b) - want)))
        return 1
    for k in sorted(b):
        if a[k].shape != b[k].shape or a[k].tobytes() != b[k].tobytes():
            d = np.abs(a[k].astype(np.float64) - b[k]) if a[k].shape == b[k].shape else None
            print("%s: shape %s vs %s, max abs diff %s" % (k, a[k].shape, b[k].shape,
                                                          None if d is None else d.max()))
            return 1
    src_cfg = json.load(open(os.path.join(src, "config.json")))
    for k in ("model_type", "vocab_size", "n_positions", "hidden_size", "intermediate_size",
              "num_hidden_layers", "hidden_act", "tie_word_embeddings", "eos_token_id"):
        if cfg.get(k) != src_cfg.get(k):
            print("config.json %s: %r, source %r" % (k, cfg.get(k), src_cfg.get(k)))
            return 1
    print("%d tensors equal bit for bit, config.json agrees" % len(b))
    return 0


def model(src, path):
    import h5py
    a = read_st(os.path.join(src, "model.safetensors"))
    with h5py.File(path, "r") as f:
        g = f["model"]
        for k, v in a.items():
            if k.endswith(".mask") or (k == "lm_head.weight" and "lm_head.weight" not in g):
                continue
            name = k[len("model."):] if k.startswith("model.") else k
            want = v.T if name.endswith("fc2.weight") else v
            got = np.asarray(g[name])
            if got.shape != want.shape or got.tobytes() != np.ascontiguousarray(want).tobytes():
                print("%s: the model file's differs from the source's (shape %s vs %s)"
                      % (name, got.shape, want.shape))
                return 1
    print("the model file holds every source tensor, fc2 transposed to (out, in)")
    return 0


if __name__ == "__main__":
    cmd = sys.argv[1]
    if cmd == "write":
        write(sys.argv[2], *[int(x) for x in sys.argv[3:10]])
        sys.exit(0)
    sys.exit(same(sys.argv[2], sys.argv[3]) if cmd == "same" else model(sys.argv[2], sys.argv[3]))
