libfsdpc_a_SOURCES += src/core/error.c src/core/log.c src/core/dtype.c src/core/util.c src/core/spec.c src/core/hf_map.c \
	src/core/tmpfile.c src/core/options.c
noinst_HEADERS += src/core/error.h src/core/log.h src/core/dtype.h src/core/util.h src/core/spec.h src/core/hf_map.h \
	src/core/tmpfile.h src/core/mem.h src/core/options.h

PROGRAM_TESTS += tests/core/test_dtype
PROGRAM_TESTS += tests/core/test_options
