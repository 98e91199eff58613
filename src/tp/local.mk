# src/tp: tensor parallelism (Megatron-LM's layout): the plan that cuts a parameter table over
# the tp ranks (tp_plan.c) and the operators the models call inside their forward and backward
# (tp_ops.c). Below the models, which call the operators; the trainer applies the plan.
libfsdpc_a_SOURCES += src/tp/tp_plan.c src/tp/tp_ops.c
noinst_HEADERS += src/tp/tp_plan.h src/tp/tp_ops.h

# tensor parallelism: the operators (src/tp/tp_ops.c) at tp = 2, 3 and 4
# against the unsharded computation and central differences
check_PROGRAMS += tests/tp/test_tp_ops
dist_check_SCRIPTS += tests/tp/test_tp_ops.sh
# and the models' tensor-parallel paths, every gradient element against the
# whole model (run by test_tp_ops.sh)
check_PROGRAMS += tests/tp/test_tp_model
# fsdpc-train over meshes with a tp dimension against one rank on the same
# global batch (tests/fsdp/compare_models.py, tests/train/join_ref)
dist_check_SCRIPTS += tests/tp/test_tp_equiv.sh
# the tensor-parallel benchmark (doc/performance.md), run by hand
EXTRA_DIST += tests/tp/run_tp_bench.sh tests/tp/tp_volumes.py
