EXTRA_DIST += \
	doc/backend-nccl.md \
	doc/backend-tcp.md \
	doc/cluster.md \
	doc/debugging.md \
	doc/design.md \
	doc/formats.md \
	doc/mesh.md \
	doc/model.md \
	doc/performance.md \
	doc/rendezvous.md \
	doc/sharding.md \
	doc/testing.md \
	doc/troubleshooting.md \
	doc/user-guide.md
