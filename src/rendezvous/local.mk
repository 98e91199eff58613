# src/rendezvous: key-value stores (tcp, file, in-process) and the world's
# init from the launcher (mpi, env://, tcp://, file://). Below the backends.
libfsdpc_a_SOURCES += src/rendezvous/store.c src/rendezvous/store_tcp.c \
	src/rendezvous/store_tcp_server.c src/rendezvous/store_file.c src/rendezvous/dist.c \
	src/rendezvous/auth.c src/rendezvous/netaddr.c
noinst_HEADERS += src/rendezvous/store.h src/rendezvous/dist.h src/rendezvous/store_impl.h src/rendezvous/auth.h \
	src/rendezvous/netaddr.h src/rendezvous/store_tcp.h

check_PROGRAMS += tests/dist/store_probe
dist_check_DATA += tests/dist/store_lib.sh tests/dist/store_flood.py tests/dist/store_wire.py
dist_check_SCRIPTS += tests/dist/test_store_env.sh tests/dist/test_store_file.sh \
	tests/dist/test_store_mpi.sh tests/dist/test_store_bad.sh tests/dist/test_store_limits.sh \
	tests/dist/test_store_auth.sh tests/dist/test_store_file_owner.sh \
	tests/dist/test_store_flood.sh
