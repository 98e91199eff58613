libfsdpc_a_SOURCES += src/model/gpt2_spec.c src/model/model.c src/model/hf_json.c
noinst_HEADERS += src/model/gpt2_spec.h src/model/model.h src/model/hf_json.h

# what the transformer LMs share: bookkeeping, batch, tensor-parallel regions
libfsdpc_a_SOURCES += src/model/lm.c src/model/lm_tp.c
noinst_HEADERS += src/model/lm.h

# GPT-2 forward/backward over units on the CPU kernels
libfsdpc_a_SOURCES += src/model/gpt2.c src/model/gpt2_head.c src/model/gpt2_decode.c
noinst_HEADERS += src/model/gpt2.h src/model/gpt2_head.h

PROGRAM_TESTS += tests/model/test_gpt2_grad

# the Llama family (Llama, Mistral, Qwen2) on the same kernels plus RMSNorm, RoPE, SwiGLU, GQA
libfsdpc_a_SOURCES += src/model/llama_spec.c src/model/llama.c src/model/llama_acts.c \
	src/model/llama_decode.c
noinst_HEADERS += src/model/llama_spec.h src/model/llama.h

PROGRAM_TESTS += tests/model/test_llama_grad tests/model/test_decode tests/model/test_share_ws
# fsdpc-sample end to end (cache against window, tokenizer text)
dist_check_SCRIPTS += tests/model/test_sample.sh
# against Hugging Face transformers 4.38 (skips without $(top_builddir)/hf-venv)
dist_check_SCRIPTS += tests/model/test_llama_hf.sh
dist_check_DATA += tests/model/llama_hf_check.py
# sharded training, hybrid sharding, checkpointing, bf16 and resume against one rank
dist_check_SCRIPTS += tests/fsdp/test_llama_equiv.sh

dist_doc_DATA += doc/model.md
