#!/bin/sh
# corpus.sh BYTES - prints about BYTES bytes of deterministic text for the
# tests' token files: sentences drawn from a fixed word list by Park-Miller's
# multiplicative congruential generator (exact in double arithmetic, so
# every awk prints the same text). Unlike the sources, which the tests once
# trained on, it does not change when the code is edited, so neither do the
# losses and overflows the tests are tuned to.
exec awk -v want="${1:-150000}" 'BEGIN {
    split("the a of to in and is that for it as with was on be by at this from " \
          "rank ranks shard shards gradient gradients step steps model layer block " \
          "buffer tensor row rows column group mesh backend store file checkpoint " \
          "loss scale norm weight bias head token batch sequence context vocabulary " \
          "reduce gather scatter broadcast barrier wait issue progress timeout error " \
          "every each one two three four first last next previous same other " \
          "returns holds keeps writes reads opens closes checks sums splits packs " \
          "when while until before after because so but not only also never always " \
          "int size_t float double const struct static void return if else for " \
          "(i) [r] {0} x y z n k u v w = + - * / < > ;", w, " ")
    nw = length(w)
    x = 12345; out = 0; line = 0
    while (out < want) {
        x = (x * 16807) % 2147483647
        s = w[1 + int(x / 1024) % nw]
        if (line == 0) s = toupper(substr(s, 1, 1)) substr(s, 2)
        printf "%s", s; out += length(s); line += length(s)
        x = (x * 16807) % 2147483647
        r = int(x / 1024) % 16
        if (r == 0) { printf ".\n"; out += 2; line = 0 }
        else if (r == 1 && line > 40) { printf ",\n  "; out += 4; line = 2 }
        else { printf " "; out += 1; line += 1 }
    }
    printf "\n"
}'
