"""CLIP's byte-level BPE tokenizer, built and run fully offline.

CLIP's vocabulary is a pure function of its merges file: the 256 byte symbols, the same 256 with the end-of-word
marker ``</w>``, one token per merge (in merge order), then ``<|startoftext|>`` and ``<|endoftext|>``. With the
first 48,894 merges of ``bpe_simple_vocab_16e6.txt.gz`` that is 49,408 tokens, so the HF-format files
(``vocab.json`` + ``merges.txt``) can be rebuilt from the merges file alone and nothing is ever downloaded.

Encoding follows OpenAI's ``SimpleTokenizer``: ftfy repair, HTML unescape (twice), whitespace collapse, lowercase,
split with CLIP's word regex, map each word's UTF-8 bytes to the byte symbols, apply the merges by rank. The BPE
itself runs in HF ``tokenizers`` (via ``transformers.CLIPTokenizer``) when that is usable; a small pure-Python
implementation of the same algorithm is the fallback and the cross-check.
"""

from __future__ import annotations

import gzip
import html
import json
import os
import re
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import torch
from torch import Tensor

from tvr.config import ConfigError
from tvr.utils.data_files import DataFileError, parse_json, read_json
from tvr.utils.errors import UserError
from tvr.utils.io import atomic_write_text

SOT_TOKEN = "<|startoftext|>"
EOT_TOKEN = "<|endoftext|>"
END_OF_WORD = "</w>"
#: merges CLIP uses: 49,408 = 2·256 byte tokens + 48,894 merges + 2 special tokens
CLIP_NUM_MERGES = 48894
MERGES_HEADER = "#version: 0.2"
#: the folder of a job's work folder (run folder, feature cache) a tokenizer built from a BPE merges file goes to
TOKENIZER_FOLDER = "tokenizer"

# CLIP's pre-tokenisation regex (special tokens, English contractions, letter runs, single digits, other runs).
_WORD_PATTERN = r"""<\|startoftext\|>|<\|endoftext\|>|'s|'t|'re|'ve|'m|'ll|'d|[\p{L}]+|[\p{N}]|[^\s\p{L}\p{N}]+"""


class TokenizerError(UserError, ValueError):
    """Tokenizer files are missing or do not have the expected format."""


@lru_cache(maxsize=1)
def byte_symbols() -> tuple[str, ...]:
    """The printable stand-in character for each byte value 0..255 (GPT-2/CLIP convention).

    Bytes that are already visible Latin-1 characters stand for themselves; the others (control characters,
    space, a few Latin-1 gaps) are moved to code points 256, 257, ... in byte order, so every byte string becomes
    a string of visible characters that BPE can work on.
    """
    visible = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    visible_set = set(visible)
    table: dict[int, str] = {b: chr(b) for b in visible}
    extra = 0
    for b in range(256):
        if b not in visible_set:
            table[b] = chr(256 + extra)
            extra += 1
    return tuple(table[b] for b in range(256))


def base_vocabulary() -> list[str]:
    """The 256 byte symbols in CLIP's order (visible bytes first, then the relocated ones)."""
    visible = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    rest = [b for b in range(256) if b not in set(visible)]
    symbols = byte_symbols()
    return [symbols[b] for b in [*visible, *rest]]


def vocabulary_from_merges(merges: Sequence[tuple[str, str]]) -> list[str]:
    """CLIP's token list for a merge list: bytes, bytes + ``</w>``, one token per merge, SOT, EOT."""
    base = base_vocabulary()
    tokens = base + [s + END_OF_WORD for s in base] + [a + b for a, b in merges] + [SOT_TOKEN, EOT_TOKEN]
    if len(set(tokens)) != len(tokens):
        seen: set[str] = set()
        dup = next(t for t in tokens if t in seen or seen.add(t))
        raise TokenizerError(f"merge list produces the token {dup!r} twice; merges must create distinct tokens")
    return tokens


