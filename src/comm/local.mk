# src/comm: process groups, the device mesh, and the debug layer (flight
# recorder, watchdog, DETAIL fingerprints, monitored barrier). Above the
# backends.
libfsdpc_a_SOURCES += src/comm/group.c src/comm/p2p.c src/comm/stage.c src/comm/mesh.c src/comm/mesh_spec.c src/comm/counts.c
noinst_HEADERS += src/comm/group.h src/comm/group_impl.h src/comm/stage.h src/comm/mesh.h src/comm/mesh_spec.h src/comm/counts.h
check_PROGRAMS += tests/dist/test_mesh
PROGRAM_TESTS += tests/dist/test_mesh_parse
dist_check_SCRIPTS += tests/dist/test_mesh.sh

libfsdpc_a_SOURCES += src/comm/debug.c src/comm/flight.c src/comm/watchdog.c \
	src/comm/fingerprint.c src/comm/monitored_barrier.c
noinst_HEADERS += src/comm/debug.h src/comm/flight.h
# tests of the debug layer
check_PROGRAMS += tests/debug/debug_probe
EXTRA_DIST += tests/debug/probe.h
dist_check_SCRIPTS += tests/debug/test_detail.sh tests/debug/test_monitor.sh \
	tests/debug/test_fuzz.sh tests/debug/test_watchdog.sh
# point-to-point messages: data over mpi and tcp, staged, DETAIL's check of
# each message against its sender's call, a missing message named
check_PROGRAMS += tests/debug/p2p_probe
dist_check_SCRIPTS += tests/debug/test_p2p.sh
# staged collectives in chunks on the guarded device: every collective,
# dtype, chunk size, in place and not, against the same run on the host
check_PROGRAMS += tests/debug/stage_probe
dist_check_SCRIPTS += tests/debug/test_stage.sh
# flight recorder dumps that a failing run in the build directory may leave
clean-local: clean-flight-dumps
clean-flight-dumps:
	-rm -rf fsdpc-flight-dumps
.PHONY: clean-flight-dumps
