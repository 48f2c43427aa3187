"""Measuring search on labelled clips: ``tvr eval-search INDEX QUERIES.csv``.

A queries file is a CSV with a header naming at least ``query`` and ``video`` (a path as the index lists it:
relative to the indexed folder) and optionally ``start`` and ``end`` (seconds: the labelled moment). Each query is
searched exactly as ``tvr search`` searches it (the index's model, shortlist and exact rerank), and its **rank** is
the position of the labelled video in the results (one per video, each at its best window); with ``start``/``end``
the results are windows and the rank is that of the first window of the video that overlaps the labelled moment
(the video's other windows count as misses). A labelled item the search does not return at all (outside the
shortlist, or beyond :data:`MAX_DEPTH` results) ranks last, as ``tvr eval`` ranks a match outside its shortlist.

From the ranks: R@k (percent of queries ranked at k or better), MdR and MnR — the metrics ``tvr eval`` reports.
"""

from __future__ import annotations

import contextlib
import csv
import dataclasses
import io
import math
import os
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from tvr.search.index import MAX_K, MAX_QUERY_CHARS, Hit, SearchIndex
from tvr.utils.errors import UserError
from tvr.utils.io import NotRegularFileError, open_regular

#: default recall cut-offs
DEFAULT_KS = (1, 5, 10)
#: results fetched per query (``tvr search``'s own bound): a labelled item beyond them ranks last
MAX_DEPTH = MAX_K


class QueriesFileError(UserError, ValueError):
    """A queries file that cannot be used: each problem on its own line."""


@dataclasses.dataclass(frozen=True)
class LabelledQuery:
    """One row of a queries file: the text, the video it should find (its number in the index) and, optionally,
    the labelled moment."""

    line: int
    query: str
    video: str
    number: int
    start: float | None = None
    end: float | None = None


def _video_numbers(index: SearchIndex) -> dict[str, int]:
    return {entry["video"]: number for number, entry in enumerate(index.videos)}


def _seconds(text: str, field: str) -> float:
    shown = text if len(text) <= 40 else text[:37] + "..."
    try:
        value = float(text)
    except ValueError:
        raise ValueError(f"{field} = {shown!r}: expected seconds (a number)") from None
    if not math.isfinite(value) or value < 0:
        raise ValueError(f"{field} = {shown!r}: expected a finite number of seconds >= 0")
    return value


#: the largest queries file read (a million labelled queries take about 100 MB)
MAX_QUERIES_BYTES = 1 << 30


@contextlib.contextmanager
def _csv_fields_up_to(limit: int) -> Iterator[None]:
    """The csv module's field size limit (process-wide; 131,072 characters by default) raised to ``limit`` inside
    the block: a longer query is then a row refused by its length, with its line, not a ``_csv.Error``."""
    previous = csv.field_size_limit()
    csv.field_size_limit(max(previous, limit))
    try:
        yield
    finally:
        csv.field_size_limit(previous)


def read_queries(path: str | os.PathLike, videos: dict[str, int]) -> tuple[list[LabelledQuery], list[str]]:
    """(queries, problems) of a queries file, ``videos`` mapping the index's video paths to their numbers. A
    problem is one line naming the file, the row's line and what was wrong with it; the row is left out.

    The file is read by the csv module as it was written (opened with ``newline=""``): a quoted query keeps its
    line breaks, and U+0085 or U+2028 inside a query are characters of the query, never the end of a row. A row's
    line is the line it starts on."""
    path = Path(path)
    try:
        handle = open_regular(path)
    except NotRegularFileError as exc:
        raise QueriesFileError(f"{path}: {exc.strerror}; expected a CSV with the columns query,video") from None
    size = os.fstat(handle.fileno()).st_size
    if size > MAX_QUERIES_BYTES:
        handle.close()
        raise QueriesFileError(f"{path}: {size:,} bytes, more than the {MAX_QUERIES_BYTES:,} a queries file may hold")
    text = io.TextIOWrapper(io.BufferedReader(handle), encoding="utf-8-sig", newline="")
    try:
        with text, _csv_fields_up_to(size + 1):
            return _read_rows(path, csv.reader(text), videos)
    except UnicodeDecodeError as exc:
        raise QueriesFileError(f"{path}: not a UTF-8 text file ({exc.reason}); expected a CSV with the columns "
                               "query,video") from None  # fmt: skip
    except csv.Error as exc:
        raise QueriesFileError(f"{path}: not valid CSV ({exc}); expected the columns query,video") from None


