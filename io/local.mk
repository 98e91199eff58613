# io: HDF5 model files, checkpoints, safetensors, token files and the data loader.
libfsdpc_a_SOURCES += io/model_file.c io/model_writer.c io/h5util.c io/h5heap.c io/fileutil.c io/tokens.c io/ckpt.c \
	io/ckpt_commit.c io/ckpt_attrs.c io/ckpt_verify.c io/safetensors.c io/checksum.c \
	io/tokenizer.c io/tokenizer_added.c io/tokenizer_encode.c io/tokenizer_post.c io/json.c io/hf_dir.c
noinst_HEADERS += io/model_file.h io/h5util.h io/fileutil.h io/tokens.h io/ckpt.h io/ckpt_attrs.h io/ckpt_commit.h \
	io/safetensors.h io/checksum.h io/tokenizer.h io/tokenizer_impl.h io/json.h io/hf_dir.h

check_PROGRAMS += tests/io/bad_model tests/io/test_model_file tests/io/test_tokens \
	tests/io/test_ckpt_commit tests/io/test_fileutil tests/io/test_checksum tests/io/test_h5_heaps
TESTS += tests/io/test_model_file tests/io/test_tokens tests/io/test_ckpt_commit \
	tests/io/test_fileutil tests/io/test_checksum tests/io/test_h5_heaps
# the commit test wraps fsync/rename/symlink and reaches libc's through dlsym
tests_io_test_ckpt_commit_LDADD = $(LDADD) -ldl
dist_check_SCRIPTS += tests/io/test_ckpt_tool.sh tests/io/test_data_tool.sh \
	tests/io/test_output_files.sh
TESTS += tests/io/test_ckpt_tool.sh tests/io/test_data_tool.sh tests/io/test_output_files.sh
# tokenizer.json files against the `tokenizers` package (hf-venv, see doc/testing.md);
# tokenizer_api runs inside test_tokenizer.sh
check_PROGRAMS += tests/io/tokenizer_api
dist_check_SCRIPTS += tests/io/test_tokenizer.sh
dist_check_DATA += tests/io/hf_tokenizer.py
TESTS += tests/io/test_tokenizer.sh
