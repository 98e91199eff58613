EXTRA_DIST += \
	jobscripts/local/demo.sh
