# src/parallel: the parallelisms: the sharding engine (FSDP2 fully_shard semantics) behind
# parallel/engine.h, and the tensor-parallel plan.
libfsdpc_a_SOURCES += src/parallel/shard.c src/parallel/unit.c src/parallel/engine.c src/parallel/tp.c \
	src/parallel/pp_schedule.c
noinst_HEADERS += src/parallel/fsdp.h src/parallel/engine.h src/parallel/fsdp_impl.h src/parallel/tp.h \
	src/parallel/pp_schedule.h

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

# pipeline schedules (gpipe, 1f1b, interleaved): every pass once, the
# published tables, peaks of held activations, no deadlock, the bubble
check_PROGRAMS += tests/pp/test_pp_schedule
TESTS += tests/pp/test_pp_schedule
