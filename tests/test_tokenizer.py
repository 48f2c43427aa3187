"""Offline CLIP tokenizer: vocabulary rebuilt from the merges file, ids checked against an independent BPE."""

from __future__ import annotations

import csv
import gzip
import html
import json
from pathlib import Path

import ftfy
import pytest
import regex
import torch
from conftest import SHARED_DATA

from tvr.data.tokenizer import (
    ClipTokenizer,
    TokenizerError,
    build_clip_tokenizer_files,
    build_tiny_tokenizer_files,
    read_clip_merges,
)

BPE_GZ = SHARED_DATA / "clip_bpe" / "bpe_simple_vocab_16e6.txt.gz"

SENTENCES = [
    "a dog is running on the beach.",
    "A man's guitar-solo, LIVE!! (2019) -- isn't it great?",
    "Café naïve façade: 3½ über-cool ideas 😀🎸 &amp; more&lt;3",
    "   tabs\tand\nnewlines   collapse ",
    "日本語のテキストと中文",
    "it’s “quoted” — em-dash…",
    "the quick brown fox jumps over the lazy dog 1234567890",
]


class ReferenceBPE:
    """An independent, deliberately plain re-statement of OpenAI CLIP's SimpleTokenizer (test oracle only)."""

    def __init__(self, merge_lines: list[str]) -> None:
        # byte -> printable character: visible Latin-1 bytes map to themselves, the rest to 256, 257, ...
        self.byte_char: dict[int, str] = {}
        visible = [b for b in range(256) if 33 <= b <= 126 or 161 <= b <= 172 or 174 <= b <= 255]
        for b in visible:
            self.byte_char[b] = chr(b)
        n = 0
        for b in range(256):
            if b not in self.byte_char:
                self.byte_char[b] = chr(256 + n)
                n += 1
        order = visible + [b for b in range(256) if b not in visible]
        merges = [tuple(m.split()) for m in merge_lines]
        tokens = [self.byte_char[b] for b in order]
        tokens += [t + "</w>" for t in tokens]
        tokens += ["".join(m) for m in merges]
        tokens += ["<|startoftext|>", "<|endoftext|>"]
        self.encoder = {t: i for i, t in enumerate(tokens)}
        self.rank = {m: i for i, m in enumerate(merges)}
        self.pat = regex.compile(
            r"""<\|startoftext\|>|<\|endoftext\|>|'s|'t|'re|'ve|'m|'ll|'d|[\p{L}]+|[\p{N}]|[^\s\p{L}\p{N}]+""",
            regex.IGNORECASE,
        )

    def bpe(self, token: str) -> list[str]:
        word = list(token[:-1]) + [token[-1] + "</w>"]
        while True:
            pairs = {(word[i], word[i + 1]) for i in range(len(word) - 1)}
            ranked = [p for p in pairs if p in self.rank]
            if not ranked:
                return word
            first, second = min(ranked, key=lambda p: self.rank[p])
            new_word: list[str] = []
            i = 0
            while i < len(word):
                try:
                    j = word.index(first, i)
                except ValueError:
                    new_word.extend(word[i:])
                    break
                new_word.extend(word[i:j])
                i = j
                if word[i] == first and i < len(word) - 1 and word[i + 1] == second:
                    new_word.append(first + second)
                    i += 2
                else:
                    new_word.append(word[i])
                    i += 1
            word = new_word
            if len(word) == 1:
                return word

    def encode(self, text: str) -> list[int]:
        text = html.unescape(html.unescape(ftfy.fix_text(text))).strip()
        text = regex.sub(r"\s+", " ", text).strip().lower()
        ids: list[int] = []
        for token in regex.findall(self.pat, text):
            if token in ("<|startoftext|>", "<|endoftext|>"):
                ids.append(self.encoder[token])
                continue
            mapped = "".join(self.byte_char[b] for b in token.encode("utf-8"))
            ids.extend(self.encoder[t] for t in self.bpe(mapped))
        return ids


@pytest.fixture(scope="module")
def clip_files(tmp_path_factory) -> Path:
    if not BPE_GZ.is_file():
        pytest.skip(f"CLIP merges file not found: {BPE_GZ}")
    return build_clip_tokenizer_files(BPE_GZ, tmp_path_factory.mktemp("clip_tok"))


@pytest.fixture(scope="module")
def clip_tok(clip_files) -> ClipTokenizer:
    return ClipTokenizer.from_dir(clip_files)


@pytest.fixture(scope="module")
def reference() -> ReferenceBPE:
    if not BPE_GZ.is_file():
        pytest.skip(f"CLIP merges file not found: {BPE_GZ}")
    lines = gzip.open(BPE_GZ, "rt", encoding="utf-8").read().split("\n")
    return ReferenceBPE(lines[1 : 49152 - 256 - 2 + 1])


