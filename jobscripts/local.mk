EXTRA_DIST += $(wildcard $(srcdir)/jobscripts/local/*.sh) $(wildcard $(srcdir)/jobscripts/slurm/*)
