"""``tvr eval-search``: ranks, metrics and bad rows, on the small colour-video index of the search tests."""

from __future__ import annotations

import csv
import json
import os
from pathlib import Path

import numpy as np
import pytest
from search_fixtures import VIDEOS, index_args
from typer.testing import CliRunner

from tvr.cli import app
from tvr.search import open_index
from tvr.search.evaluation import (
    QueriesFileError,
    evaluate_search,
    metrics_from_ranks,
    parse_ks,
    ranks_from_scores,
    read_queries,
)
from tvr.utils.errors import UserError

runner = CliRunner()


@pytest.fixture(scope="module")
def built(search_setup, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("eval-search") / "idx"
    result = runner.invoke(app, index_args(search_setup.videos, out, search_setup.checkpoint))
    assert result.exit_code == 0, result.output
    return out


def write_csv(path: Path, lines: list[str]) -> Path:
    path.write_text("\n".join(lines) + "\n")
    return path


def test_metrics_and_ranks_from_scores() -> None:
    assert metrics_from_ranks([1, 2, 7, 20], ks=(1, 5, 10)) == {
        "R1": 25.0,
        "R5": 50.0,
        "R10": 75.0,
        "MdR": 4.5,
        "MnR": 7.5,
    }
    scores = np.array([[0.1, 0.9, 0.5], [0.7, 0.7, 0.2], [0.3, 0.3, 0.3]])
    # search orders by score, ties by row: query 1's target (row 1) ties with row 0, which comes first
    assert ranks_from_scores(scores, [1, 1, 0]).tolist() == [1, 2, 1]
    assert ranks_from_scores(scores, [2, 0, 2]).tolist() == [2, 1, 3]
    assert parse_ks(["1,5", "50"]) == (1, 5, 50) and parse_ks(None) == (1, 5, 10)
    with pytest.raises(UserError, match="-k"):
        parse_ks(["0"])


def test_ranks_are_the_positions_search_gives(built: Path) -> None:
    index = open_index(built)
    lines = ["query,video"] + [f"{caption},{name}" for name, (caption, _, _) in VIDEOS.items()]
    # a query naming the wrong video: its rank is where search puts that video
    lines.append("a red screen,blue.mp4")
    report = evaluate_search(index, write_csv(built.parent / "q.csv", lines))
    expected = []
    for row in report["results"]:
        hits = index.search(row["query"], k=len(VIDEOS))
        expected.append(next(h.rank for h in hits if h.video == row["video"]))
    assert [r["rank"] for r in report["results"]] == expected
    assert expected[:5] == [1, 1, 1, 1, 1] and expected[5] > 1  # the tiny model tells the colours apart
    assert report["metrics"] == metrics_from_ranks(expected)
    assert report["candidates"] == len(VIDEOS) and report["unit"] == "video" and report["skipped"] == []
    assert all(r["found"] for r in report["results"])


def test_timed_rows_rank_windows(built: Path) -> None:
    index = open_index(built)
    # yellow is 9 s: windows [0,4] [2,6] [4,8] [5,9]; the labelled moment [8.5, 9] overlaps only the last one
    csv_path = write_csv(built.parent / "t.csv", ["query,video,start,end", "a yellow screen,sub/yellow.mp4,8.5,9"])
    report = evaluate_search(index, csv_path)
    hits = index.search("a yellow screen", k=index.rows, all_windows=True)
    want = next(h.rank for h in hits if h.video == "sub/yellow.mp4" and h.start == 5.0)
    assert report["unit"] == "window" and report["candidates"] == index.rows
    assert report["results"][0]["rank"] == want


def test_bad_rows_are_named_or_skipped(built: Path, tmp_path: Path) -> None:
    lines = [
        "query,video",
        "a red screen,red.mp4",
        "a green screen,nothere.mp4",
        "   ,blue.mp4",
        "too,many,fields",
    ]
    path = write_csv(tmp_path / "bad.csv", lines)
    videos = {"red.mp4": 0, "blue.mp4": 1}
    queries, problems = read_queries(path, videos)
    assert [q.line for q in queries] == [2]
    assert problems == [
        f"{path}:3: video 'nothere.mp4' is not in the index",
        f"{path}:4: the query is empty",
        f"{path}:5: 3 fields, the header has 2",
    ]
    result = runner.invoke(app, ["eval-search", str(built), str(path)])
    assert result.exit_code == 2
    assert "nothere.mp4" in result.output and ":4: the query is empty" in result.output
    assert "Traceback" not in result.output
    result = runner.invoke(app, ["eval-search", str(built), str(path), "--skip-bad", "--json"])
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    assert report["queries"] == 1 and len(report["skipped"]) == 3 and report["results"][0]["rank"] == 1


@pytest.mark.parametrize(
    ("lines", "message"),
    [
        (["caption,video", "a red screen,red.mp4"], "no query column"),
        (["query,video,start", "a red screen,red.mp4,1"], "only one of start / end"),
        (["query,video,start,end", "a red screen,red.mp4,2,1"], "is not after start"),
        (["query,video,start,end", "a red screen,red.mp4,x,1"], "expected seconds"),
        (["query,video"], "no usable query rows"),
    ],
)
def test_malformed_files_exit_2_with_one_line(built: Path, tmp_path: Path, lines: list[str], message: str) -> None:
    result = runner.invoke(app, ["eval-search", str(built), str(write_csv(tmp_path / "q.csv", lines))])
    assert result.exit_code == 2 and message in result.output, result.output
    assert "Traceback" not in result.output


def test_cli_table_json_and_cutoffs(built: Path, tmp_path: Path) -> None:
    lines = ["query,video"] + [f"{caption},{name}" for name, (caption, _, _) in VIDEOS.items()]
    path = write_csv(tmp_path / "q.csv", lines)
    result = runner.invoke(app, ["eval-search", str(built), str(path), "--json", "-k", "1,2", "-k", "3"])
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    assert report["metrics"] == {"R1": 100.0, "R2": 100.0, "R3": 100.0, "MdR": 1.0, "MnR": 1.0}
    assert [r["video"] for r in report["results"]] == list(VIDEOS)
    result = runner.invoke(app, ["eval-search", str(built), str(path)])
    assert result.exit_code == 0 and "R10" in result.stdout and "sub/yellow.mp4" in result.stdout
    result = runner.invoke(app, ["eval-search", str(built), str(tmp_path / "missing.csv")])
    assert result.exit_code == 2 and "no such file" in result.output
    os.mkfifo(tmp_path / "fifo.csv")
    result = runner.invoke(app, ["eval-search", str(built), str(tmp_path / "fifo.csv")])
    assert result.exit_code == 2 and "not a regular file" in result.output


def test_a_query_is_read_as_written_line_breaks_and_all(tmp_path: Path) -> None:
    """The file is read by the csv module as written: a quoted query keeps its line break, and U+0085 / U+2028 are
    characters of a query (splitting the text into lines first changed or split such queries silently)."""
    path = tmp_path / "q.csv"
    videos = {"red.mp4": 0, "green.mp4": 1}
    text = (
        'query,video\r\n"a red\nscreen",red.mp4\r\n"a red\r\nscreen",red.mp4\r\na red\u2028screen,red.mp4\r\n'
        "a red\u0085screen,green.mp4\r\na green screen,green.mp4\r\n"
    )
    path.write_text(text, newline="")
    queries, problems = read_queries(path, videos)
    assert problems == []
    assert [(q.line, q.query, q.number) for q in queries] == [
        (2, "a red\nscreen", 0),
        (4, "a red\r\nscreen", 0),  # each row named by the line it starts on
        (6, "a red\u2028screen", 0),
        (7, "a red\u0085screen", 1),
        (8, "a green screen", 1),
    ]


def test_a_field_beyond_the_csv_limit_is_a_bad_row_not_a_traceback(built: Path, tmp_path: Path) -> None:
    """A query of 200,000 characters (past the csv module's 131,072) is a row refused by its length; an unclosed
    quote is a row that runs on; neither stops the run with a _csv.Error, and the csv limit is left as it was."""
    limit = csv.field_size_limit()
    path = tmp_path / "long.csv"
    path.write_text("query,video\n" + "x" * 200_000 + ",red.mp4\na red screen,red.mp4\n")
    queries, problems = read_queries(path, {"red.mp4": 0})
    assert [q.line for q in queries] == [3] and csv.field_size_limit() == limit
    assert problems == [f"{path}:2: the query has 200,000 characters, at most 1000 are accepted"]
    result = runner.invoke(app, ["eval-search", str(built), str(path)])
    assert result.exit_code == 2 and "Traceback" not in result.output and "200,000 characters" in result.output
    result = runner.invoke(app, ["eval-search", str(built), str(path), "--skip-bad", "--json"])
    assert result.exit_code == 0 and json.loads(result.stdout)["queries"] == 1
    unclosed = tmp_path / "unclosed.csv"
    unclosed.write_text('query,video\na red screen,red.mp4\n"a green screen,green.mp4\n' + "y\n" * 100_000)
    queries, problems = read_queries(unclosed, {"red.mp4": 0, "green.mp4": 1})
    assert [q.line for q in queries] == [2]
    assert problems == [f"{unclosed}:3: 1 fields, the header has 2 (the row runs on for 100000 more lines: an unclosed "
                        'quote?)']  # fmt: skip
    fifo = tmp_path / "fifo.csv"
    os.mkfifo(fifo)
    with pytest.raises(QueriesFileError, match="a FIFO, not a regular file"):
        read_queries(fifo, {})
