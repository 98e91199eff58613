# Shared test helpers; each layer's tests are listed in that layer's fragment.
# Benchmark drivers and peers run by hand (doc/performance.md), shipped with the source.
EXTRA_DIST += tests/peers/run_train_bench.sh tests/peers/torch_train_bench.py \
	tests/peers/torch_ddp_bench.py tests/peers/run_ckpt_bench.sh tests/peers/run_debug_bench.sh

# the include directions between layers (doc/design.md)
dist_check_SCRIPTS += tests/layers/test_layers.sh
dist_check_DATA += tests/layers/check_layers.sh tests/layers/allowed.txt
TESTS += tests/layers/test_layers.sh
