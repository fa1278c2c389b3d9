r"""Hugging Face `tokenizers` as the reference of mixtrain's C++ BPE tokenizer (data/bpe_tokenizer).

Run by the C++ tests (unit_data_bpe_tokenizer_test, tools_data_prepare_test) and
bench/data_prepare.cpp through MIXTRAIN_PYTHON; not named *_oracle.py, which CMake would run as a
test of its own.

  make OUT_DIR      trains byte-level BPE tokenizers with tokenizers' BpeTrainer on a generated
                    multilingual corpus (no download): qwen2 (Qwen2's Split regex), llama3
                    (Llama-3's regex, ignore_merges), gpt2 (ByteLevel use_regex), qwen2_str (qwen2
                    with "a b" string merges), regex_features (qwen2 behind Splits using \h \v ^
                    $ \s \S and a Removed String), llama3_empty_normalizer (an empty
                    normalizer Sequence), qwen2_nfc (normalizer NFC), big (qwen2 padded past 65536 ids, for uint32
                    shards); writes OUT_DIR/<name>.json and OUT_DIR/cases.json: for every
                    tokenizer and test text (bytes, hex), the ids HF gives for
                    bytes.decode("utf-8", errors="replace") and that decoded text (hex).
  nfc OUT           writes OUT (JSON): random strings rich in combining marks, Hangul jamo and
                    precomposed letters, with Python's unicodedata NFC of each (hex).
  encode TOK DOCS OUT
                    DOCS: JSON list of hex byte strings; OUT: JSON list of HF's id lists.
  bench TOK CORPUS  prints JSON {"mb_per_s": ..., "fast_mb_per_s": ...}: HF encoding CORPUS
                    (.jsonl, field "text") with encode_batch and with encode_batch_fast (no
                    offsets) on one thread (RAYON_NUM_THREADS=1, TOKENIZERS_PARALLELISM false),
                    best of 3 calls each.
  corpus N_BYTES OUT fragments|novel
                    writes a generated .jsonl corpus of about N_BYTES, one document per line:
                    the test's fragments (words repeat: a word cache hits) or novel words (random
                    syllables and CJK ideographs: it mostly misses).
"""

import json
import os
import random
import sys
import time
import unicodedata

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("RAYON_NUM_THREADS", "1")

from tokenizers import AddedToken, Regex, Tokenizer, models, pre_tokenizers, trainers  # noqa: E402

QWEN2_REGEX = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
               r"|\s*[\r\n]+|\s+(?!\S)|\s+")
LLAMA3_REGEX = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
                r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")

SPECIAL = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]

# Fragments the corpus and the test texts are made of.
FRAGMENTS = [
    "The quick brown fox jumps over the lazy dog.", "I don't think it's THAT'LL work, we've tried.",
    "She'S here; THEY'RE gone. I'm sure you'd know.", "Hello, world!", "hello world",
    "今天天气很好，我们去公园散步。", "東京は日本の首都です。", "カタカナとひらがな、漢字。",
    "안녕하세요 세계, 반갑습니다.", "Привет, мир! Как дела?", "Γειά σου Κόσμε",
    "مرحبا بالعالم ٣٤٥", "שלום עולם", "नमस्ते दुनिया, आप कैसे हैं?", "สวัสดีชาวโลก",
    "café naïve Ångström", "cafe\u0301 e\u0300\u0301 n\u0303o", "ß straße ﬁ ﬂ",
    "👍 👍🏽 👨‍👩‍👧‍👦 🏳️‍🌈 🇯🇵🇫🇷 ❤️ 🧑🏿‍💻", "😀😃😄😁",
    "def square(x):\n\treturn x ** 2  # square\n", "for (int i = 0; i < n; ++i) {\r\n    a[i] += b[i];\r\n}",
    "if a != b and c >= d:\n        pass\n\n\n", "x=1;y=2;z=x+y", "{\"key\": [1, 2.5, -3e10, null]}",
    "1234567890", "3.14159", "1,000,000", "2026-12-02 05:00:00", "² ³ ½ Ⅻ ⅷ", "０１２３",
    "a    b\t\t c", "\n\n\n", "   ", "\t", " \u00a0 \u3000 \u2028 \u0085 ", "zero\u200bwidth",
    "mongolian\u180eseparator", "https://example.com/path?q=1&r=2#frag", "e-mail: a.b@c.de",
    "!!!???...", "--- *** ___", "'s 's 'S 'll 'LL", "ſ ﬅ K", "It'ſ THE'LL", "\u180e[=\u180e",
    "\x0b\x0c\x1c\x1d\x1e\x1f \u2029 \ufeff", "deadBEEF cafe 0x1f\nline\n",
]