def read_clip_merges(bpe_gz_path: str | os.PathLike, num_merges: int = CLIP_NUM_MERGES) -> list[tuple[str, str]]:
    """The first ``num_merges`` merges of CLIP's ``bpe_simple_vocab_16e6.txt.gz`` (its first line is a header)."""
    path = Path(bpe_gz_path)
    if not path.is_file():
        raise TokenizerError(f"{path}: BPE merges file not found (expected CLIP's bpe_simple_vocab_16e6.txt.gz)")
    lines: list[str] = []
    try:
        opener = gzip.open if path.suffix == ".gz" else open
        with opener(path, "rt", encoding="utf-8", newline="\n") as handle:
            # line 1 is a header ("bpe_simple_vocab_16e6.txt#version: 0.2"); merges start on line 2
            for line in handle:
                lines.append(line.rstrip("\n"))
                if len(lines) > num_merges:
                    break
    except (OSError, UnicodeDecodeError, EOFError) as exc:
        raise TokenizerError(f"{path}: cannot read as a gzip-compressed UTF-8 text file: {exc}") from exc
    while lines and not lines[-1].strip():
        lines.pop()
    body = lines[1 : 1 + num_merges]
    if len(body) < num_merges:
        raise TokenizerError(f"{path}: expected at least {num_merges} merge lines after the header, found {len(body)}")
    return [_parse_merge(line, path, k + 2) for k, line in enumerate(body)]


def _parse_merge(line: str, path: Path, line_no: int) -> tuple[str, str]:
    parts = line.split()
    if len(parts) != 2:
        raise TokenizerError(f"{path} line {line_no}: expected a merge 'left right' (two tokens), got {line!r}")
    return parts[0], parts[1]


def write_tokenizer_files(out_dir: str | os.PathLike, merges: Sequence[tuple[str, str]]) -> Path:
    """Write ``vocab.json`` (token → id) and ``merges.txt`` (HF format) for ``merges``, atomically."""
    out = Path(out_dir)
    tokens = vocabulary_from_merges(merges)
    vocab = {tok: i for i, tok in enumerate(tokens)}
    merges_text = "\n".join([MERGES_HEADER, *(f"{a} {b}" for a, b in merges)]) + "\n"
    # merges first: a reader that sees vocab.json assumes merges.txt is already complete
    atomic_write_text(out / "merges.txt", merges_text)
    atomic_write_text(out / "vocab.json", json.dumps(vocab, ensure_ascii=False))
    return out


def build_clip_tokenizer_files(
    bpe_gz_path: str | os.PathLike, out_dir: str | os.PathLike, num_merges: int = CLIP_NUM_MERGES
) -> Path:
    """Rebuild CLIP's tokenizer files (49,408 tokens for the default ``num_merges``) from its merges file."""
    return write_tokenizer_files(out_dir, read_clip_merges(bpe_gz_path, num_merges))


# ------------------------------------------------------------------------------------------ tiny tokenizer

# A small built-in English corpus (caption-like words) for the tiny tokenizer: enough for a few hundred merges
# that produce sensible sub-words, so tests and the demo tokenize text without any data file.
_TINY_CORPUS = """
a an the man woman men women person people boy girl child children kid kids baby dog dogs cat cats bird birds
horse car cars truck bus train plane boat bike bicycle ball game video music song songs dance dancing singing
is are was were be being been has have had do does doing did playing plays played running runs ran walking walks
walked talking talks talked cooking cooks cooked driving drives drove riding rides rode swimming swims jumping
jumps eating eats drinking drinks reading writing sitting standing looking watching showing shows explaining
someone something another other his her their its on in at of to from with by for into onto over under about
and or but while then there here this that these those what who how when where which some many few one two three
four five red blue green white black yellow orange brown pink purple small big large little long short young old
new street road beach water river lake sea ocean snow grass field park room kitchen house stage table floor
camera news people team player players football soccer basketball tennis guitar piano food cartoon animal animals
show shows movie scene clip clips woman's man's group crowd people's outside inside together front back around
slowly quickly happily very really just also still again before after during through across along down up out
interview report reporter audience performs performing performance cooking recipe makeup hair dress shirt hat
computer phone screen television wall window door tree trees flower flowers mountain mountains sky sun rain
"""


