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

# the debug layer: flight recorder, watchdog, DETAIL fingerprints, monitored barrier
libfsdpc_a_SOURCES += src/dist/debug.c src/dist/flight.c src/dist/watchdog.c \
	src/dist/fingerprint.c src/dist/monitored_barrier.c
noinst_HEADERS += src/dist/debug.h src/dist/flight.h
bin_PROGRAMS += fsdpc-flight
fsdpc_flight_SOURCES = src/dist/flight_main.c
fsdpc_flight_LDADD =
# tests of the debug layer
check_PROGRAMS += tests/debug/debug_probe
dist_check_SCRIPTS += tests/debug/test_detail.sh tests/debug/test_monitor.sh \
	tests/debug/test_fuzz.sh tests/debug/test_watchdog.sh
TESTS += tests/debug/test_detail.sh tests/debug/test_monitor.sh tests/debug/test_fuzz.sh \
	tests/debug/test_watchdog.sh
# flight recorder dumps that a failing run in the build directory may leave
clean-local: clean-flight-dumps
clean-flight-dumps:
	-rm -rf fsdpc-flight-dumps
.PHONY: clean-flight-dumps