ADDED_IN_TEXT = [
    "<|im_start|>user\nhi there<|im_end|>\n", "<|endoftext|><|endoftext|>", "<think>x</think>",
    "<|im partial", "<|im_start no end", "a<|endoftext|>b", "tool call here", "<think><|im",
    "café! cafe\u0301! Cafe\u0301!",
    "\u212b \u0958 a\u0302\u0323 a\u0323\u0302 \u1100\u1161\u11a8 \uac00\u11a8",
    "\u0344 \u0f73 \u1e9b\u0323 q\u0307\u0323 \u0061\u0328\u0301 \u00c5\u0301 \u2126 \u0387",
]

INVALID = [
    b"abc\xff\xfe def", b"\xc3\x28 paren", b"\xe2\x82 cut", b"\xed\xa0\x80 surrogate",
    b"\xf4\x90\x80\x80 too big", b"\xc0\xaf overlong", b"hello\xe2\x82", b"\xf0\x9f\x98x",
    b"\x80\x80\x80", b"mixed \xe4\xbd\xa0\xe5\xa5 \xf0\x9f\x91\x8d\xff end", b"\xe0\x80\x80",
    b"\xef\xbf\xbd literal replacement char",
]


def corpus(rng, n_docs, min_frags=3, max_frags=12):
    docs = []
    for _ in range(n_docs):
        parts = []
        for _ in range(rng.randint(min_frags, max_frags)):
            parts.append(rng.choice(FRAGMENTS))
            parts.append(rng.choice([" ", "\n", "  ", "\n\n", "\t", "", ". "]))
        docs.append("".join(parts))
    return docs


def build(regex, use_split, vocab_size, seed, ignore_merges=False):
    tok = Tokenizer(models.BPE())
    byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=not use_split)
    if use_split:
        tok.pre_tokenizer = pre_tokenizers.Sequence(
            [pre_tokenizers.Split(Regex(regex), behavior="isolated", invert=False), byte_level])
    else:
        tok.pre_tokenizer = byte_level
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=SPECIAL,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)
    tok.train_from_iterator(corpus(random.Random(seed), 3000), trainer)
    tok.add_tokens([AddedToken("<think>", normalized=False, special=False),
                    AddedToken("</think>", normalized=False, special=False),
                    AddedToken("<|im", normalized=True, special=False),
                    AddedToken("tool call", normalized=True, special=False),
                    AddedToken("cafe\u0301!", normalized=True, special=False)])
    j = json.loads(tok.to_str())
    if ignore_merges:
        j["model"]["ignore_merges"] = True
    return j


def test_texts():
    rng = random.Random(7)
    texts = [f.encode() for f in FRAGMENTS + ADDED_IN_TEXT] + INVALID
    texts += [d.encode() for d in corpus(rng, 60, 1, 20)]
    texts += [" " * 1000 + "x", "a" * 3000, "\n" * 300, "日本" * 400, "", " "]
    # Random code points, weighted to ASCII and to the whitespace characters the regex engines
    # could disagree on; some astral and unassigned.
    spaces = [0x9, 0xA, 0xB, 0xC, 0xD, 0x20, 0x85, 0xA0, 0x1680, 0x180E, 0x2000, 0x200A, 0x200B,
              0x2028, 0x2029, 0x202F, 0x205F, 0x3000, 0xFEFF, 0x1C, 0x1D, 0x1E, 0x1F]
    for _ in range(400):
        cps = []
        for _ in range(rng.randint(1, 30)):
            r = rng.random()
            cp = (rng.randint(0x20, 0x7E) if r < 0.3 else rng.choice(spaces) if r < 0.45
                  else rng.randint(0x80, 0xFFFF) if r < 0.85 else rng.randint(0x10000, 0x10FFFF))
            cps.append(chr(0x41 if 0xD800 <= cp <= 0xDFFF else cp))
        texts.append("".join(cps))
    texts = [t if isinstance(t, bytes) else t.encode() for t in texts]
    # Random byte soup: fragments cut at random byte offsets and glued (invalid UTF-8 mid-text).
    for _ in range(40):
        blob = b"".join(rng.choice(FRAGMENTS).encode() for _ in range(4))
        cut = rng.randrange(len(blob))
        texts.append(blob[:cut] + bytes([rng.randrange(256)]) + blob[cut + rng.randint(0, 3):])
    return texts


