libfsdpc_a_SOURCES += backends/registry.c
noinst_HEADERS += backends/backend.h

# every backend's globals carry its prefix and only its ops struct is exported
dist_check_SCRIPTS += tests/backends/test_symbols.sh