def test_full_vocabulary_from_merges(clip_files, clip_tok):
    vocab = json.loads((clip_files / "vocab.json").read_text(encoding="utf-8"))
    merges = (clip_files / "merges.txt").read_text(encoding="utf-8").split("\n")
    assert len(vocab) == 49408 and sorted(vocab.values()) == list(range(49408))
    assert merges[0] == "#version: 0.2" and len([m for m in merges[1:] if m]) == 48894
    assert (vocab["!"], vocab["!</w>"], vocab["a</w>"]) == (0, 256, 320)
    assert (vocab["<|startoftext|>"], vocab["<|endoftext|>"]) == (49406, 49407)
    assert (clip_tok.sot_id, clip_tok.eot_id, clip_tok.vocab_size) == (49406, 49407, 49408)
    assert clip_tok.backend == "hf"
    assert not list(clip_files.glob(".*.tmp"))  # atomic writes leave no temp files


def test_known_openai_ids(clip_tok):
    # ids printed by OpenAI's clip.tokenize for the README examples
    assert clip_tok.encode("a diagram") == [320, 22697]
    assert clip_tok.encode("a dog") == [320, 1929]
    assert clip_tok.encode("a cat") == [320, 2368]
    assert clip_tok.encode("A photo of a dog") == [320, 1125, 539, 320, 1929]


def test_matches_independent_bpe(clip_tok, reference):
    for text in SENTENCES:
        assert clip_tok.encode(text) == reference.encode(text), text
    assert clip_tok.encode(SENTENCES[0]) == [320, 1929, 533, 2761, 525, 518, 2117, 269]


def test_matches_independent_bpe_on_real_captions(clip_tok, reference):
    path = SHARED_DATA / "msrvtt" / "MSRVTT_JSFUSION_test.csv"
    if not path.is_file():
        pytest.skip(f"not found: {path}")
    with path.open(newline="", encoding="utf-8") as handle:
        texts = [row["sentence"] for row in csv.DictReader(handle)][:400]
    assert clip_tok.encode_batch(texts) == [reference.encode(t) for t in texts]


def test_python_backend_agrees_with_hf(clip_files, clip_tok):
    python = ClipTokenizer.from_dir(clip_files, backend="python")
    assert python.backend == "python"
    assert [python.encode(t) for t in SENTENCES] == [clip_tok.encode(t) for t in SENTENCES]


def test_call_builds_padded_ids_and_mask(clip_tok):
    ids, mask = clip_tok(["a dog", "a dog is running on the beach.", ""], max_words=6)
    assert ids.dtype == mask.dtype == torch.long and ids.shape == mask.shape == (3, 6)
    assert ids.tolist() == [
        [49406, 320, 1929, 49407, 0, 0],
        [49406, 320, 1929, 533, 2761, 49407],  # truncated to max_words - 2 tokens
        [49406, 49407, 0, 0, 0, 0],
    ]
    assert mask.tolist() == [[1, 1, 1, 1, 0, 0], [1] * 6, [1, 1, 0, 0, 0, 0]]
    assert (ids.argmax(dim=1) == mask.sum(dim=1) - 1).all()  # EOT is the largest id
    with pytest.raises(ValueError, match="max_words"):
        clip_tok(["x"], max_words=1)
    with pytest.raises(TypeError):
        clip_tok("a dog", max_words=8)


def test_tiny_tokenizer_without_data(tmp_path):
    a = build_tiny_tokenizer_files(tmp_path / "a", num_merges=200)
    b = build_tiny_tokenizer_files(tmp_path / "b", num_merges=200)
    assert (a / "vocab.json").read_bytes() == (b / "vocab.json").read_bytes()  # deterministic
    tok = ClipTokenizer.from_dir(a)
    assert tok.vocab_size == 512 + 200 + 2 and tok.eot_id == tok.vocab_size - 1 and tok.sot_id == tok.eot_id - 1
    merges = (a / "merges.txt").read_text().split("\n")
    assert merges[0] == "#version: 0.2"
    ref = ReferenceBPE([m for m in merges[1:] if m])
    for text in SENTENCES:
        assert tok.encode(text) == ref.encode(text)
    assert tok.decode(tok.encode("A man is playing guitar.")) == "a man is playing guitar ."
    assert len(tok.encode("playing")) < len("playing")  # merges were learned

    bytes_only = ClipTokenizer.from_dir(build_tiny_tokenizer_files(tmp_path / "c", num_merges=0))
    assert bytes_only.vocab_size == 514
    assert bytes_only.encode("ab") == [ord("a") - 33, 256 + ord("b") - 33]


