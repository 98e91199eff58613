"""The special-token ids of fsdpc-ckpt export-hf against transformers 4.38.

Subcommands:
  make DIR [--eos-list]
      a random-weight LlamaForCausalLM (vocabulary 264) saved with
      save_pretrained, bos_token_id 260 and eos_token_id 261 in config.json and
      generation_config.json; with --eos-list generation_config.json's
      eos_token_id is [261, 262] and config.json's 5.
  ids DIR BOS EOS
      config.json and generation_config.json both hold exactly these ids
      ("none": the key is absent, or the file).
  generate DIR N
      greedy generate() of N new tokens after one prompt token, with a logits
      processor that makes token 2 the likeliest every time (an ordinary
      token of the caller's tokenizer that the model keeps producing): prints
      how many new tokens came, exits 1 when fewer than N.
"""
import json
import os
import sys


def make(argv):
    import torch
    import transformers as t
    out = argv[0]
    torch.manual_seed(0)
    cfg = t.LlamaConfig(vocab_size=264, hidden_size=64, intermediate_size=96,
                        num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                        max_position_embeddings=128, tie_word_embeddings=False,
                        bos_token_id=260, eos_token_id=261)
    t.LlamaForCausalLM(cfg).save_pretrained(out, safe_serialization=True)
    if "--eos-list" in argv:
        path = os.path.join(out, "generation_config.json")
        with open(path) as f:
            g = json.load(f)
        g["eos_token_id"] = [261, 262]
        with open(path, "w") as f:
            json.dump(g, f)
        path = os.path.join(out, "config.json")
        with open(path) as f:
            c = json.load(f)
        c["eos_token_id"] = 5
        with open(path, "w") as f:
            json.dump(c, f)


def ids(argv):
    d, want = argv[0], {"bos_token_id": argv[1], "eos_token_id": argv[2]}
    bad = []
    for name in ("config.json", "generation_config.json"):
        path = os.path.join(d, name)
        got = {}
        if os.path.exists(path):
            with open(path) as f:
                got = json.load(f)
        for k, v in want.items():
            g = str(got[k]) if k in got else "none"
            if g != v:
                bad.append("%s: %s is %s, not %s" % (name, k, g, v))
    print("; ".join(bad) if bad else "both files: bos %s, eos %s" % (argv[1], argv[2]))
    return 1 if bad else 0


def generate(argv):
    import torch
    import transformers as t

    class Force2(t.LogitsProcessor):
        def __call__(self, input_ids, scores):
            scores[:, 2] = scores.max() + 100.0
            return scores

    d, n = argv[0], int(argv[1])
    m = t.AutoModelForCausalLM.from_pretrained(d)
    x = torch.tensor([[65]])
    y = m.generate(x, max_new_tokens=n, do_sample=False, pad_token_id=0,
                   logits_processor=t.LogitsProcessorList([Force2()]))
    got = y.shape[1] - 1
    print("%d of %d new tokens" % (got, n))
    return 0 if got == n else 1


def main():
    cmd, argv = sys.argv[1], sys.argv[2:]
    return {"make": make, "ids": ids, "generate": generate}[cmd](argv) or 0


if __name__ == "__main__":
    sys.exit(main())
