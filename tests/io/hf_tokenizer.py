"""hf_tokenizer.py - the Hugging Face side of test_tokenizer.sh.

  tiny OUT.json [--ignore-merges] [--prefix-space] [--edit PATH=JSON ...]
      a small byte-level BPE tokenizer.json written by hand (standard library
      only): the 256 byte symbols, a few merges, two added tokens. --edit
      sets a field (dotted path, list indices as numbers; JSON value, or
      "DELETE") to make the files the loader must refuse.
  train DIR
      trains tokenizers with the `tokenizers` package on local text (nothing
      comes from a model hub) and writes DIR/gpt2.json (ByteLevel with GPT-2's
      regex, <|endoftext|>, a normalized added token), DIR/gpt2p.json (the
      same with add_prefix_space), DIR/gpt2s.json (a Split on the string ", "
      before it), DIR/llama3.json (Llama 3's Split regex +
      ByteLevel without regex, Llama 3's special tokens, ids above 65535, its
      post-processor putting <|begin_of_text|> first) and the texts DIR/*.txt.
  check-encode TOKENIZER TEXT BIN [BIN2]
      the ids of llm.c token file(s) BIN (+ BIN2) against
      Tokenizer.encode(text, add_special_tokens=False): prints the first
      difference with its context, exits 1 on any.
  check-decode TOKENIZER BIN TEXT [--skip-special]
      the bytes of TEXT against Tokenizer.decode(ids of BIN).
  random-ids TOKENIZER OUT.bin N
      an llm.c token file of N ids drawn from the vocabulary, most of them
      single bytes >= 0x80, so that their bytes are seldom UTF-8.
  bench TOKENIZER TEXT
      tokens/s of Tokenizer.encode on TEXT (median of 5 after a warm-up).
  encode-special TOKENIZER TEXT
      Tokenizer.encode(TEXT).ids, the post-processor's tokens included.
"""
import json
import random
import struct
import sys
import time

LLAMA3_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}|"
                r" ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
LLAMA3_SPECIAL = ["<|begin_of_text|>", "<|end_of_text|>", "<|reserved_special_token_0|>",
                  "<|reserved_special_token_1|>", "<|start_header_id|>", "<|end_header_id|>",
                  "<|reserved_special_token_2|>", "<|eot_id|>"]
FILLER_FROM = 300      # llama3.json: ids from here on are shifted ...
FILLER_COUNT = 66000   # ... past this many filler entries, so real merges pass 65535


def byte_symbols():
    """GPT-2's bytes_to_unicode: byte -> the character that stands for it."""
    keep = list(range(33, 127)) + list(range(161, 173)) + list(range(174, 256))
    out, n = {}, 0
    for b in range(256):
        if b in keep:
            out[b] = chr(b)
        else:
            out[b] = chr(256 + n)
            n += 1
    return out


def sym(text):
    sy = byte_symbols()
    return "".join(sy[b] for b in text.encode("utf-8"))


def tiny(argv):
    out, edits = argv[0], []
    ignore = "--ignore-merges" in argv
    prefix = "--prefix-space" in argv
    for i, a in enumerate(argv):
        if a == "--edit":
            edits.append(argv[i + 1])
    sy = byte_symbols()
    vocab = {sy[b]: b for b in range(256)}
    merges = []
    for a, b in [("a", "b"), ("ab", "c"), (" ", "ab"), ("c", "d"), (" ab", "cd")]:
        a, b = sym(a), sym(b)
        vocab.setdefault(a + b, len(vocab))
        merges.append(a + " " + b)
    vocab[sym("abcd")] = len(vocab)  # whole, but no merge makes it
    added = [{"id": len(vocab), "content": "<|endoftext|>", "single_word": False,
              "lstrip": False, "rstrip": False, "normalized": False, "special": True},
             {"id": len(vocab) + 1, "content": "[X]", "single_word": False,
              "lstrip": False, "rstrip": False, "normalized": True, "special": False}]
    tok = {"version": "1.0", "truncation": None, "padding": None, "added_tokens": added,
           "normalizer": None,
           "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": prefix,
                             "trim_offsets": True, "use_regex": True},
           "post_processor": {"type": "ByteLevel", "add_prefix_space": True,
                              "trim_offsets": False, "use_regex": True},
           "decoder": {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True,
                       "use_regex": True},
           "model": {"type": "BPE", "dropout": None, "unk_token": None,
                     "continuing_subword_prefix": None, "end_of_word_suffix": None,
                     "fuse_unk": False, "byte_fallback": False, "ignore_merges": ignore,
                     "vocab": vocab, "merges": merges}}
    for e in edits:
        path, value = e.split("=", 1)
        keys = [int(k) if k.isdigit() else k for k in path.split(".")]
        node = tok
        for k in keys[:-1]:
            node = node[k]
        if value == "DELETE":
            del node[keys[-1]]
        else:
            node[keys[-1]] = json.loads(value)
    with open(out, "w", encoding="utf-8") as f:
        json.dump(tok, f, ensure_ascii=False)