def learn_bpe_merges(words: Iterable[str], num_merges: int) -> list[tuple[str, str]]:
    """Learn ``num_merges`` byte-level BPE merges from ``words`` (CLIP conventions: ``</w>`` on the last symbol).

    Greedy textbook BPE: repeatedly merge the most frequent adjacent pair (ties broken by the pair's text, so the
    result is deterministic). Pairs whose merged token already exists are skipped so every merge adds a new
    token. Stops early when every word is a single symbol.
    """
    symbols = byte_symbols()
    counts = Counter(w for w in words if w)
    vocab: dict[tuple[str, ...], int] = {}
    for word, n in counts.items():
        chars = [symbols[b] for b in word.encode("utf-8")]
        chars[-1] += END_OF_WORD
        vocab[tuple(chars)] = vocab.get(tuple(chars), 0) + n
    merges: list[tuple[str, str]] = []
    made: set[str] = set(byte_symbols()) | {s + END_OF_WORD for s in byte_symbols()}
    while len(merges) < num_merges:
        pairs: Counter[tuple[str, str]] = Counter()
        for word, n in vocab.items():
            for pair in zip(word, word[1:], strict=False):
                pairs[pair] += n
        candidates = [(n, p) for p, n in pairs.items() if p[0] + p[1] not in made]
        if not candidates:
            break
        best_n = max(n for n, _ in candidates)
        best = min(p for n, p in candidates if n == best_n)
        merges.append(best)
        made.add(best[0] + best[1])
        vocab = {_merge_word(word, best): n for word, n in vocab.items()}
    return merges


def _merge_word(word: tuple[str, ...], pair: tuple[str, str]) -> tuple[str, ...]:
    out: list[str] = []
    k = 0
    while k < len(word):
        if k + 1 < len(word) and word[k] == pair[0] and word[k + 1] == pair[1]:
            out.append(pair[0] + pair[1])
            k += 2
        else:
            out.append(word[k])
            k += 1
    return tuple(out)


def build_tiny_tokenizer_files(out_dir: str | os.PathLike, num_merges: int = 256) -> Path:
    """A small valid CLIP-format tokenizer (512 byte tokens + up to ``num_merges`` merges + 2 specials).

    Merges are learned from a built-in word list, so no data file is needed; ``num_merges=0`` gives a pure
    byte-level tokenizer. Fewer merges than requested are produced only if the word list runs out of pairs.
    """
    words = [w.lower() for w in re.findall(r"[A-Za-z']+", _TINY_CORPUS)]
    return write_tokenizer_files(out_dir, learn_bpe_merges(words, num_merges) if num_merges > 0 else [])


# ------------------------------------------------------------------------------------------ tokenizer


def clean_text(text: str) -> str:
    """CLIP's text cleaning: ftfy repair, HTML unescape twice, collapse whitespace, lowercase."""
    import ftfy

    text = html.unescape(html.unescape(ftfy.fix_text(text))).strip()
    return re.sub(r"\s+", " ", text).strip().lower()


#: words of more symbols than this are merged by :func:`_merge_long_word` (same result, O(n log n) instead of the
#: simple loop's O(n²) that a 16k-letter word took 15 s with)
LONG_WORD_SYMBOLS = 64
#: ``count_tokens`` runs BPE on words of at most this many UTF-8 bytes; a longer word (a caption with a 1 MB
#: "word") counts as a lower bound, ceil(bytes / longest token), and is reported as such
MAX_COUNTED_WORD_BYTES = 20_000


