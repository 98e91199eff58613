#!/bin/sh
# Regenerates configure and Makefile.in from configure.ac and Makefile.am.
set -e
cd "$(dirname "$0")"
autoreconf --install --force --verbose -Wall >/dev/null
echo "autogen.sh: now run ./configure && make"