def make(out_dir):
    os.makedirs(out_dir, exist_ok=True)
    specs = {
        "qwen2": build(QWEN2_REGEX, True, 1200, 1),
        "llama3": build(LLAMA3_REGEX, True, 1200, 2, ignore_merges=True),
        "gpt2": build(None, False, 900, 3),
    }
    s = json.loads(json.dumps(specs["qwen2"]))
    s["model"]["merges"] = [" ".join(m) for m in s["model"]["merges"]]
    specs["qwen2_str"] = s
    # Regex constructs whose Oniguruma (Ruby syntax) meaning PCRE2 must be told: \h (hex digit),
    # \v (VT), ^ and $ (line anchors), \s and \S; a String pattern with Removed.
    s = json.loads(json.dumps(specs["qwen2"]))
    steps = s["pre_tokenizer"]["pretokenizers"]
    s["pre_tokenizer"]["pretokenizers"] = [
        {"type": "Split", "pattern": {"String": "\n\n"}, "behavior": "Removed", "invert": False},
        {"type": "Split", "pattern": {"Regex": r"^\h+|\v|[\h\s]x|\S+$|[^\s]{7}"},
         "behavior": "Isolated", "invert": False}] + steps
    specs["regex_features"] = s
    s = json.loads(json.dumps(specs["llama3"]))
    s["normalizer"] = {"type": "Sequence", "normalizers": []}  # a no-op normalizer
    specs["llama3_empty_normalizer"] = s
    s = json.loads(json.dumps(specs["qwen2"]))
    s["normalizer"] = {"type": "NFC"}  # as Qwen2's own tokenizer.json
    specs["qwen2_nfc"] = s
    big = json.loads(json.dumps(specs["qwen2"]))
    n = max(big["model"]["vocab"].values()) + 1
    n = max([n] + [t["id"] + 1 for t in big["added_tokens"]])
    for i in range(66000):  # unreachable: no merge makes them, no word is one (ignore_merges off)
        big["model"]["vocab"][f"<unused_{i}>"] = n + i
    big["added_tokens"].append({"id": n + 66000, "content": "<|big_eos|>", "single_word": False,
                                "lstrip": False, "rstrip": False, "normalized": False,
                                "special": True})
    specs["big"] = big
    # Added-token ids after the padding: the ones HF assigns when it loads the file.
    cases = []
    texts = test_texts()
    for name, spec in specs.items():
        path = os.path.join(out_dir, name + ".json")
        with open(path, "w", encoding="utf-8") as f:
            json.dump(spec, f, ensure_ascii=False)
        tok = Tokenizer.from_file(path)
        if name == "big":
            assert tok.token_to_id("<|big_eos|>") == n + 66000, tok.token_to_id("<|big_eos|>")
        for t in texts:
            text = t.decode("utf-8", errors="replace")
            ids = tok.encode(text, add_special_tokens=False).ids
            cases.append({"tokenizer": name, "hex": t.hex(), "decoded_hex": text.encode().hex(),
                          "ids": ids})
    with open(os.path.join(out_dir, "cases.json"), "w") as f:
        json.dump({"cases": cases}, f)


