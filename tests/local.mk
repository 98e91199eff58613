# Shared test helpers; each layer's tests are listed in that layer's fragment.
# Benchmark drivers and peers run by hand (doc/performance.md), shipped with the source.
EXTRA_DIST += tests/peers/run_train_bench.sh tests/peers/torch_train_bench.py \
	tests/peers/torch_ddp_bench.py tests/peers/run_ckpt_bench.sh tests/peers/run_debug_bench.sh
