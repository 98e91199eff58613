noinst_HEADERS += src/dist/store.h src/dist/dist.h src/dist/group.h src/dist/mesh.h
