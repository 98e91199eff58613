#!/bin/sh
# test_store_file_owner.sh - a file:// store in a directory another user
# made, or with a stamp or namespace another user (or a link) put there:
#   - a store directory owned by another user is refused by rank 0 and by
#     the other ranks, even when it holds a stamp whose namespace is a link
#     (rank 0 would otherwise empty the link's target);
#   - in a directory of this user's, a namespace that is a symbolic link is
#     refused and its target left intact, and a stamp another user owns is
#     neither adopted (its secret) nor acted on (its namespace removed);
#   - the store directory given as a symbolic link is refused.
# Runs as root (as make check does here): "another user" is uid 65534,
# set with chown; as any other user the test skips.
. "$top_srcdir/tests/dist/store_lib.sh"

if [ "$(id -u)" -ne 0 ]; then
    tap_skip "needs root to give files to another user (chown)"
    tap_done
    exit
fi
other=65534
nonce=00000000000000aa

# plant_stamp DIR: a well-formed stamp of a current 2-rank job (nonce
# $nonce, a known secret, written now) and a victim directory with a
# sentinel that the stamp's namespace links to.
plant_stamp() {
    (umask 077 && printf 'fsdpc-file-store 1\nnonce %s\nsecret %s\njob -\ncreated %s\nworld 2\nwriter x 1\n' \
        "$nonce" "$(printf 'ab%.0s' $(seq 32))" "$(date +%s)" >"$1/fsdpc-store.stamp")
    mkdir -p "$T/victim"
    echo keep >"$T/victim/sentinel"
    ln -s "$T/victim" "$1/job-$nonce"
}

# 1. The store directory belongs to another user (made first in a shared
#    directory such as /tmp), with a planted stamp and a linked namespace.
mkdir -m 700 "$T/theirs"
plant_stamp "$T/theirs"
chown -R $other "$T/theirs"
expect_fail "rank 0: a store directory owned by another user is refused" \
    "file store: $T/theirs belongs to uid $other, not to this user (uid 0).*name a directory you own" 5 \
    RANK=0 WORLD_SIZE=2 -- --init "file://$T/theirs" --mode init
[ -f "$T/victim/sentinel" ] && [ -L "$T/theirs/job-$nonce" ]
tap_ok $? "rank 0 left the planted namespace and its target alone"
expect_fail "rank 1: a store directory owned by another user is refused, its stamp unread" \
    "file store: $T/theirs belongs to uid $other" 5 \
    RANK=1 WORLD_SIZE=2 FSDPC_FILE_STORE_SLACK=100000 -- --init "file://$T/theirs" --mode init

# 2. This user's directory, but the earlier job's namespace is a link: rank
#    0 refuses to clear it, and what it points to stays.
mkdir -m 700 "$T/linked"
plant_stamp "$T/linked"
expect_fail "rank 0: an earlier job's namespace that is a symbolic link is refused" \
    "file store: $T/linked/job-$nonce is a symbolic link, which the store never follows" 5 \
    RANK=0 WORLD_SIZE=1 -- --init "file://$T/linked" --mode init
[ -f "$T/victim/sentinel" ] && [ "$(cat "$T/victim/sentinel")" = keep ]
tap_ok $? "the link's target keeps its sentinel file"
expect_fail "rank 1: a current stamp whose namespace is a symbolic link is refused" \
    "file store: $T/linked/job-$nonce is a symbolic link" 5 \
    RANK=1 WORLD_SIZE=2 FSDPC_FILE_STORE_SLACK=100000 -- --init "file://$T/linked" --mode init

# 3. This user's directory, a stamp swapped in by another user (uid 65534):
#    rank 1 does not adopt its secret, rank 0 does not act on it.
mkdir -m 700 "$T/swapped"
plant_stamp "$T/swapped"
rm "$T/swapped/job-$nonce"
mkdir -m 700 "$T/swapped/job-$nonce"
echo keep >"$T/swapped/job-$nonce/kvalue"
chown $other "$T/swapped/fsdpc-store.stamp"
expect_fail "rank 1: a stamp owned by another user is refused" \
    "file store: $T/swapped/fsdpc-store.stamp belongs to uid $other, not to this user" 5 \
    RANK=1 WORLD_SIZE=2 FSDPC_FILE_STORE_SLACK=100000 -- --init "file://$T/swapped" --mode init
expect_fail "rank 0: a stamp owned by another user is refused" \
    "file store: $T/swapped/fsdpc-store.stamp belongs to uid $other" 5 \
    RANK=0 WORLD_SIZE=1 -- --init "file://$T/swapped" --mode init
[ -f "$T/swapped/job-$nonce/kvalue" ]
tap_ok $? "rank 0 removed nothing the foreign stamp named"

# 4. A namespace owned by another user behind this user's stamp: refused.
chown 0 "$T/swapped/fsdpc-store.stamp"
chown $other "$T/swapped/job-$nonce"
expect_fail "rank 1: a namespace owned by another user is refused" \
    "file store: $T/swapped/job-$nonce belongs to uid $other" 5 \
    RANK=1 WORLD_SIZE=2 FSDPC_FILE_STORE_SLACK=100000 -- --init "file://$T/swapped" --mode init

# 5. The store directory named through a symbolic link.
mkdir -m 700 "$T/real"
ln -s "$T/real" "$T/alias"
expect_fail "a store directory given as a symbolic link is refused" \
    "file store: $T/alias is a symbolic link, which the store never follows: name the directory itself" 5 \
    RANK=0 WORLD_SIZE=1 -- --init "file://$T/alias" --mode init

# 6. After all that, a normal job in a fresh directory still works.
run_job 2 "file://$T/fresh" --expect-size 2
tap_ok $? "a 2-rank file:// job in a directory of this user's passes every check"
[ ! -e "$T/fresh" ]
tap_ok $? "and its store is gone at the end"

tap_done
