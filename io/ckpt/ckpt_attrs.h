/*
 * ckpt_attrs.h - the checksums of a checkpoint index's root attributes
 * (layout: doc/formats.md, "index.h5"): the run state a resume trusts (step,
 * data cursor, optimizer and loss-scaler counters, config) and the
 * architecture's attributes live outside every tensor, so index.h5 keeps
 * one XXH3-64 per attribute in `xxh3_64_attrs`, in a fixed order, and every
 * open of the checkpoint compares them: an edited or damaged attribute is
 * one error naming it, never a resume from a silently different state.
 *
 * io-internal: only io/ includes this header (it brings in hdf5.h).
 */
#ifndef FSDP_IO_CKPT_ATTRS_H
#define FSDP_IO_CKPT_ATTRS_H

#include <hdf5.h>

#include "core/spec.h"

#define FSDP_CKPT_ATTRS_SUM "xxh3_64_attrs"

/*
 * Hashes every covered root attribute of f (a file of architecture arch) as
 * it is stored (read back, so writer and reader hash the same values) and
 * writes xxh3_64_attrs: call it once all of them are written. 0, or a
 * negative FSDP_ERR_* with a message naming path.
 */
int fsdp_ckpt_attrs_sum_put(const char *path, hid_t f, const struct fsdp_arch *arch);

/*
 * Compares the root attributes of f (its architecture's too, looked up in
 * archs) with xxh3_64_attrs: 1 when every one
 * matches, 0 when the index records none (a checkpoint from an fsdpc
 * without them) or is of a format version this fsdpc does not read (its
 * reader refuses it, naming the version), or FSDP_ERR_FORMAT naming path
 * and the first attribute that differs or is missing.
 */
int fsdp_ckpt_attrs_sum_check(const char *path, hid_t f, const struct fsdp_arch_set *archs);

#endif
