libfsdpc_a_SOURCES += src/model/gpt2_spec.c
noinst_HEADERS += src/model/gpt2_spec.h
