# src/dist: rendezvous store, init methods, process groups, device mesh
libfsdpc_a_SOURCES += src/dist/store.c src/dist/store_tcp.c src/dist/store_tcp_server.c \
	src/dist/store_file.c src/dist/dist.c
noinst_HEADERS += src/dist/store.h src/dist/dist.h src/dist/group.h src/dist/mesh.h
noinst_HEADERS += src/dist/store_impl.h src/dist/store_tcp.h
# process groups and the device mesh
libfsdpc_a_SOURCES += src/dist/group.c src/dist/mesh.c
check_PROGRAMS += tests/dist/test_mesh tests/dist/test_mesh_parse
dist_check_SCRIPTS += tests/dist/test_mesh.sh
TESTS += tests/dist/test_mesh.sh tests/dist/test_mesh_parse

check_PROGRAMS += tests/dist/store_probe
dist_check_DATA += tests/dist/store_lib.sh
dist_check_SCRIPTS += tests/dist/test_store_env.sh tests/dist/test_store_file.sh \
	tests/dist/test_store_mpi.sh tests/dist/test_store_bad.sh
TESTS += tests/dist/test_store_env.sh tests/dist/test_store_file.sh \
	tests/dist/test_store_mpi.sh tests/dist/test_store_bad.sh