def test_save_roundtrip_and_tokenizer_json(tmp_path):
    tok = ClipTokenizer.from_dir(build_tiny_tokenizer_files(tmp_path / "src", num_merges=50))
    again = ClipTokenizer.from_dir(tok.save(tmp_path / "copy"))
    assert again.vocab == tok.vocab and again.merges == tok.merges
    # an HF checkpoint folder may carry only tokenizer.json
    only_json = tmp_path / "hf"
    only_json.mkdir()
    tok._hf.save(str(only_json / "tokenizer.json"))
    from_json = ClipTokenizer.from_dir(only_json)
    assert from_json.vocab == tok.vocab and [from_json.encode(t) for t in SENTENCES] == [
        tok.encode(t) for t in SENTENCES
    ]


def test_bad_files(tmp_path):
    bad = tmp_path / "bpe.txt.gz"
    with gzip.open(bad, "wt", encoding="utf-8") as handle:
        handle.write("header\ni n\nt h e\n")
    with pytest.raises(TokenizerError, match=r"line 3: expected a merge"):
        read_clip_merges(bad, num_merges=2)
    with pytest.raises(TokenizerError, match="expected at least 5 merge lines"):
        read_clip_merges(bad, num_merges=5)
    with pytest.raises(TokenizerError, match="no tokenizer files"):
        ClipTokenizer.from_dir(tmp_path)
    folder = build_tiny_tokenizer_files(tmp_path / "t", num_merges=5)
    (folder / "vocab.json").write_text('{\n"a": 1,\n')
    with pytest.raises(TokenizerError, match=r"vocab\.json line 3: not valid JSON"):
        ClipTokenizer.from_dir(folder)


def _simple_bpe(parts: list[str], ranks: dict) -> list[str]:
    """CLIP's loop, as written in its SimpleTokenizer: merge every occurrence of the lowest-ranked pair, repeat."""
    word = list(parts)
    while len(word) > 1:
        pairs = [p for p in zip(word, word[1:], strict=False) if p in ranks]
        if not pairs:
            break
        first, second = min(pairs, key=ranks.__getitem__)
        merged, i = [], 0
        while i < len(word):
            if i + 1 < len(word) and word[i] == first and word[i + 1] == second:
                merged.append(first + second)
                i += 2
            else:
                merged.append(word[i])
                i += 1
        word = merged
    return word


def test_long_word_merging_equals_clips_loop() -> None:
    from tvr.data.tokenizer import _merge_long_word, learn_bpe_merges

    rng = __import__("random").Random(0)
    words = ["".join(rng.choice("aab") for _ in range(rng.randint(1, 12))) for _ in range(300)]
    merges = learn_bpe_merges(words, 40)
    ranks = {pair: r for r, pair in enumerate(merges)}
    # arbitrary rank orders too (a later merge ranked below the one that makes its part)
    shuffled = dict(zip(list(ranks), rng.sample(range(len(ranks)), len(ranks)), strict=True))
    for table in (ranks, shuffled):
        for length in (2, 3, 5, 65, 200, 700):
            for _ in range(20):
                word = [rng.choice("ab") for _ in range(length)] if length < 700 else ["a"] * length
                word[-1] += "</w>"
                assert _merge_long_word(word, table) == _simple_bpe(word, table), (length, word[:20])


def test_check_data_bounds_the_work_on_a_megabyte_word(monkeypatch) -> None:
    from tvr.data import tokenizer as tokenizer_module

    tok = ClipTokenizer.from_dir(build_tiny_tokenizer_files(Path(__import__("tempfile").mkdtemp())), backend="python")
    huge = "a" + "bcdefghij" * 120_000  # one 1 MB "word"
    seen: list[int] = []
    word_ids = tok._python._word_ids
    monkeypatch.setattr(tok._python, "_word_ids", lambda w: seen.append(len(w)) or word_ids(w))
    counts, bounded = tok.count_tokens_checked(["a dog runs", f"x {huge} y", "the cat"])
    assert bounded == [1]
    assert max(seen) <= tokenizer_module.MAX_COUNTED_WORD_BYTES  # BPE never ran on the 1 MB word
    longest = max(len(t.removesuffix("</w>")) for t in tok.vocab)
    assert counts[0] == len(tok.encode("a dog runs")) and counts[2] == len(tok.encode("the cat"))
    assert counts[1] == 2 + -(-len(huge) // longest)
    # the exact path for long words (below the bound) agrees with encode
    word = "bcdefghij" * 500
    assert tok.count_tokens([word]) == [len(tok.encode(word))]