# ----------------------------------------------------------------------------
# Texts

WORDS = ("the of and to in is that for it as with was on be by at this from rank shard "
         "gradient model layer token batch sequence vocabulary checkpoint").split()
ACCENTED = "café naïve Ångström über façade résumé jalapeño Øresund coöperate Ελληνικά русский".split()
CJK = "中文 日本語 한국어 東京 北京大学 こんにちは カタカナ 漢字かな交じり".split()
EMOJI = ["😀", "👍🏽", "🇫🇷", "👨\u200d👩\u200d👧", "❤️", "🚀🚀", "✨", "🤖"]
CONTRACTIONS = ["don't", "it's", "we've", "I'm", "you'll", "she'd", "THEY'RE", "IT'S", "o'clock",
                "rock'n'roll", "'tis", "’s", "l'été"]
DIGITS = ["2024", "12345678", "3.14159", "1,000,000", "007", "2024-05-20", "0x1F", "١٢٣",
          "１２３", "²³", "½", "Ⅻ"]
SPACES = [" ", "  ", "\t", "\n", "\n\n", "\r\n", " \n", "\u00a0", "\u3000", "   \t ",
          "\n   ", "\u2028", "\u0085", "\u180e", "\u200b"]
PUNCT = ["!", "?!", "...", "---", "()", "[]", "{}", ";;", "==", "->", "#", "@", "\"", "'", "’",
         "«»", "。", "、", "¡", "¿"]


def sentence(rng, n):
    parts = []
    pools = [WORDS] * 6 + [ACCENTED, CJK, EMOJI, CONTRACTIONS, DIGITS, PUNCT]
    for _ in range(n):
        w = rng.choice(rng.choice(pools))
        if rng.random() < 0.1:
            w = w.capitalize()
        parts.append(w)
        parts.append(rng.choice(SPACES) if rng.random() < 0.2 else " ")
    return "".join(parts)


FUZZ_CHARS = ("aZéÅß中語한😀👍🏽\u200d\ufe0f'’sStTmMdDlLrReEvV0123456789١１²½Ⅻ \t\n\r"
              "\u00a0\u3000\u2028\u0085\u180e\u200b\u001c\u001f\u0301\u0915\u093f!?.,;:-_()"
              "<|>ſK\u212a\u0130\u0131")
PIECES = ["<|begin_of_text|>", "<|end_of_text|>", "<|endoftext|>", "<|eot_id|>", "<|begin_of",
          "<|", "[CODE]", "[CODE", "'s", "'S", "'ll", "'LL", "'ſ", " 's", "\r\n\r\n", "   \n"]


def fuzz_text(rng, count):
    out = []
    for _ in range(count):
        s = []
        for _ in range(rng.randint(1, 24)):
            s.append(rng.choice(PIECES) if rng.random() < 0.08 else rng.choice(FUZZ_CHARS))
        out.append("".join(s))
    return "<|end_of_text|>".join(out)