def _merge_long_word(parts: list[str], ranks: dict[tuple[str, str], int]) -> list[str]:
    """CLIP's BPE on one word, exactly: repeatedly take the lowest-ranked adjacent pair and merge every
    non-overlapping occurrence of it from left to right. A heap of (rank, position) over a linked list of symbols
    replaces the rescans; the occurrences of one rank are taken together, leftmost first, as the simple loop does
    (no merge of that rank can create another occurrence of it: the merged symbol is longer than either part)."""
    import heapq

    n = len(parts)
    symbols = list(parts)
    nxt = list(range(1, n + 1))
    prv = list(range(-1, n - 1))
    alive = [True] * n
    heap: list[tuple[int, int, str, str]] = []

    def push(i: int) -> None:
        j = nxt[i]
        if j < n:
            rank = ranks.get((symbols[i], symbols[j]))
            if rank is not None:
                heapq.heappush(heap, (rank, i, symbols[i], symbols[j]))

    for i in range(n - 1):
        push(i)
    while heap:
        rank = heap[0][0]
        batch = []
        while heap and heap[0][0] == rank:
            batch.append(heapq.heappop(heap))
        batch.sort(key=lambda entry: entry[1])
        touched = []
        for _, i, left, right in batch:
            j = nxt[i] if alive[i] else n
            if j >= n or symbols[i] != left or symbols[j] != right:
                continue  # stale: a neighbour was merged since this pair was seen
            symbols[i] = left + right
            alive[j] = False
            nxt[i] = nxt[j]
            if nxt[j] < n:
                prv[nxt[j]] = i
            touched.append(i)
        for i in touched:
            if alive[i]:
                push(i)
                if prv[i] >= 0:
                    push(prv[i])
    return [symbols[i] for i in range(n) if alive[i]]


class _PythonBPE:
    """Rank-ordered BPE over CLIP's byte symbols, in plain Python (fallback and cross-check for HF)."""

    def __init__(self, vocab: dict[str, int], merges: Sequence[tuple[str, str]]) -> None:
        import regex

        self.vocab = vocab
        self.ranks = {pair: r for r, pair in enumerate(merges)}
        self.pattern = regex.compile(_WORD_PATTERN, regex.IGNORECASE)
        self.symbols = byte_symbols()
        self.cache: dict[str, list[int]] = {}

    def _word_ids(self, word: str) -> list[int]:
        hit = self.cache.get(word)
        if hit is not None:
            return hit
        if word in (SOT_TOKEN, EOT_TOKEN):
            ids = [self.vocab[word]]
        else:
            parts = [self.symbols[b] for b in word.encode("utf-8")]
            parts[-1] += END_OF_WORD
            if len(parts) > LONG_WORD_SYMBOLS:
                parts = _merge_long_word(parts, self.ranks)
            while len(parts) > 1:
                ranked = [(self.ranks.get(p, -1), p) for p in zip(parts, parts[1:], strict=False)]
                known = [(r, p) for r, p in ranked if r >= 0]
                if not known:
                    break
                parts = list(_merge_word(tuple(parts), min(known)[1]))
            ids = [self.vocab[p] for p in parts]
        if len(self.cache) < 100_000 and len(word) <= 1_000:
            self.cache[word] = ids
        return ids

    def encode(self, cleaned: str) -> list[int]:
        out: list[int] = []
        for word in self.pattern.findall(cleaned):
            out.extend(self._word_ids(word))
        return out


def parse_vocab_and_merges(
    vocab_text: str, merges_text: str, folder: Path
) -> tuple[dict[str, int], list[tuple[str, str]]]:
    """vocab + merges from the texts of ``folder``'s ``vocab.json`` and ``merges.txt``."""
    vocab_file, merges_file = folder / "vocab.json", folder / "merges.txt"
    try:
        vocab = parse_json(vocab_text, vocab_file)
    except DataFileError as exc:
        raise TokenizerError(f"{vocab_file}{f' line {exc.line}' if exc.line else ''}: {exc.problem}") from None
    if not isinstance(vocab, dict) or not all(isinstance(v, int) for v in vocab.values()):
        raise TokenizerError(f"{vocab_file}: expected a JSON object mapping token strings to integer ids")
    merges: list[tuple[str, str]] = []
    for k, line in enumerate(merges_text.split("\n"), start=1):
        if (k == 1 and line.startswith("#version")) or not line.strip():
            continue
        merges.append(_parse_merge(line, merges_file, k))
    return vocab, merges


