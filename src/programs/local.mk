# src/programs: the mains and their command code (argument parsing,
# printing, exit codes): the only place that ends the process on an error.
bin_PROGRAMS += fsdpc-train fsdpc-sample fsdpc-data fsdpc-ckpt fsdpc-flight
fsdpc_train_SOURCES = src/programs/train_main.c src/programs/train_program.c
noinst_HEADERS += src/programs/train_program.h src/programs/cli.h
fsdpc_sample_SOURCES = src/programs/sample_main.c src/programs/sample_program.c
noinst_HEADERS += src/programs/sample_program.h
fsdpc_data_SOURCES = src/programs/data_main.c src/programs/cli.c
fsdpc_ckpt_SOURCES = src/programs/ckpt_main.c $(ckpt_program_sources)
# fsdpc-ckpt without its main, for test programs that register an architecture first
ckpt_program_sources = src/programs/ckpt_program.c src/programs/ckpt_tool.c src/programs/cli.c \
	src/programs/ckpt_tool.h src/programs/st_tool.c src/programs/ckpt_list.c \
	src/programs/hf_tool.c src/programs/hf_map.c src/programs/hf_map.h \
	src/programs/hf_tokens.c
fsdpc_flight_SOURCES = src/programs/flight_main.c src/programs/cli.c

# fsdpc-plot: training curves from metrics files, a Python script installed
# with the programs (it needs matplotlib: Debian's python3-matplotlib)
bin_SCRIPTS = fsdpc-plot
CLEANFILES += fsdpc-plot
EXTRA_DIST += src/programs/fsdpc-plot.py
fsdpc-plot: $(top_srcdir)/src/programs/fsdpc-plot.py Makefile
	$(AM_V_GEN)sed -e 's|@PACKAGE_VERSION[@]|$(PACKAGE_VERSION)|g' \
		$(top_srcdir)/src/programs/fsdpc-plot.py > $@.tmp && chmod +x $@.tmp && mv $@.tmp $@
