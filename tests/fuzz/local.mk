# tests/fuzz: fuzz harnesses for the file readers (model file, checkpoint
# index, safetensors, token file, tokenizer.json). Not part of `make check`: `make fuzz`
# builds them with clang's libFuzzer and runs each for FUZZ_SECONDS
# (doc/troubleshooting.md, "Fuzzing the readers").
FUZZ_CC = clang
FUZZ_SECONDS = 120
FUZZ_READERS = model_file ckpt_index safetensors tokens tokenizer
EXTRA_DIST += tests/fuzz/run_fuzz.sh tests/fuzz/fuzz.h tests/fuzz/fuzz_common.c \
	tests/fuzz/fuzz_model_file.c tests/fuzz/fuzz_ckpt_index.c tests/fuzz/fuzz_safetensors.c \
	tests/fuzz/fuzz_tokens.c tests/fuzz/fuzz_tokenizer.c tests/fuzz/tokenizer.dict

.PHONY: fuzz
fuzz: fsdpc-ckpt$(EXEEXT) fsdpc-train$(EXEEXT) fsdpc-data$(EXEEXT)
	FUZZ_CC='$(FUZZ_CC)' HDF5_CFLAGS='$(HDF5_CFLAGS)' HDF5_LIBS='$(HDF5_LIBS)' \
	PYTHON3='$(PYTHON3)' $(SHELL) $(top_srcdir)/tests/fuzz/run_fuzz.sh '$(abs_top_srcdir)' \
	'$(abs_top_builddir)' '$(FUZZ_SECONDS)' '$(FUZZ_READERS)'

clean-local: clean-fuzz
.PHONY: clean-fuzz
clean-fuzz:
	-rm -rf tests/fuzz/obj tests/fuzz/seeds tests/fuzz/corpus tests/fuzz/out \
	tests/fuzz/fuzz_model_file tests/fuzz/fuzz_ckpt_index tests/fuzz/fuzz_safetensors \
	tests/fuzz/fuzz_tokens tests/fuzz/fuzz_tokenizer tests/fuzz/log.* tests/fuzz/stats.* tests/fuzz/summary.txt \
	tests/fuzz/tmp
