# tests/ckpt: sharded checkpoints end to end (fsdpc-train save/resume, faults,
# fsdpc-ckpt subcommands, bad inputs).
dist_check_SCRIPTS += tests/ckpt/test_ckpt_resume.sh tests/ckpt/test_ckpt_faults.sh \
	tests/ckpt/test_ckpt_bad.sh tests/ckpt/test_safetensors.sh
dist_check_DATA += tests/ckpt/ckpt_lib.sh tests/ckpt/make_bad_st.py
TESTS += tests/ckpt/test_ckpt_resume.sh tests/ckpt/test_ckpt_faults.sh tests/ckpt/test_ckpt_bad.sh \
	tests/ckpt/test_safetensors.sh