def _read_tokenizer_dir(path: Path) -> tuple[dict[str, int], list[tuple[str, str]]]:
    """vocab + merges from ``vocab.json``/``merges.txt``, or from an HF ``tokenizer.json`` (BPE model)."""
    vocab_file, merges_file, tok_file = path / "vocab.json", path / "merges.txt", path / "tokenizer.json"
    if vocab_file.is_file() and merges_file.is_file():
        return parse_vocab_and_merges(
            vocab_file.read_text(encoding="utf-8"), merges_file.read_text(encoding="utf-8"), path
        )
    if tok_file.is_file():
        try:
            model = read_json(tok_file)["model"]
            vocab = dict(model["vocab"])
            raw = model["merges"]
        except DataFileError as exc:
            raise TokenizerError(str(exc)) from None
        except (KeyError, TypeError) as exc:
            raise TokenizerError(
                f"{tok_file}: expected an HF tokenizer.json with model.vocab and model.merges"
            ) from exc
        merges = [tuple(m.split(" ")) if isinstance(m, str) else tuple(m) for m in raw]
        return vocab, merges  # type: ignore[return-value]
    raise TokenizerError(f"{path}: no tokenizer files; expected vocab.json + merges.txt (or an HF tokenizer.json)")


class ClipTokenizer:
    """CLIP BPE tokenizer producing the fixed-length (ids, mask) pairs the text encoder expects.

    ``__call__`` builds ``[SOT] + bpe[:max_words-2] + [EOT]`` padded with id 0 (CLIP4Clip convention), with mask 1
    on real tokens. EOT is the largest id, so ``argmax(ids)`` finds it as CLIP's text pooling requires.
    """

    def __init__(self, vocab: dict[str, int], merges: Sequence[tuple[str, str]], backend: str = "auto") -> None:
        self.vocab = dict(vocab)
        self.merges = [tuple(m) for m in merges]
        for special in (SOT_TOKEN, EOT_TOKEN):
            if special not in self.vocab:
                raise TokenizerError(f"vocabulary has no {special} token; not a CLIP tokenizer")
        self.sot_id = self.vocab[SOT_TOKEN]
        self.eot_id = self.vocab[EOT_TOKEN]
        self.vocab_size = len(self.vocab)
        if self.eot_id != max(self.vocab.values()):
            raise TokenizerError(f"{EOT_TOKEN} must have the largest id (CLIP pools the text at argmax(ids))")
        missing = [a + b for a, b in self.merges if a + b not in self.vocab]
        if missing:
            raise TokenizerError(f"merged token {missing[0]!r} is not in the vocabulary ({len(missing)} such merges)")
        self._python = _PythonBPE(self.vocab, self.merges)
        self._hf = None
        if backend not in ("auto", "hf", "python"):
            raise ValueError(f"backend must be auto | hf | python, got {backend!r}")
        if backend in ("auto", "hf"):
            try:
                self._hf = self._build_hf()
            except Exception as exc:  # transformers missing or its API changed: the Python BPE is exact too
                if backend == "hf":
                    raise TokenizerError(f"cannot build transformers.CLIPTokenizer: {exc}") from exc
        self.backend = "hf" if self._hf is not None else "python"

    def _build_hf(self):
        import transformers

        major = int(transformers.__version__.split(".")[0])
        if major >= 5:
            tok = transformers.CLIPTokenizer(vocab=self.vocab, merges=list(self.merges))
        else:  # pragma: no cover - transformers 4.x: the tokenizers-backed class takes file paths
            import tempfile

            tmp = Path(tempfile.mkdtemp(prefix="tvr-tok-"))
            self.save(tmp)
            tok = transformers.CLIPTokenizerFast(
                vocab_file=str(tmp / "vocab.json"), merges_file=str(tmp / "merges.txt")
            )
        backend = tok.backend_tokenizer
        probe = clean_text("A man's dog, 2 cats & über-fast café!! <|endoftext|>")
        if backend.encode(probe, add_special_tokens=False).ids != self._python.encode(probe):
            raise TokenizerError("transformers CLIPTokenizer disagrees with CLIP's BPE on a probe sentence")
        return backend

    @classmethod
    def from_dir(cls, path: str | os.PathLike, backend: str = "auto") -> ClipTokenizer:
        """Load ``vocab.json`` + ``merges.txt`` (or an HF ``tokenizer.json``) from a folder."""
        vocab, merges = _read_tokenizer_dir(Path(path))
        return cls(vocab, merges, backend=backend)

    @classmethod
    def from_texts(cls, files: dict[str, str], folder: Path, backend: str = "auto") -> ClipTokenizer:
        """:meth:`from_dir` of files already read: ``files`` maps ``vocab.json`` and ``merges.txt`` to their text
        (``folder`` names them in messages)."""
        vocab, merges = parse_vocab_and_merges(files["vocab.json"], files["merges.txt"], folder)
        return cls(vocab, merges, backend=backend)

    def files(self) -> dict[str, str]:
        """The text of ``vocab.json`` and ``merges.txt``, in the order they are written (merges first: a reader that
        sees vocab.json assumes merges.txt is already complete)."""
        merges = "\n".join([MERGES_HEADER, *(f"{a} {b}" for a, b in self.merges)]) + "\n"
        return {"merges.txt": merges, "vocab.json": json.dumps(self.vocab, ensure_ascii=False)}

    def save(self, out_dir: str | os.PathLike) -> Path:
        """Write ``vocab.json`` + ``merges.txt`` atomically."""
        out = Path(out_dir)
        for name, text in self.files().items():
            atomic_write_text(out / name, text)
        return out

    def encode(self, text: str) -> list[int]:
        """BPE ids of ``text`` after CLIP cleaning, without SOT/EOT."""
        cleaned = clean_text(text)
        if not cleaned:
            return []
        if self._hf is not None:
            return list(self._hf.encode(cleaned, add_special_tokens=False).ids)
        return self._python.encode(cleaned)

    def encode_batch(self, texts: Sequence[str]) -> list[list[int]]:
        cleaned = [clean_text(t) for t in texts]
        if self._hf is not None:
            return [list(e.ids) for e in self._hf.encode_batch(cleaned, add_special_tokens=False)]
        return [self._python.encode(c) for c in cleaned]

    def count_tokens(self, texts: Sequence[str]) -> list[int]:
        """``len(self.encode(t))`` for every text, fast enough for a whole dataset (``tvr check-data``).

        Exact, by two observations: CLIP's word pattern never matches across whitespace, so the cleaned text can be
        split on spaces and each piece's count cached (captions reuse a few tens of thousands of pieces); and for
        printable ASCII without ``&`` the cleaning (ftfy, HTML unescape) changes nothing but case and spacing, so
        ftfy — most of the cost — runs only on the other texts. A word longer than
        :data:`MAX_COUNTED_WORD_BYTES` counts as a lower bound (:meth:`count_tokens_checked` says which).
        """
        return self.count_tokens_checked(texts)[0]

    def count_tokens_checked(self, texts: Sequence[str]) -> tuple[list[int], list[int]]:
        """(:meth:`count_tokens`, the positions of the texts whose count is a lower bound because a word is longer
        than :data:`MAX_COUNTED_WORD_BYTES`: BPE work per word is bounded, whatever the data holds)."""
        counts: list[int] = []
        bounded: list[int] = []
        cache: dict[str, int] = {}
        words = self._python.pattern.findall
        word_ids = self._python._word_ids
        longest = max((len(t.removesuffix(END_OF_WORD).encode("utf-8")) for t in self.vocab), default=1)
        for k, text in enumerate(texts):
            if text.isascii() and text.isprintable() and "&" not in text:
                pieces = text.lower().split()
            else:
                pieces = clean_text(text).split()
            total = 0
            for piece in pieces:
                n = cache.get(piece)
                if n is None:
                    n = 0
                    for word in words(piece):
                        size = len(word.encode("utf-8"))
                        if size > MAX_COUNTED_WORD_BYTES:
                            n += -(-size // max(1, longest))
                            if not bounded or bounded[-1] != k:
                                bounded.append(k)
                        else:
                            n += len(word_ids(word))
                    if len(cache) < 1_000_000 and len(piece) <= 1_000:
                        cache[piece] = n
                total += n
            counts.append(total)
        return counts, bounded

    def decode(self, ids: Iterable[int]) -> str:
        """Text of ``ids`` (special tokens and padding dropped); for inspection, not an exact inverse."""
        inverse = {i: t for t, i in self.vocab.items()}
        byte_of = {s: b for b, s in enumerate(byte_symbols())}
        out: list[str] = []
        for i in ids:
            tok = inverse.get(int(i), "")
            if tok in (SOT_TOKEN, EOT_TOKEN):
                continue
            word_end = tok.endswith(END_OF_WORD)
            raw = bytes(byte_of[c] for c in tok.removesuffix(END_OF_WORD) if c in byte_of)
            out.append(raw.decode("utf-8", errors="replace") + (" " if word_end else ""))
        return "".join(out).strip()

    def __call__(self, texts: Sequence[str], max_words: int) -> tuple[Tensor, Tensor]:
        """(ids, mask), both LongTensor[N, max_words]: [SOT] + tokens[:max_words-2] + [EOT], zero-padded."""
        if isinstance(texts, str):
            raise TypeError("expected a list of strings, got a single string")
        if max_words < 2:
            raise ValueError(f"max_words must be at least 2 (room for SOT and EOT), got {max_words}")
        ids = torch.zeros(len(texts), max_words, dtype=torch.long)
        mask = torch.zeros(len(texts), max_words, dtype=torch.long)
        for row, tokens in enumerate(self.encode_batch(list(texts))):
            seq = [self.sot_id, *tokens[: max_words - 2], self.eot_id]
            ids[row, : len(seq)] = torch.tensor(seq, dtype=torch.long)
            mask[row, : len(seq)] = 1
        return ids, mask

    def __len__(self) -> int:
        return self.vocab_size


# --------------------------------------------------------------------------------------------- a run's tokenizer
# Which tokenizer a run's captions take is the backbone's to say (its folder in ``tvr.models.backbones`` declares it;
# ``tvr.models.run_spec.resolve_run`` answers it once per job as ``RunSpec.tokenizer``), so this layer never reads the
# model config: it is handed the spec. A spec names a kind
# registered here (CLIP's BPE from files, the tiny model's BPE, a sentence model's own tokenizer, or one a package
# registers with :func:`register_tokenizer`) and where its files come from.


@dataclass(frozen=True)
class TokenizerSpec:
    """The tokenizer a backbone's captions take: ``kind`` (a registered kind, :func:`register_tokenizer`),
    ``source`` (what the kind builds it from: a folder, a merges file, a model name), ``backbone`` (whose it is, for
    messages) and ``missing`` (set when the config names none: why, and what to set; building it then fails with
    this message)."""

    kind: str
    source: str = ""
    backbone: str = ""
    missing: str = ""


#: a tokenizer kind's builder: (source, work_dir) → a callable ``(texts, max_words) -> (ids, mask)``
TokenizerBuilder = Callable[[str, Path], Callable]

_TOKENIZERS: dict[str, TokenizerBuilder] = {}


def register_tokenizer(kind: str, build: TokenizerBuilder) -> TokenizerBuilder:
    """Make ``TokenizerSpec(kind, source)`` build with ``build(source, work_dir)`` (a backbone of another package
    whose captions need a tokenizer tvr does not have). Registering another builder under a taken kind is an error."""
    current = _TOKENIZERS.get(kind)
    if current is not None and current is not build:
        raise ValueError(f"tokenizer kind {kind!r} is already registered ({current!r})")
    _TOKENIZERS[kind] = build
    return build


def _clip_bpe(source: str, work_dir: Path) -> ClipTokenizer:
    """CLIP's BPE from a folder with vocab.json + merges.txt, or rebuilt from CLIP's ``bpe_simple_vocab_16e6.txt.gz``
    into ``work_dir/tokenizer``."""
    if source.endswith(".gz") or source.endswith(".txt"):
        target = work_dir / TOKENIZER_FOLDER
        if not (target / "vocab.json").is_file():
            build_clip_tokenizer_files(source, target)
        return ClipTokenizer.from_dir(target)
    path = Path(source)
    if not (path / "vocab.json").is_file() and not (path / "tokenizer.json").is_file():
        raise FileNotFoundError(
            f"tokenizer folder {path} has no vocab.json/merges.txt; pass model.tokenizer=<folder or "
            f"bpe_simple_vocab_16e6.txt.gz>"
        )
    return ClipTokenizer.from_dir(path)


def _tiny_clip_bpe(source: str, work_dir: Path) -> ClipTokenizer:
    """The tiny random CLIP's small BPE, built locally into ``work_dir/tokenizer`` (no download)."""
    target = work_dir / TOKENIZER_FOLDER
    if not (target / "vocab.json").is_file():
        build_tiny_tokenizer_files(target)
    return ClipTokenizer.from_dir(target)


def _sentence_model(source: str, work_dir: Path):
    """A sentence-transformers text model's own tokenizer (same call signature)."""
    from tvr.data.sentence_tokenizer import SentenceTokenizer

    return SentenceTokenizer.for_model(source, work_dir)


#: CLIP's BPE (from files), the tiny CLIP's BPE, a sentence model's own tokenizer
CLIP_BPE, TINY_CLIP_BPE, SENTENCE_MODEL = "clip_bpe", "tiny_clip_bpe", "sentence_model"
register_tokenizer(CLIP_BPE, _clip_bpe)
register_tokenizer(TINY_CLIP_BPE, _tiny_clip_bpe)
register_tokenizer(SENTENCE_MODEL, _sentence_model)


def build_tokenizer(spec: TokenizerSpec, work_dir: str | os.PathLike):
    """Load the tokenizer ``spec`` names (a callable ``(texts, max_words) -> (ids, mask)``): a run's is the one its
    backbone names (``tvr.models.run_spec.resolve_run(cfg).tokenizer``). For the CLIP backbones:

    * ``model.tokenizer`` may name a folder with vocab.json + merges.txt, or CLIP's ``bpe_simple_vocab_16e6.txt.gz``
      (the full 49,408-token vocabulary is rebuilt from it into ``work_dir/tokenizer``).
    * A local CLIP checkpoint folder carries its own tokenizer files.
    * The tiny random model gets a small tokenizer built locally into ``work_dir/tokenizer`` (no download).

    ``model.backbone: two_tower`` takes its text model's own tokenizer
    (:class:`~tvr.data.sentence_tokenizer.SentenceTokenizer`, same call signature).
    """
    if spec.missing:
        raise FileNotFoundError(spec.missing)
    build = _TOKENIZERS.get(spec.kind)
    if build is None:
        raise ConfigError(
            f"data.tokenizer_spec: tokenizer kind {spec.kind!r} is not registered; known: {sorted(_TOKENIZERS)}"
        )
    return build(spec.source, Path(work_dir))
