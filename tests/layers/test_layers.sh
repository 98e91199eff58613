#!/bin/sh
# test_layers.sh - the include directions of doc/design.md ("Layers"): no
# library file includes a header of a layer above its own, beyond the
# shrinking list in allowed.txt; and the check does fail on a planted
# upward include, an unlisted one, and a listed one that is gone.
. "$top_srcdir/tests/tap.sh"

CHECK="$top_srcdir/tests/layers/check_layers.sh"
ALLOWED="$top_srcdir/tests/layers/allowed.txt"
W=$(mktemp -d "${TMPDIR:-/tmp}/fsdpc-layers.XXXXXX")
trap 'rm -rf "$W"' EXIT

out=$(sh "$CHECK" "$top_srcdir" "$ALLOWED" 2>&1)
rc=$?
[ $rc -eq 0 ] || tap_diag "$out"
tap_ok $rc "no include reaches a layer above, beyond allowed.txt ($(grep -vc '^#' "$ALLOWED") left)"

# io knows the architectures its callers hand it (struct fsdp_arch_set), never
# the table that src/model fills
uses=$(grep -rnE 'fsdp_arch_(find|names|at|registered|register|preset)\(' "$top_srcdir/io")
[ -z "$uses" ] || tap_diag "$uses"
[ -z "$uses" ]
tap_ok $? "io reads no global architecture table"

# The files that see the run through a narrow interface (the world, the
# engine, the settings, the trainer's counters) include no trainer header:
# checkpoint cadence, saves and resume (struct fsdp_ckpt_run), uneven inputs
# (struct fsdp_uneven_run).
NARROW="src/train/ckpt_cadence.c src/train/ckpt_cadence.h src/train/ckpt_cadence_impl.h
src/train/ckpt_save.c src/train/ckpt_async.c src/train/ckpt_async.h src/train/ckpt_resume.c
src/train/ckpt_damage.c src/train/uneven.c src/train/uneven.h"
# trainer_includes ROOT: the narrow files under ROOT that include trainer.h or trainer_impl.h
trainer_includes() {
    for f in $NARROW; do
        [ -f "$1/$f" ] && grep -Hn '#include "train/trainer\(_impl\)\?\.h"' "$1/$f"
    done
}
uses=$(trainer_includes "$top_srcdir")
[ -z "$uses" ] || tap_diag "$uses"
[ -z "$uses" ] && [ "$(for f in $NARROW; do [ -f "$top_srcdir/$f" ] && echo "$f"; done | wc -l)" -eq 10 ]
tap_ok $? "checkpoint cadence, resume and uneven inputs include no trainer header"
mkdir -p "$W/n/src/train"
printf '#include "train/world.h"\n#include "train/trainer.h"\n' > "$W/n/src/train/ckpt_resume.c"
trainer_includes "$W/n" | grep -q 'src/train/ckpt_resume.c:2:'
tap_ok $? "a planted include of trainer.h in ckpt_resume.c is found and named"

# fails_naming TEXT [ALLOWED]: the check of the small tree fails and says TEXT
fails_naming() {
    sh "$CHECK" "$W/t" ${2:+"$2"} > "$W/out" 2>&1
    rc=$?
    grep -q "$1" "$W/out"
    found=$?
    [ $rc -ne 0 ] && [ $found -eq 0 ]
}

# a small tree: core below model below train
mkdir -p "$W/t/src/core" "$W/t/src/model" "$W/t/src/train" "$W/t/io" "$W/t/backends"
printf '#include "core/a.h"\n' > "$W/t/src/model/m.c"
printf '#include "model/m.h"\n#include "core/a.h"\n' > "$W/t/src/train/t.c"
printf '/* nothing */\n' > "$W/t/src/core/a.h"
sh "$CHECK" "$W/t" > "$W/out" 2>&1
tap_ok $? "a tree whose includes point down passes"
printf '#include "train/t.h"\n' > "$W/t/src/core/up.c"
fails_naming "src/core/up.c -> train/t.h"
tap_ok $? "a planted upward include (core -> train) fails and is named"
echo "src/core/up.c -> train/t.h" > "$W/allowed"
sh "$CHECK" "$W/t" "$W/allowed" > "$W/out" 2>&1
tap_ok $? "the same include passes when it is listed as allowed"
rm "$W/t/src/core/up.c"
fails_naming "no longer there" "$W/allowed"
tap_ok $? "an allowed include that is gone fails until the list shrinks"
mkdir -p "$W/t/src/parallel"
printf '#include "io/h5/f.h"\n' > "$W/t/src/parallel/e.c"
fails_naming "src/parallel/e.c -> io/h5/f.h"
tap_ok $? "the sharding engine including io/ fails (it never opens files)"
rm "$W/t/src/parallel/e.c"
mkdir -p "$W/t/src/tp"
printf '#include "model/m.h"\n' > "$W/t/src/tp/p.c"
fails_naming "src/tp/p.c -> model/m.h"
tap_ok $? "tensor parallelism including a model header fails (the models call its operators)"
printf '#include "io/h5/f.h"\n' > "$W/t/src/tp/p.c"
fails_naming "src/tp/p.c -> io/h5/f.h"
tap_ok $? "tensor parallelism including io/ fails (it never opens files)"
rm "$W/t/src/tp/p.c"
mkdir -p "$W/t/io/util" "$W/t/io/h5"
printf '#include "io/util/u.h"\n#include "core/a.h"\n' > "$W/t/io/h5/h.c"
sh "$CHECK" "$W/t" > "$W/out" 2>&1
tap_ok $? "an io folder that builds on io/util passes"
printf '#include "io/h5/h.h"\n' > "$W/t/io/util/u.c"
fails_naming "io/util/u.c -> io/h5/h.h"
tap_ok $? "io/util including another io folder fails and is named"
rm "$W/t/io/util/u.c"
printf '/* nothing */\n' > "$W/t/io/loose.c"
fails_naming "io/loose.c is in no layer"
tap_ok $? "a file outside io's concern folders is in no layer"

tap_done