def texts(rng):
    fixed = {
        "plain": "Hello world! It's a test of the tokenizer, isn't it? We'll see.\n",
        "unicode": ("Ça va? Voilà: naïve café, Ångström, 日本語のテキスト、中文文本。"
                    " 한국어 텍스트. Emoji: 😀👍🏽🇫🇷👨\u200d👩\u200d👧 done.\n"),
        "spaces": "a  b   c\t\td \n\n\n  e\r\n\r\nf \u00a0g\u3000h   \n   i    ",
        "digits": "1 12 123 1234 12345 3.14159 2024-05-20 1,000,000 0x1F ١٢٣ １２３ ²³ ½ Ⅻ",
        "contractions": "I'm sure you'll see we've done it; THEY'RE HERE, it'S ok, she'd go 'tis",
        "special": ("<|begin_of_text|>Hi<|eot_id|>\n<|endoftext|>text [CODE] more[CODE]x"
                    "<|begin_of <|end_of_text|><|end_of_text|> trailing"),
        "code": "int main(void) {\n    return x->y[0] == 'a' ? 1 : 0; // ok\n}\n",
    }
    return fixed


def make_corpus(rng):
    lines = [sentence(rng, rng.randint(5, 40)) for _ in range(6000)]
    lines += list(texts(rng).values()) * 5
    return lines


def train(argv):
    from tokenizers import Tokenizer, models, pre_tokenizers, decoders, trainers, processors
    from tokenizers import Regex, AddedToken
    out = argv[0]
    rng = random.Random(20240520)
    corpus = make_corpus(rng)
    alphabet = pre_tokenizers.ByteLevel.alphabet()

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    tok.train_from_iterator(corpus, trainers.BpeTrainer(
        vocab_size=2000, special_tokens=["<|endoftext|>"], initial_alphabet=alphabet,
        show_progress=False))
    tok.add_tokens([AddedToken("[CODE]", normalized=True, special=False)])
    tok.save(f"{out}/gpt2.json")
    j = json.loads(tok.to_str())
    j["pre_tokenizer"]["add_prefix_space"] = True
    with open(f"{out}/gpt2p.json", "w", encoding="utf-8") as f:
        json.dump(j, f, ensure_ascii=False)
    # a literal Split before ByteLevel (its regex on each piece)
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(", ", behavior="isolated"),
        pre_tokenizers.ByteLevel(add_prefix_space=False)])
    tok.save(f"{out}/gpt2s.json")

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(LLAMA3_SPLIT), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(corpus, trainers.BpeTrainer(
        vocab_size=3000, initial_alphabet=alphabet, show_progress=False))
    # ids past 65535: filler entries (never made by a merge) push the merged
    # tokens up; the special tokens follow the vocabulary as in Llama 3
    j = json.loads(tok.to_str())
    vocab = j["model"]["vocab"]
    for k in list(vocab):
        if vocab[k] >= FILLER_FROM:
            vocab[k] += FILLER_COUNT
    for i in range(FILLER_COUNT):
        vocab[f"<filler_{i}>"] = FILLER_FROM + i
    tok = Tokenizer.from_str(json.dumps(j))
    tok.add_special_tokens(LLAMA3_SPECIAL)
    # Llama 3's post-processor: ByteLevel, then <|begin_of_text|> before a text
    bos = tok.token_to_id("<|begin_of_text|>")
    tok.post_processor = processors.Sequence([
        processors.ByteLevel(trim_offsets=False),
        processors.TemplateProcessing(
            single="<|begin_of_text|> $A", pair="<|begin_of_text|> $A <|begin_of_text|> $B:1",
            special_tokens=[("<|begin_of_text|>", bos)])])
    tok.save(f"{out}/llama3.json")

    for name, text in texts(rng).items():
        with open(f"{out}/{name}.txt", "w", encoding="utf-8", newline="") as f:
            f.write(text)
    with open(f"{out}/fuzz.txt", "w", encoding="utf-8", newline="") as f:
        f.write(fuzz_text(random.Random(7), 3000))
    with open(f"{out}/corpus.txt", "w", encoding="utf-8", newline="") as f:
        f.write("".join(l + "\n" for l in make_corpus(random.Random(11))[:3000]))


# ----------------------------------------------------------------------------
# Checks

def read_bin(path):
    with open(path, "rb") as f:
        data = f.read()
    magic, version, count = struct.unpack("<3i", data[:12])
    assert magic == 20240520, f"{path}: bad magic {magic}"
    width = {1: 2, 2: 4}[version]
    fmt = "<%d%s" % (count, "H" if width == 2 else "I")
    return version, list(struct.unpack(fmt, data[1024:1024 + width * count]))


