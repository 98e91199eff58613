# src/train: the composition root and the training loop.
libfsdpc_a_SOURCES += src/train/train_config.c src/train/schedule.c \
	src/train/metrics.c src/train/world.c src/train/trainer.c src/train/trainer_build.c src/train/trainer_loop.c \
	src/train/ckpt_cadence.c src/train/ckpt_save.c src/train/ckpt_async.c src/train/ckpt_resume.c src/train/ckpt_damage.c src/train/mesh_check.c src/train/save_progress.c \
	src/train/uneven.c src/train/stop.c src/train/model_source.c src/train/memory_plan.c src/train/memory_plan_pp.c src/train/stage.c
noinst_HEADERS += src/train/train_config.h src/train/schedule.h \
	src/train/metrics.h src/train/world.h src/train/counters.h src/train/trainer.h src/train/trainer_impl.h \
	src/train/ckpt_cadence.h src/train/ckpt_cadence_impl.h src/train/ckpt_async.h src/train/uneven.h src/train/stop.h src/train/model_source.h \
	src/train/memory_plan.h src/train/memory_plan_pp.h src/train/mesh_check.h src/train/save_progress.h src/train/stage.h
# what the parallelisms apply to: the tp plan, the model, activation checkpointing, the optimizer
libfsdpc_a_SOURCES += src/train/parts.c src/train/pipeline.c
noinst_HEADERS += src/train/parts.h src/train/pipeline.h

# tests: options and schedule, the loop end to end, the PyTorch oracle (skips without torch),
# and join over uneven inputs against a single-rank replay (join_ref)
check_PROGRAMS += tests/train/oracle_ours tests/train/join_ref
PROGRAM_TESTS += tests/train/test_train_options
tests_train_join_ref_SOURCES = tests/train/join_ref.c tests/train/oracle_engine.c
tests_train_oracle_ours_SOURCES = tests/train/oracle_ours.c tests/train/oracle_engine.c
noinst_HEADERS += tests/train/oracle_engine.h
dist_check_SCRIPTS += tests/train/test_train.sh tests/train/test_torch_oracle.sh \
	tests/train/test_join.sh
dist_check_DATA += tests/train/torch_oracle.py

# what a user meets: errors reported once with a hint, resume warnings,
# Ctrl-C and the other stop signals, run records, fsdpc-plot, --version
dist_check_SCRIPTS += tests/train/test_errors.sh tests/train/test_resume_ux.sh \
	tests/train/test_stop.sh tests/train/test_records.sh tests/train/test_mfu.sh \
	tests/train/test_plot_resume.sh tests/train/test_demo.sh

# the whole path on the guarded device equals the CPU device bit for bit
dist_check_SCRIPTS += tests/train/test_guarded.sh
dist_check_DATA += tests/train/guarded_lib.sh

# --activation-dtype bf16: the loss curve near f32's, checkpointing unchanged, the plan's bytes
dist_check_SCRIPTS += tests/train/test_act_dtype.sh

# --offload optim and params,optim on the guarded device equal no offload bit for bit
dist_check_SCRIPTS += tests/train/test_offload.sh

# --print-memory: the plan equals the engine's own accounting, without allocating
dist_check_SCRIPTS += tests/train/test_print_memory.sh
