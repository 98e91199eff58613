# src/fsdp: the sharding engine (FSDP2 fully_shard semantics) behind fsdp/engine.h.
libfsdpc_a_SOURCES += src/fsdp/shard.c src/fsdp/unit.c src/fsdp/engine.c src/fsdp/tp.c
noinst_HEADERS += src/fsdp/fsdp.h src/fsdp/engine.h src/fsdp/fsdp_impl.h src/fsdp/tp.h

# tests: sharded runs against single-rank runs of the same global batch
dist_check_SCRIPTS += tests/fsdp/test_fsdp_equiv.sh
dist_check_DATA += tests/fsdp/compare_models.py
TESTS += tests/fsdp/test_fsdp_equiv.sh

dist_doc_DATA += doc/sharding.md

# in-place packing against the row layout, every dtype, uneven splits
check_PROGRAMS += tests/fsdp/test_shard_pack
TESTS += tests/fsdp/test_shard_pack

# GPT-2 with unit 0 by rows (vocabulary-parallel embedding and tied head)
# over 2 and 3 ranks against one process with the global batch
check_PROGRAMS += tests/fsdp/test_rows
dist_check_SCRIPTS += tests/fsdp/test_rows.sh
TESTS += tests/fsdp/test_rows.sh

# tensor parallelism: the operators (src/model/tp_ops.c) at tp = 2, 3 and 4
# against the unsharded computation and central differences
check_PROGRAMS += tests/tp/test_tp_ops
dist_check_SCRIPTS += tests/tp/test_tp_ops.sh
TESTS += tests/tp/test_tp_ops.sh
# and the models' tensor-parallel paths, every gradient element against the
# whole model (run by test_tp_ops.sh)
check_PROGRAMS += tests/tp/test_tp_model
# fsdpc-train over meshes with a tp dimension against one rank on the same
# global batch (tests/fsdp/compare_models.py, tests/train/join_ref)
dist_check_SCRIPTS += tests/tp/test_tp_equiv.sh
TESTS += tests/tp/test_tp_equiv.sh
# the tensor-parallel benchmark (doc/performance.md), run by hand
EXTRA_DIST += tests/tp/run_tp_bench.sh tests/tp/tp_volumes.py