def _read_rows(path: Path, reader: Any, videos: dict[str, int]) -> tuple[list[LabelledQuery], list[str]]:
    header = next(reader, None)
    if header is None:
        raise QueriesFileError(f"{path}: empty; expected a CSV whose header names the columns query,video")
    columns = [c.strip().lower() for c in header]
    missing = [c for c in ("query", "video") if c not in columns]
    if missing:
        shown = header if len(repr(header)) <= 200 else f"{repr(header)[:197]}..."
        raise QueriesFileError(
            f"{path}: the header {shown!r} has no {' or '.join(missing)} column; expected query,video[,start,end]"
        )
    timed = ("start" in columns) + ("end" in columns)
    if timed == 1:
        raise QueriesFileError(f"{path}: the header has only one of start / end; give both or neither")
    at = {name: columns.index(name) for name in ("query", "video", "start", "end") if name in columns}
    queries: list[LabelledQuery] = []
    problems: list[str] = []
    while True:
        line = reader.line_num + 1  # where the next row starts (a quoted field may span lines)
        row = next(reader, None)
        if row is None:
            break
        if not any(cell.strip() for cell in row):
            continue
        try:
            if len(row) != len(columns):
                spans = reader.line_num - line
                hint = f" (the row runs on for {spans} more lines: an unclosed quote?)" if spans > 1 else ""
                raise ValueError(f"{len(row)} fields, the header has {len(columns)}{hint}")
            query, video = row[at["query"]].strip(), row[at["video"]].strip()
            if not query:
                raise ValueError("the query is empty")
            if len(query) > MAX_QUERY_CHARS:
                raise ValueError(f"the query has {len(query):,} characters, at most {MAX_QUERY_CHARS} are accepted")
            key = video.removeprefix("./")
            if key not in videos:
                shown = video if len(video) <= 200 else video[:197] + "..."
                raise ValueError(f"video {shown!r} is not in the index")
            start = end = None
            if timed:
                start, end = _seconds(row[at["start"]].strip(), "start"), _seconds(row[at["end"]].strip(), "end")
                if end <= start:
                    raise ValueError(f"end = {end} is not after start = {start}")
            queries.append(LabelledQuery(line, query, key, videos[key], start, end))
        except ValueError as exc:
            problems.append(f"{path}:{line}: {exc}")
    return queries, problems


def overlaps(hit: Hit, start: float, end: float) -> bool:
    """Whether a window shares some time with the labelled moment [start, end]."""
    return hit.start < end and start < hit.end


def rank_in(hits: Sequence[Hit], item: LabelledQuery) -> int | None:
    """1-based position of the labelled item in ``hits`` (None when it is not among them)."""
    for hit in hits:
        if hit.video == item.video and (item.start is None or overlaps(hit, item.start, item.end)):
            return hit.rank
    return None


def ranks_from_scores(scores: np.ndarray, targets: Sequence[int]) -> np.ndarray:
    """The ranks ``rank_in`` gives on a full ranking whose scores are ``scores`` [queries, items] (one window per
    item): 1 + the items scored higher, + the items scored equal that come earlier (search breaks ties by row)."""
    scores = np.asarray(scores, dtype=np.float64)
    targets = np.asarray(targets, dtype=np.int64)
    mine = scores[np.arange(len(targets)), targets][:, None]
    earlier = np.arange(scores.shape[1])[None, :] < targets[:, None]
    return 1 + (scores > mine).sum(axis=1) + ((scores == mine) & earlier).sum(axis=1)


def metrics_from_ranks(ranks: Sequence[int], ks: Sequence[int] = DEFAULT_KS) -> dict[str, float]:
    """R@k for every k (percent), MdR (numpy's median) and MnR of 1-based ranks."""
    ranks = np.asarray(ranks, dtype=np.float64)
    if not len(ranks):
        raise ValueError("no ranks to summarise")
    out = {f"R{k}": round(100.0 * float(np.mean(ranks <= k)), 2) for k in ks}
    out["MdR"] = float(np.median(ranks))
    out["MnR"] = round(float(np.mean(ranks)), 2)
    return out


def parse_ks(values: Sequence[str] | None) -> tuple[int, ...]:
    """Recall cut-offs from ``-k`` values (repeated, or comma-separated): positive integers."""
    if not values:
        return DEFAULT_KS
    ks = []
    for value in values:
        for part in str(value).split(","):
            try:
                k = int(part.strip())
            except ValueError:
                raise UserError(f"-k {value!r}: expected positive integers (e.g. -k 1,5,10)") from None
            if k < 1:
                raise UserError(f"-k {value!r}: expected positive integers (e.g. -k 1,5,10)")
            ks.append(k)
    return tuple(sorted(set(ks)))


def evaluate_search(
    index: SearchIndex,
    queries_file: str | os.PathLike,
    *,
    ks: Sequence[int] = DEFAULT_KS,
    rerank: int | None = None,
    skip_bad: bool = False,
) -> dict[str, Any]:
    """Search every labelled query of ``queries_file`` in ``index``; return the metrics and every query's rank.

    A malformed row, or one naming a video the index does not hold, stops the evaluation with every such row named
    (:class:`QueriesFileError`), unless ``skip_bad``: then they are left out and listed under ``skipped``."""
    queries, problems = read_queries(queries_file, _video_numbers(index))
    if problems and not skip_bad:
        raise QueriesFileError(
            "\n".join([*problems, f"{len(problems)} bad row(s) in {queries_file} (--skip-bad leaves them out)"])
        )
    if not queries:
        raise QueriesFileError(f"{queries_file}: no usable query rows")
    timed = queries[0].start is not None
    candidates = index.rows if timed else len(index)
    depth = min(candidates, MAX_DEPTH)
    results = []
    for item in queries:
        hits = index.search(item.query, k=depth, rerank=rerank, all_windows=timed)
        found = rank_in(hits, item)
        results.append(
            {
                "line": item.line,
                "query": item.query,
                "video": item.video,
                **({"start": item.start, "end": item.end} if timed else {}),
                "rank": candidates if found is None else found,
                "found": found is not None,
                "top": hits[0].video if hits else None,
            }
        )
    return {
        "index": index.location,
        "queries_file": str(queries_file),
        "unit": "window" if timed else "video",
        "candidates": candidates,
        "queries": len(results),
        "skipped": problems,
        "metrics": metrics_from_ranks([r["rank"] for r in results], ks),
        "results": results,
    }