def load(path):
    from tokenizers import Tokenizer
    return Tokenizer.from_file(path)


def check_encode(argv):
    tok = load(argv[0])
    with open(argv[1], encoding="utf-8", newline="") as f:
        text = f.read()
    want = tok.encode(text, add_special_tokens=False).ids
    got = []
    for b in argv[2:]:
        got += read_bin(b)[1]
    if got == want:
        print(f"{len(got)} tokens equal")
        return 0
    i = next((k for k in range(min(len(got), len(want))) if got[k] != want[k]),
             min(len(got), len(want)))
    print(f"{len(got)} tokens, expected {len(want)}; first difference at {i}")
    print(f"  got    {got[max(0, i - 3):i + 5]}")
    print(f"  wanted {want[max(0, i - 3):i + 5]}")
    print(f"  wanted as text {[tok.id_to_token(t) for t in want[max(0, i - 3):i + 5]]}")
    return 1


def check_decode(argv):
    tok = load(argv[0])
    ids = read_bin(argv[1])[1]
    want = tok.decode(ids, skip_special_tokens="--skip-special" in argv).encode("utf-8")
    with open(argv[2], "rb") as f:
        got = f.read()
    if got == want:
        print(f"{len(got)} bytes equal")
        return 0
    i = next((k for k in range(min(len(got), len(want))) if got[k] != want[k]),
             min(len(got), len(want)))
    print(f"{len(got)} bytes, expected {len(want)}; first difference at byte {i}")
    print(f"  got    {got[max(0, i - 10):i + 10]!r}")
    print(f"  wanted {want[max(0, i - 10):i + 10]!r}")
    return 1


def write_bin(path, ids, vocab_size):
    version, fmt = (1, "H") if vocab_size <= 65536 else (2, "I")
    header = struct.pack("<3i", 20240520, version, len(ids)) + bytes(1012)
    with open(path, "wb") as f:
        f.write(header + struct.pack("<%d%s" % (len(ids), fmt), *ids))


def random_ids(argv):
    tok = load(argv[0])
    n = int(argv[2])
    vocab = tok.get_vocab(with_added_tokens=True)
    ids = sorted(vocab.values())
    sy = byte_symbols()
    high = [vocab[sy[b]] for b in range(0x80, 0x100)]
    rng = random.Random(5)
    out = [rng.choice(high) if rng.random() < 0.7 else rng.choice(ids) for _ in range(n)]
    write_bin(argv[1], out, ids[-1] + 1)
    return 0


def bench(argv):
    """Three ways to run `tokenizers` on TEXT: one encode of the whole text,
    one encode per line, encode_batch of the lines (threads as the
    environment's TOKENIZERS_PARALLELISM allows); median of 5 after a warm-up."""
    tok = load(argv[0])
    with open(argv[1], encoding="utf-8", newline="") as f:
        text = f.read()
    lines = text.splitlines(keepends=True)
    ways = {
        "encode(whole text)": lambda: [tok.encode(text, add_special_tokens=False)],
        "encode(line) per line": lambda: [tok.encode(l, add_special_tokens=False) for l in lines],
        "encode_batch(lines)": lambda: tok.encode_batch(lines, add_special_tokens=False),
    }
    for name, run in ways.items():
        n = sum(len(e.ids) for e in run())
        times = []
        for _ in range(5):
            t0 = time.perf_counter()
            run()
            times.append(time.perf_counter() - t0)
        t = sorted(times)[2]
        print(f"{name}: {n} tokens in {t:.3f} s: {n / t / 1e6:.2f} M tokens/s")
    return 0


def encode_special(argv):
    """encode-special TOKENIZER TEXT: Tokenizer.encode(TEXT).ids (with the
    post-processor's special tokens), on one line."""
    print(" ".join(str(i) for i in load(argv[0]).encode(argv[1]).ids))


def main():
    cmd, argv = sys.argv[1], sys.argv[2:]
    if cmd == "tiny":
        return tiny(argv)
    return {"train": train, "check-encode": check_encode, "check-decode": check_decode,
            "random-ids": random_ids, "bench": bench, "encode-special": encode_special}[cmd](argv)


if __name__ == "__main__":
    sys.exit(main() or 0)
