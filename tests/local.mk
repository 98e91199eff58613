# Shared test helpers; each layer's tests are listed in that layer's fragment.
# Benchmark drivers and peers run by hand (doc/performance.md), shipped with the source.
EXTRA_DIST += tests/peers/run_train_bench.sh tests/peers/torch_train_bench.py \
	tests/peers/torch_ddp_bench.py tests/peers/run_ckpt_bench.sh tests/peers/run_debug_bench.sh \
	tests/peers/run_build_compare.sh tests/peers/run_ctrlc_repeat.sh \
	tests/peers/hf_llama_train_bench.py tests/peers/run_hosts_bench.sh \
	tests/peers/run_llama_bench.sh tests/peers/run_ckpt_async_bench.sh \
	tests/peers/run_ckpt_io_bench.sh

# the include directions between layers (doc/design.md)
dist_check_SCRIPTS += tests/layers/test_layers.sh
dist_check_DATA += tests/layers/check_layers.sh tests/layers/allowed.txt

# no function over 80 lines, no .c file over 900, beyond a short allow-list
dist_check_SCRIPTS += tests/layers/test_lengths.sh
dist_check_DATA += tests/layers/check_lengths.sh tests/layers/lengths_allowed.txt

# tests/model: "mlp", a test-only second architecture behind the model
# interface; other tests link tests/model/mlp_model.c the same way.
noinst_HEADERS += tests/model/mlp_model.h
PROGRAM_TESTS += tests/model/test_mlp_model
tests_model_test_mlp_model_SOURCES = tests/model/test_mlp_model.c tests/model/mlp_model.c \
	tests/model/mlp_hf.c
# the same architecture trained by the unchanged trainer and sharding engine
check_PROGRAMS += tests/model/mlp_train
tests_model_mlp_train_SOURCES = tests/model/mlp_train.c tests/model/mlp_model.c \
	tests/model/mlp_hf.c src/programs/train_program.c
dist_check_SCRIPTS += tests/model/test_mlp_sharded.sh
# fsdpc-ckpt with "mlp" registered: its Hugging Face-style map (mlp_hf.c) through
# the unchanged import-hf, export-hf and safetensors commands, and its training
# on the guarded device
check_PROGRAMS += tests/model/mlp_ckpt
tests_model_mlp_ckpt_SOURCES = tests/model/mlp_ckpt.c tests/model/mlp_model.c \
	tests/model/mlp_hf.c $(ckpt_program_sources)
dist_check_SCRIPTS += tests/model/test_mlp_hf.sh
dist_check_DATA += tests/model/mlp_hf_dir.py
