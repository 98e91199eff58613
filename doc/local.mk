EXTRA_DIST += $(wildcard $(srcdir)/doc/*.md)
