"""tp_volumes.py - the analytical bytes each rank sends per optimizer step
(ring volumes) for fsdpc-train's parallelisms, against the counters that
fsdpc-train prints at the end of a run ("comm per rank per step ...").

  tp_volumes.py MODEL.h5 LOG --mesh dp=2,tp=2 --batch B --seq T
                [--sequence-parallel on|off] [--activation-checkpointing]
                [--markdown NAME]

Volumes are the standard ring ones, per rank: an all-reduce of n bytes
sends 2 (p-1)/p n, an all-gather or reduce-scatter whose full buffer is n
bytes sends (p-1)/p n. Per optimizer step of one micro-batch of N = B x T
rows of width C:

FSDP over the D ranks of dp (each rank's tp-local units, P_u elements):
  all-gather      every unit before its forward, the blocks again before
                  their backward (unit 0 and the last stay gathered):
                  4 (P_0 + 2 sum P_block + P_last)
  reduce-scatter  every unit's gradient once: 4 sum P_u
  GPT-2's unit 0 by rows (dp only, when V + context > 2 D B T) is neither:
  the model exchanges activations instead (below).

Megatron tensor parallelism over the T ranks of tp, L blocks:
  without sequence parallelism, all-reduces of N C floats: the embedding,
  2 per block forward (+1 recomputed with checkpointing) and 2 backward,
  d(final norm); and the parallel cross-entropy's 3 N (max; sums and target
  logits)
  with sequence parallelism, N C floats each: all-gathers: 2 per block
  forward (+2 recomputed), 4 backward, the final norm's output, the
  embedding's backward; reduce-scatters: the embedding, 2 per block
  forward (+1 recomputed), 2 backward, d(final norm); all-reduces: 3 N
  (cross-entropy) and the norms' weight gradients (GPT-2 4 C per block and
  2 C, Llama 2 C per block and C)

GPT-2's unit 0 by rows over the D ranks of dp (tied head, R = D N rows):
  all-gathers of the token ids and targets (4 R each), of ln_f's rows and
  of d(residual) (4 R C each); reduce-scatters of the embedding's rows and
  of d(ln_f) (4 R C each); all-reduces of the head's row maxima and sums
  (4 R and 8 R).

Prints one line per category with the counted and the analytical figure
and their ratio; exits 1 when a category differs by more than 1%.
"""
import argparse
import re
import sys


def read_model(path):
    import h5py
    with h5py.File(path, "r") as f:
        attrs = {k: (v.decode() if isinstance(v, bytes) else v) for k, v in f.attrs.items()}
        shapes = {}
        f["model"].visititems(lambda n, d: shapes.__setitem__(n, tuple(d.shape))
                              if hasattr(d, "shape") else None)
    return attrs, shapes


def unit_of(arch, name, L):
    if arch == "gpt2":
        if name.startswith("wte.") or name.startswith("wpe."):
            return 0
        m = re.match(r"h\.(\d+)\.", name)
    else:
        if name.startswith("embed_tokens."):
            return 0
        m = re.match(r"layers\.(\d+)\.", name)
    return 1 + int(m.group(1)) if m else L + 1


