libfsdpc_a_SOURCES += backends/registry.c
noinst_HEADERS += backends/backend.h
