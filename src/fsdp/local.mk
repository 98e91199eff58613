# src/fsdp: the sharding engine (FSDP2 fully_shard semantics) behind fsdp/engine.h.
libfsdpc_a_SOURCES += src/fsdp/shard.c src/fsdp/unit.c src/fsdp/engine.c
noinst_HEADERS += src/fsdp/fsdp.h src/fsdp/fsdp_impl.h

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