def local_numel(arch, name, shape, T):
    """Elements of the tp-local tensor (the cut of src/model/*.c tp_cut)."""
    rows, cols = shape[0], (shape[1] if len(shape) > 1 else 1)
    vocab = name.startswith(("wte.", "embed_tokens.", "lm_head."))
    colwise = re.search(r"c_attn\.|mlp\.c_fc\.|q_proj\.|k_proj\.|v_proj\.|gate_proj\.|up_proj\.",
                        name)
    rowwise = re.search(r"(attn\.c_proj|mlp\.c_proj|o_proj|down_proj)\.weight", name)
    if T == 1:
        return rows * cols
    if vocab:
        return -(-rows // T) * cols
    if colwise:
        return rows // T * cols
    if rowwise:
        return rows * (cols // T)
    return rows * cols


def volumes(attrs, shapes, mesh, B, S, sp, ckpt):
    arch = attrs["architecture"]
    L, C, V, ctx = (int(attrs["n_layer"]), int(attrs["n_embd"]), int(attrs["vocab_size"]),
                    int(attrs["context"]))
    tied = int(attrs.get("tied_embeddings", 1))
    D, T = mesh.get("dp", 1), mesh.get("tp", 1)
    sp = sp and T > 1
    N = B * S
    P = [0] * (L + 2)
    for name, shape in shapes.items():
        P[unit_of(arch, name, L)] += local_numel(arch, name, shape, T)
    rows = arch == "gpt2" and T == 1 and D > 1 and V + ctx > 2 * D * B * S
    v = {k: 0.0 for k in ("fsdp_ag", "fsdp_rs", "fsdp_ar", "tp_ar", "tp_ag", "tp_rs",
                          "rows_ar", "rows_ag", "rows_rs")}
    if D > 1:
        f = (D - 1) / D
        gathered = (0 if rows else P[0]) + 2 * sum(P[1:L + 1]) + P[L + 1]
        v["fsdp_ag"] = f * 4 * gathered
        v["fsdp_rs"] = f * 4 * (sum(P) - (P[0] if rows else 0))
    if T > 1:
        f, NC = (T - 1) / T, N * C
        if not sp:
            ar = NC * (1 + 4 * L + 1 + (L if ckpt else 0)) + 3 * N
            v["tp_ar"] = 2 * f * 4 * ar
        else:
            norm = (4 * C * L + 2 * C) if arch == "gpt2" else (2 * C * L + C)
            v["tp_ar"] = 2 * f * 4 * (3 * N + norm)
            v["tp_ag"] = f * 4 * NC * (6 * L + 2 + (2 * L if ckpt else 0))
            v["tp_rs"] = f * 4 * NC * (4 * L + 2 + (L if ckpt else 0))
    if rows:
        f, R = (D - 1) / D, D * N
        v["rows_ag"] = f * 4 * (R + R * C + (R + R * C if tied else 0))
        v["rows_rs"] = f * 4 * (R * C + (R * C if tied else 0))
        v["rows_ar"] = 2 * f * 4 * (3 * R if tied else 0)
    return v


def counted(log):
    """The 'comm per rank per step' line: groups that moved nothing are left out."""
    groups = {"fsdp": "fsdp", "tp": "tp", "unit 0 exchanges": "rows"}
    for line in open(log, errors="replace"):
        if not line.startswith("comm per rank per step"):
            continue
        out = {k: 0.0 for k in ("fsdp_ag", "fsdp_rs", "fsdp_ar", "tp_ar", "tp_ag", "tp_rs",
                                "rows_ar", "rows_ag", "rows_rs")}
        for name, key in groups.items():
            m = re.search(r"[:|] %s all-gather (\S+), reduce-scatter (\S+), all-reduce (\S+)" %
                          re.escape(name), line)
            if m:
                out[key + "_ag"], out[key + "_rs"], out[key + "_ar"] = (
                    float(g.rstrip(",|")) for g in m.groups())
        return out
    return None


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("model")
    ap.add_argument("log")
    ap.add_argument("--mesh", required=True)
    ap.add_argument("--batch", type=int, required=True)
    ap.add_argument("--seq", type=int, required=True)
    ap.add_argument("--sequence-parallel", default="on")
    ap.add_argument("--activation-checkpointing", action="store_true")
    ap.add_argument("--markdown")
    a = ap.parse_args()
    mesh = {k: int(n) for k, n in (d.split("=") for d in a.mesh.split(","))}
    attrs, shapes = read_model(a.model)
    want = volumes(attrs, shapes, mesh, a.batch, a.seq, a.sequence_parallel == "on",
                   a.activation_checkpointing)
    got = counted(a.log)
    if got is None:
        print("%s: no 'comm per rank per step' line" % a.log)
        return 1
    bad, cells = 0, []
    for k in want:
        w, g = want[k], got[k]
        ok = abs(g - w) <= 0.01 * max(w, 1.0) if w > 0 else g == 0
        bad += not ok
        if w > 0 or g > 0:
            print("%-8s counted %14.0f  analytical %14.0f  ratio %.5f%s" %
                  (k, g, w, g / w if w else float("inf"), "" if ok else "  <-- off by more than 1%"))
            cells.append("%s %.1f / %.1f MiB" % (k.replace("_", " "), g / 2**20, w / 2**20))
    total_g, total_w = sum(got.values()), sum(want.values())
    print("total    counted %14.0f  analytical %14.0f  ratio %.5f" %
          (total_g, total_w, total_g / total_w if total_w else 0.0))
    if a.markdown:
        print("MD|%s|%.1f|%.1f|%.4f|%s" % (a.markdown, total_g / 2**20, total_w / 2**20,
                                          total_g / total_w if total_w else 0.0, "; ".join(cells)))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
