# io: files, by concern (doc/design.md, "Layers"):
#   io/util  durable writes, temporary names, directory trees; JSON documents
#   io/h5    HDF5 plumbing, model files, the checksums of HDF5 tensors
#   io/ckpt  sharded checkpoints: shard files, index, reader, consolidation, commit
#   io/hf    Hugging Face directories and safetensors files
#   io/text  llm.c token files and the data loader; tokenizer.json tokenizers
libfsdpc_a_SOURCES += io/util/fileutil.c io/util/json.c \
	io/h5/h5util.c io/h5/h5heap.c io/h5/model_file.c io/h5/model_writer.c io/h5/checksum.c \
	io/ckpt/ckpt_writer.c io/ckpt/ckpt_index.c io/ckpt/ckpt_reader.c \
	io/ckpt/ckpt_consolidate.c io/ckpt/ckpt_summary.c io/ckpt/ckpt_direct.c io/ckpt/ckpt_ahead.c io/ckpt/ckpt_path.c io/ckpt/ckpt_attrs.c io/ckpt/ckpt_commit.c io/ckpt/ckpt_verify.c \
	io/hf/safetensors.c io/hf/hf_dir.c \
	io/text/tokens.c io/text/tokenizer.c io/text/tokenizer_added.c io/text/tokenizer_encode.c \
	io/text/tokenizer_post.c
noinst_HEADERS += io/util/fileutil.h io/util/json.h \
	io/h5/h5util.h io/h5/model_file.h io/h5/checksum.h \
	io/ckpt/ckpt.h io/ckpt/ckpt_impl.h io/ckpt/ckpt_attrs.h io/ckpt/ckpt_commit.h \
	io/hf/safetensors.h io/hf/hf_dir.h \
	io/text/tokens.h io/text/tokenizer.h io/text/tokenizer_impl.h

check_PROGRAMS += tests/io/bad_model
PROGRAM_TESTS += tests/io/test_model_file tests/io/test_tokens tests/io/test_ckpt_commit \
	tests/io/test_fileutil tests/io/test_checksum tests/io/test_h5_heaps
# the commit test wraps fsync/rename/symlink and reaches libc's through dlsym
tests_io_test_ckpt_commit_LDADD = $(LDADD) -ldl
dist_check_SCRIPTS += tests/io/test_ckpt_tool.sh tests/io/test_data_tool.sh \
	tests/io/test_output_files.sh
# tokenizer.json files against the `tokenizers` package (hf-venv, see doc/testing.md);
# tokenizer_api runs inside test_tokenizer.sh
check_PROGRAMS += tests/io/tokenizer_api
dist_check_SCRIPTS += tests/io/test_tokenizer.sh
dist_check_DATA += tests/io/hf_tokenizer.py