def nfc_cases(out_path):
    """Random strings rich in what NFC changes, and Python's unicodedata NFC of each."""
    rng = random.Random(13)
    pools = [range(0x41, 0x7B), range(0xC0, 0x180), range(0x300, 0x370), range(0x1100, 0x1113),
             range(0x1161, 0x1176), range(0x11A8, 0x11C3), range(0xAC00, 0xAC40),
             range(0x900, 0x980), range(0xF40, 0xFC0), range(0x1E00, 0x1F00), range(0x1F00, 0x2000),
             range(0x2120, 0x2130), range(0x3099, 0x309B), range(0x304B, 0x3060),
             range(0x1D15E, 0x1D165), range(0x10000, 0x10100), range(0x11099, 0x110B0)]
    cases = []
    for _ in range(3000):
        text = "".join(chr(rng.choice(rng.choice(pools))) for _ in range(rng.randint(1, 12)))
        cases.append({"hex": text.encode().hex(),
                      "nfc_hex": unicodedata.normalize("NFC", text).encode().hex()})
    with open(out_path, "w") as f:
        json.dump({"unicode": unicodedata.unidata_version, "cases": cases}, f)


def encode(tok_path, docs_path, out_path):
    tok = Tokenizer.from_file(tok_path)
    with open(docs_path) as f:
        docs = [bytes.fromhex(h).decode("utf-8", errors="replace") for h in json.load(f)]
    ids = [tok.encode(d, add_special_tokens=False).ids for d in docs]
    with open(out_path, "w") as f:
        json.dump(ids, f)


SYLLABLES = ("ka to ri mo an el us ver sch str ing tion pre con dis ment able ous qu ph th ch "
             "ка то ри мо ан ел ус ов ск ств ни про за ся ого ать").split()


def novel_document(rng):
    """Words nobody repeats: 1-4 random syllables (Latin, Cyrillic) or 1-3 random CJK
    ideographs, with digits and punctuation: most words miss a tokenizer's word cache."""
    words = []
    for _ in range(rng.randint(20, 200)):
        r = rng.random()
        if r < 0.7:
            words.append("".join(rng.choice(SYLLABLES) for _ in range(rng.randint(1, 4))))
        elif r < 0.85:
            words.append("".join(chr(rng.randint(0x4E00, 0x9FFF)) for _ in range(rng.randint(1, 3))))
        else:
            words.append(rng.choice([str(rng.randint(0, 99999)), ",", ".", "!", "(x)", "--"]))
    return " ".join(words)


def write_corpus(n_bytes, out_path, kind):
    rng = random.Random(11)
    size = 0
    with open(out_path, "w", encoding="utf-8") as f:
        while size < n_bytes:
            if kind == "fragments":
                doc = corpus(rng, 1, 5, 40)[0]
            else:
                doc = novel_document(rng)
            line = json.dumps({"text": doc}, ensure_ascii=False) + "\n"
            f.write(line)
            size += len(line.encode())


def bench(tok_path, corpus_path):
    tok = Tokenizer.from_file(tok_path)
    with open(corpus_path, encoding="utf-8") as f:
        docs = [json.loads(line)["text"] for line in f]
    n_bytes = sum(len(d.encode()) for d in docs)
    result = {"bytes": n_bytes}
    # encode_batch (ids, offsets, masks) and encode_batch_fast (no offsets): best of 3 each.
    for key, encode in (("", tok.encode_batch), ("fast_", tok.encode_batch_fast)):
        best = None
        for _ in range(3):
            start = time.perf_counter()
            out = encode(docs, add_special_tokens=False)
            elapsed = time.perf_counter() - start
            best = elapsed if best is None else min(best, elapsed)
        result[key + "tokens"] = sum(len(e.ids) for e in out)
        result[key + "seconds"] = best
        result[key + "mb_per_s"] = n_bytes / best / 1e6
    print(json.dumps(result))


def main(argv):
    if len(argv) >= 2 and argv[1] == "make" and len(argv) == 3:
        make(argv[2])
    elif len(argv) == 5 and argv[1] == "encode":
        encode(argv[2], argv[3], argv[4])
    elif len(argv) == 3 and argv[1] == "nfc":
        nfc_cases(argv[2])
    elif len(argv) == 4 and argv[1] == "bench":
        bench(argv[2], argv[3])
    elif len(argv) == 5 and argv[1] == "corpus" and argv[4] in ("fragments", "novel"):
        write_corpus(int(argv[2]), argv[3], argv[4])
    else:
        sys.exit(__doc__)


if __name__ == "__main__":
    main(sys.argv)
