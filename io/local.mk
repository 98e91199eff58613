# io: HDF5 model files, token files and the data loader, and the file tools.
libfsdpc_a_SOURCES += io/model_file.c io/model_writer.c io/h5util.c io/fileutil.c io/tokens.c io/ckpt.c \
	io/safetensors.c
noinst_HEADERS += io/model_file.h io/h5util.h io/fileutil.h io/tokens.h io/ckpt.h \
	io/safetensors.h

bin_PROGRAMS += fsdpc-data fsdpc-ckpt
fsdpc_data_SOURCES = io/fsdpc_data.c
fsdpc_ckpt_SOURCES = io/fsdpc_ckpt.c io/ckpt_tool.c io/ckpt_tool.h io/st_tool.c

check_PROGRAMS += tests/io/bad_model tests/io/test_model_file tests/io/test_tokens
TESTS += tests/io/test_model_file tests/io/test_tokens
dist_check_SCRIPTS += tests/io/test_ckpt_tool.sh tests/io/test_data_tool.sh
TESTS += tests/io/test_ckpt_tool.sh tests/io/test_data_tool.sh
