libfsdpc_a_SOURCES += src/model/gpt2_spec.c src/model/model.c
noinst_HEADERS += src/model/gpt2_spec.h src/model/model.h

# GPT-2 forward/backward over units on the CPU kernels
libfsdpc_a_SOURCES += src/model/gpt2.c
noinst_HEADERS += src/model/gpt2.h

check_PROGRAMS += tests/model/test_gpt2_grad
TESTS += tests/model/test_gpt2_grad

dist_doc_DATA += doc/model.md
