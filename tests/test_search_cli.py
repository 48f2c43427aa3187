"""``tvr search`` from the shell: every bad argument is one line naming it (exit 2) before any model loads, a text
file is not a video, ``--queries FILE`` answers many queries in one process (one JSON line each, the same answers as
one query at a time), and a cold search prints nothing on stderr and imports only what the index's encoder needs."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from search_fixtures import VIDEOS
from typer.testing import CliRunner

import tvr.search
from tvr.cli import app
from tvr.search import open_index

runner = CliRunner()


@pytest.fixture
def built(search_index: Path) -> Path:
    return search_index


def _no_model(*_args, **_kwargs):
    raise AssertionError("the model was loaded before the arguments were checked")


@pytest.mark.parametrize(
    ("arguments", "named"),
    [
        (["a red screen", "-k", "0"], "-k 0: expected an integer from 1 to 1000"),
        (["a red screen", "-k", "-3"], "-k -3"),
        (["a red screen", "-k", "100000"], "-k 100000"),
        (["a red screen", "--rerank", "-1"], "--rerank -1: expected an integer >= 0"),
        (["   "], "the query is empty"),
        (["x" * 1001], "the query has 1001 characters, at most 1000"),
        (["--video", "missing.mp4", "--captions", "CAPTIONS"], "--video missing.mp4: no such file"),
        (["--video", "CAPTIONS", "--captions", "CAPTIONS"], "not a video (a text file"),
        (["--video", "FOLDER", "--captions", "CAPTIONS"], "is a folder; expected a file"),
        (["--queries", "missing.txt"], "--queries missing.txt: no such file"),
        (["a red screen", "--queries", "CAPTIONS"], "not a query and --queries"),
        (["--video", "CAPTIONS"], "--video and --captions go together"),
    ],
)
def test_bad_arguments_are_one_line_before_the_model_loads(
    built: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, arguments: list[str], named: str
) -> None:
    captions = tmp_path / "captions.txt"
    # long enough that FFmpeg's tty demuxer takes it for a video (a short file fails to open at all)
    captions.write_text("\n".join(f"caption number {i} of a list of captions" for i in range(40)) + "\n")
    substitutes = {"CAPTIONS": str(captions), "FOLDER": str(tmp_path)}
    monkeypatch.setattr(tvr.search, "open_index", _no_model)
    result = runner.invoke(app, ["search", str(built), *(substitutes.get(a, a) for a in arguments)])
    assert result.exit_code == 2, result.output
    assert "Traceback" not in result.output
    first = result.output.strip().splitlines()[0]
    assert first.startswith("error:") and named in first, result.output
    assert len(result.output.strip().splitlines()) <= 2  # the error, and the hint naming --debug


def test_queries_file_answers_each_query_as_a_single_search(built: Path, tmp_path: Path) -> None:
    captions = [caption for caption, _, _ in VIDEOS.values()]
    queries = tmp_path / "queries.txt"
    queries.write_text("\n".join([*captions, "", "y" * 1001, captions[0]]) + "\n")
    result = runner.invoke(app, ["search", str(built), "--queries", str(queries), "-k", "3"])
    assert result.exit_code == 1, result.output  # one query refused
    lines = [json.loads(line) for line in result.stdout.splitlines()]
    assert [line["query"] for line in lines] == [*captions, "y" * 1001, captions[0]]
    assert "at most 1000" in lines[len(captions)]["error"] and "hits" not in lines[len(captions)]
    index = open_index(built)
    for line in lines[: len(captions)] + lines[-1:]:
        assert line["hits"] == [h.to_dict() for h in index.search(line["query"], k=3)]
    assert "1 of 7 queries refused" in result.stderr
    piped = runner.invoke(app, ["search", str(built), "--queries", "-", "-k", "2"], input="a red screen\n")
    assert piped.exit_code == 0 and json.loads(piped.stdout)["hits"][0]["video"] == "red.mp4"


def test_search_many_equals_one_query_at_a_time(built: Path) -> None:
    index = open_index(built)
    texts = [caption for caption, _, _ in VIDEOS.values()] + ["a screen", "", "red"]
    answers = index.search_many(texts, k=4)
    for text, answer in zip(texts, answers, strict=True):
        if not text:
            assert isinstance(answer, ValueError) and "empty" in str(answer)
        else:
            assert answer == index.search(text, k=4)


def test_encode_queries_gives_the_vectors_the_shortlist_searches_with(built: Path) -> None:
    """open_index(IDX).encode_queries(texts): float32 [n, d], one row per text, each the vector a search of that text
    alone shortlists with (encoded in its length group as search_many encodes it)."""
    import numpy as np

    index = open_index(built)
    texts = ["a red screen", "a yellow screen " * 6, "a blue screen"]
    vectors = index.encode_queries(texts)
    assert vectors.dtype == np.float32 and vectors.shape == (3, index.dim)
    from tvr.search.encoders import one_torch_thread

    for text, vector in zip(texts, vectors, strict=True):
        with one_torch_thread():  # as a search encodes (a row then does not depend on its batch neighbours)
            alone = index.encoder.encode_texts([text], index.encoder.query_lengths([text])[0])
        np.testing.assert_array_equal(vector, index.head.shortlist_texts(alone).float().numpy()[0])
    assert index.encode_queries([]).shape == (0, index.dim)
    with pytest.raises(ValueError, match="empty"):
        index.encode_queries(["a red screen", "  "])


def test_the_command_line_defaults_are_the_librarys() -> None:
    """tvr index / tvr search take their defaults from the library's, so the two cannot drift apart."""
    import dataclasses

    import typer.main

    from tvr.search.build import IndexOptions
    from tvr.search.index import Query

    commands = {c.name: c for c in typer.main.get_command(app).commands.values()}
    index_flags = {p.name: p.default for p in commands["index"].params}
    library = IndexOptions()
    for field in ("window", "stride", "ann_kind", "ann_threshold", "nlist", "state_dtype", "shard_windows", "workers"):
        assert index_flags[field] == getattr(library, field), field
    search_flags = {p.name: p.default for p in commands["search"].params}
    query_defaults = {f.name: f.default for f in dataclasses.fields(Query)}
    assert search_flags["k"] == query_defaults["k"] and search_flags["rerank"] is query_defaults["rerank"] is None
