"""make_escape.py MODEL.h5 CKPT_DIR OUTDIR - writes model files and
checkpoints whose datasets would make a reader take bytes from another file:
external raw storage, external and soft links, virtual datasets over a
stranger's file, a missing file, a shard beyond n_shards, the wrong dataset
or only part of the rows. CKPT_DIR is a checkpoint of MODEL.h5's model cut
into 2 shards. Every variant is named <kind>.h5 (model files) or <kind>/
(checkpoint directories) in OUTDIR; the planted secrets are OUTDIR/secret.txt
(text, a marker repeated) and OUTDIR/secret.h5 (every /model tensor of the
model filled with 1234.5), whose bytes must never reach an output."""
import os
import shutil
import sys

import h5py
import numpy as np

model, ckpt, out = sys.argv[1:4]
MARK = b"SECRET-7f3a-planted-bytes-"
SECRET_F32 = 1234.5

secret_txt = os.path.abspath(os.path.join(out, "secret.txt"))
with open(secret_txt, "wb") as f:
    f.write(MARK * 65536)
secret_h5 = os.path.abspath(os.path.join(out, "secret.h5"))
shutil.copy(model, secret_h5)
with h5py.File(secret_h5, "r+") as f:
    for k in f["model"]:
        f["model"][k][...] = SECRET_F32


def replace_external(f, name, path):
    """name becomes a dataset of the same shape whose bytes are path's."""
    d = f[name]
    shape, attrs = d.shape, dict(d.attrs)
    del f[name]
    n = int(np.prod(shape)) * 4
    nd = f.create_dataset(name, shape=shape, dtype="<f4", external=[(path, 0, n)])
    for k, v in attrs.items():
        nd.attrs[k] = v


def replace_vds(f, name, blocks, fill=0.0):
    """name becomes a virtual dataset; blocks: (row0, rows, file, dataset)."""
    d = f[name]
    shape, attrs = d.shape, dict(d.attrs)
    del f[name]
    lay = h5py.VirtualLayout(shape=shape, dtype="<f4")
    for row0, rows, src, dset in blocks:
        lay[row0:row0 + rows] = h5py.VirtualSource(src, dset, shape=(rows,) + shape[1:])
    nd = f.create_virtual_dataset(name, lay, fillvalue=fill)
    for k, v in attrs.items():
        nd.attrs[k] = v


def model_variant(kind, fn):
    p = os.path.join(out, kind + ".h5")
    shutil.copy(model, p)
    with h5py.File(p, "r+") as f:
        fn(f)


def ckpt_variant(kind, fn):
    d = os.path.join(out, kind)
    shutil.copytree(ckpt, d)
    fn(d)


def edit(path, fn):
    with h5py.File(path, "r+") as f:
        fn(f)


W = "model/wte.weight"
with h5py.File(model, "r") as f:
    V = f[W].shape[0]
half = (V + 1) // 2

# model files
model_variant("m_extstore", lambda f: replace_external(f, W, secret_txt))


def m_extlink(f):
    del f[W]
    f[W] = h5py.ExternalLink(secret_h5, "/" + W)


model_variant("m_extlink", m_extlink)


def m_softlink(f):
    f.move(W, "hidden")
    f[W] = h5py.SoftLink("/hidden")


model_variant("m_softlink", m_softlink)


def m_groupext(f):
    del f["model"]
    f["model"] = h5py.ExternalLink(secret_h5, "/model")


model_variant("m_groupext", m_groupext)
model_variant("m_vds", lambda f: replace_vds(f, W, [(0, V, secret_h5, W)]))

# checkpoints (2 shards)
ckpt_variant("c_extstore", lambda d: edit(os.path.join(d, "shard_0.h5"),
                                          lambda f: replace_external(f, W, secret_txt)))


def c_extlink(d):
    def fn(f):
        name = "optim/exp_avg/wte.weight"
        del f[name]
        f[name] = h5py.ExternalLink(secret_h5, "/" + W)
    edit(os.path.join(d, "shard_1.h5"), fn)


ckpt_variant("c_extlink", c_extlink)


def c_groupext(d):
    def fn(f):
        del f["optim"]
        f["optim"] = h5py.SoftLink("/model")
    edit(os.path.join(d, "shard_1.h5"), fn)


ckpt_variant("c_groupsoft", c_groupext)
# a shard whose tensor is virtual over a file that is not there: HDF5
# returns the fill value, and training resumes from zeros
ckpt_variant("c_shardvds", lambda d: edit(os.path.join(d, "shard_0.h5"), lambda f: replace_vds(
    f, W, [(0, half, "./gone.h5", W)])))
ckpt_variant("c_idx_stranger", lambda d: edit(os.path.join(d, "index.h5"), lambda f: replace_vds(
    f, W, [(0, half, "./shard_0.h5", W), (half, V - half, secret_h5, W)])))


def c_idx_range(d):
    shutil.copy(secret_h5, os.path.join(d, "shard_5.h5"))
    edit(os.path.join(d, "index.h5"), lambda f: replace_vds(
        f, W, [(0, half, "./shard_0.h5", W), (half, V - half, "./shard_5.h5", W)]))


ckpt_variant("c_idx_range", c_idx_range)
ckpt_variant("c_idx_dset", lambda d: edit(os.path.join(d, "index.h5"), lambda f: replace_vds(
    f, "model/h.0.ln_1.weight", [(0, 16, "./shard_0.h5", "model/h.0.ln_1.bias"),
                                 (16, 16, "./shard_1.h5", "model/h.0.ln_1.weight")])))
ckpt_variant("c_idx_gap", lambda d: edit(os.path.join(d, "index.h5"), lambda f: replace_vds(
    f, W, [(0, half, "./shard_0.h5", W)])))
ckpt_variant("c_idx_missing", lambda d: edit(os.path.join(d, "index.h5"), lambda f: replace_vds(
    f, W, [(0, half, "./shard_0.h5", W), (half, V - half, "./shard_1.h5.old", W)])))
print("written to", out)
