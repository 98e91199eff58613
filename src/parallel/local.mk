# src/parallel: the sharding engine (FSDP2 fully_shard semantics) behind parallel/engine.h,
# and pipeline schedules as tables.
libfsdpc_a_SOURCES += src/parallel/shard.c src/parallel/unit.c src/parallel/engine.c \
	src/parallel/pp_schedule.c src/parallel/pp_plan.c src/parallel/pp_comm.c \
	src/parallel/pp_engine.c src/parallel/pp_state.c
libfsdpc_a_SOURCES += src/parallel/offload.c src/parallel/engine_check.c
libfsdpc_a_SOURCES += src/parallel/shard_save.c
noinst_HEADERS += src/parallel/fsdp.h src/parallel/engine.h src/parallel/fsdp_impl.h \
	src/parallel/pp_schedule.h src/parallel/pp_plan.h src/parallel/pp_comm.h \
	src/parallel/pp_engine.h src/parallel/pp_engine_impl.h

# tests: sharded runs against single-rank runs of the same global batch
dist_check_SCRIPTS += tests/fsdp/test_fsdp_equiv.sh
dist_check_DATA += tests/fsdp/compare_models.py

# tensor-parallel checkpoint saves by exchange (shard_save.c): the same
# shards as the reduce-scatters, each rank sending at most its state
dist_check_SCRIPTS += tests/tp/test_tp_save.sh
# their bytes and save times against the reduce-scatters' (doc/performance.md)
EXTRA_DIST += tests/tp/run_tp_save_bench.sh

dist_doc_DATA += doc/sharding.md

# in-place packing against the row layout, every dtype, uneven splits
PROGRAM_TESTS += tests/fsdp/test_shard_pack

# the parts the trainer hands the engine (src/train/parts.c): borrowed, checked, applied
PROGRAM_TESTS += tests/fsdp/test_parts

# GPT-2 with unit 0 by rows (vocabulary-parallel embedding and tied head)
# over 2 and 3 ranks against one process with the global batch
check_PROGRAMS += tests/fsdp/test_rows
dist_check_SCRIPTS += tests/fsdp/test_rows.sh

# pipeline schedules (gpipe, 1f1b, interleaved): every pass once, the
# published tables, peaks of held activations, no deadlock, the bubble
PROGRAM_TESTS += tests/pp/test_pp_schedule
# pipeline stages as blocks of layers: the balanced split against every
# split, and --pp-layers
PROGRAM_TESTS += tests/pp/test_pp_plan
