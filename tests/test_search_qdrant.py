"""The Qdrant store (``tvr index --out qdrant+local:PATH`` / ``qdrant+edge:PATH``, ``qdrant://HOST:PORT/COLLECTION``):
the same folder built into FAISS and into Qdrant answers every query alike (hits and scores, filters included); the
exact rerank of GARE, TV-ProxyNet and GraviAlign scores a window as the head itself does; updates follow the folder's
incremental rules and a failed one leaves nothing half-visible; and bad input — another model, another vector size,
a collection tvr did not write, an unreachable host, a bad scheme, a key in the address — is refused in one line.

Qdrant runs here through ``qdrant-client``'s local mode and ``qdrant-edge-py`` (Qdrant's engine in-process): no
server, no network. Every test skips when its package is absent."""

from __future__ import annotations

import http.server
import importlib.util
import json
import shutil
import socket
import threading
from pathlib import Path

import numpy as np
import pytest
import torch
from search_fixtures import VIDEOS, exhaustive_video_state, index_args, write_colour_video
from typer.testing import CliRunner

from tvr.cli import app
from tvr.models.run_spec import resolve_run
from tvr.search import open_index
from tvr.search.build import IndexOptions, build_index
from tvr.search.encoders import CheckpointEncoder, EncoderMismatchError
from tvr.search.store import IndexFormatError
from tvr.utils.errors import UserError

runner = CliRunner()
HAS_CLIENT = importlib.util.find_spec("qdrant_client") is not None
HAS_EDGE = importlib.util.find_spec("qdrant_edge") is not None
LOCAL = pytest.param("local", marks=pytest.mark.skipif(not HAS_CLIENT, reason="qdrant-client is not installed"))
EDGE = pytest.param("edge", marks=pytest.mark.skipif(not HAS_EDGE, reason="qdrant-edge-py is not installed"))
needs_client = pytest.mark.skipif(not HAS_CLIENT, reason="qdrant-client is not installed")
#: the filters every comparison runs with (the fixture's red, green, blue at the top, yellow and magenta in sub/)
FILTERS = [{}, {"under": "sub"}, {"under": "sub/yellow.mp4"}, {"between": "1,3"}, {"under": "sub", "between": "4.5,20"}]


def refused(result, needle: str) -> None:  # noqa: ANN001
    """The command stopped with exit code 2 and one line of error (besides the hint about ``--debug``, and
    transformers' progress bar while a ``--model`` loads) saying ``needle``."""
    assert result.exit_code == 2, result.output
    lines = [
        line
        for line in result.output.splitlines()
        if line.strip() and not line.startswith(("(--debug", "Loading weights"))
    ]
    assert len(lines) == 1 and lines[0].startswith("error: ") and needle in lines[0], result.output


def address(kind: str, folder: Path) -> str:
    return f"qdrant+{kind}:{folder}"


def window_scores(index) -> dict[tuple[str, float, float], float]:  # noqa: ANN001
    """Every window's score for every caption (``all_windows``, every window reranked)."""
    return {
        (caption, h.video, h.start, h.end): h.score
        for caption, _, _ in VIDEOS.values()
        for h in index.search(caption, k=index.rows, all_windows=True, rerank=index.rows)
    }


def assert_same_hits(a: list, b: list, scores_a: dict, caption: str) -> None:
    """``b`` is ``a`` up to the order of tied windows: rank by rank the same score (|Δ| ≤ 1e-5), and where the
    window differs, ``b``'s window scores the same in ``a``'s index (windows of a still video tie)."""
    assert len(a) == len(b), (a, b)
    for x, y in zip(a, b, strict=True):
        assert x.rank == y.rank and abs(x.score - y.score) <= 1e-5, (x, y)
        if (x.video, x.start, x.end) != (y.video, y.start, y.end):
            assert abs(scores_a[(caption, y.video, y.start, y.end)] - x.score) <= 1e-5, (x, y)


@pytest.fixture(scope="module")
def folder_index(search_setup, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("qdrant-vs-faiss") / "idx"
    assert runner.invoke(app, index_args(search_setup.videos, out, search_setup.checkpoint)).exit_code == 0
    return out


@pytest.mark.parametrize("kind", [LOCAL, EDGE])
def test_faiss_and_qdrant_answer_every_query_alike(kind: str, search_setup, folder_index: Path, tmp_path) -> None:
    """The same folder into FAISS and into Qdrant: every caption, one result per video and every window, with each
    filter, gets the same hits and scores; the command line prints the same JSON."""
    target = address(kind, tmp_path / "store")
    result = runner.invoke(app, index_args(search_setup.videos, target, search_setup.checkpoint))
    assert result.exit_code == 0, result.output
    said = " ".join(result.output.split())  # the console folds long lines
    assert "5 videos, 8 windows" in said and "flat shortlist in Qdrant" in said
    report = json.loads((tmp_path / "store" / "report.json").read_text())
    assert report["index"] == target and report["ann"]["engine"] == "qdrant" and report["ann"]["kind"] == "flat"
    faiss, qdrant = open_index(folder_index), open_index(target)
    try:
        assert qdrant.rows == faiss.rows == 8 and qdrant.videos == faiss.videos
        scores = window_scores(faiss)
        assert len(scores) == 5 * 8
        for caption, _, _ in VIDEOS.values():
            for where in FILTERS:
                for k, all_windows in ((1, False), (3, False), (10, False), (3, True), (8, True)):
                    a = faiss.search(caption, k=k, all_windows=all_windows, **where)
                    b = qdrant.search(caption, k=k, all_windows=all_windows, **where)
                    assert_same_hits(a, b, scores, caption)
        for where in FILTERS:
            assert qdrant.count(**where) == faiss.count(**where)
    finally:
        qdrant.close()  # a local or Edge folder is one process's at a time: the command below opens it again
    rows = []
    for index in (str(folder_index), target):
        result = runner.invoke(app, ["search", index, "a yellow screen", "-k", "3", "--under", "sub", "--json"])
        assert result.exit_code == 0, result.output
        rows.append(json.loads(result.stdout))
    assert [r["video"] for r in rows[0]] == [r["video"] for r in rows[1]] == ["sub/yellow.mp4", "sub/magenta.mp4"]
    np.testing.assert_allclose([r["score"] for r in rows[0]], [r["score"] for r in rows[1]], rtol=0, atol=1e-5)
    # tvr serve's API and tvr eval-search answer from the collection as from the folder
    from fastapi.testclient import TestClient

    from tvr.search.server import create_app

    labelled = tmp_path / "queries.csv"
    labelled.write_text("query,video\n" + "".join(f"{c},{v}\n" for v, (c, _, _) in VIDEOS.items()))
    api, metrics = [], []
    for index in (str(folder_index), target):
        opened = open_index(index)
        try:
            with TestClient(create_app(opened)) as client:
                answer = client.get("/api/search", params={"q": "a blue screen", "k": 3, "between": "0,2.5"})
            assert answer.status_code == 200, answer.text
            api.append([(h["video"], h["start"], h["end"]) for h in answer.json()])
        finally:
            opened.close()
        result = runner.invoke(app, ["eval-search", index, str(labelled), "--json"])
        assert result.exit_code == 0, result.output
        metrics.append(json.loads(result.stdout)["metrics"])
    assert api[0] == api[1] and api[0][0] == ("blue.mp4", 0.0, 2.5)
    assert metrics[0] == metrics[1]


def test_filters_are_exact_on_faiss(folder_index: Path) -> None:
    """A filter keeps exactly the windows it names, best first as without it: the unfiltered ranking of every
    window, restricted to the folder / the span, is the filtered answer (the shortlist widens until enough pass)."""
    index = open_index(folder_index)
    for caption, _, _ in VIDEOS.values():
        everything = index.search(caption, k=8, all_windows=True)
        for where, keep in (
            ({"under": "sub"}, lambda h: h.video.startswith("sub/")),
            ({"under": "./sub/"}, lambda h: h.video.startswith("sub/")),
            ({"under": "sub/magenta.mp4"}, lambda h: h.video == "sub/magenta.mp4"),
            ({"between": "4.5,20"}, lambda h: h.start < 20 and h.end > 4.5),
            ({"between": (0, 1)}, lambda h: h.start < 1),
        ):
            kept = [(h.video, h.start, h.end, h.score) for h in everything if keep(h)]
            for k in (1, 2, 8):
                got = index.search(caption, k=k, all_windows=True, **where)
                assert [(h.video, h.start, h.end, h.score) for h in got] == kept[:k], (caption, where, k)
            assert index.count(**where) == len(kept)
        assert index.search(caption, k=5, under="nothing/here") == []
        assert [h.video for h in index.search(caption, k=5, under="su")] == []  # whole path components only
    for bad, message in (
        ({"under": "/etc"}, "relative to the indexed folder"),
        ({"under": "../x"}, "relative to the indexed folder"),
        ({"under": " "}, "relative to the indexed folder"),
        ({"between": "5"}, "START,END"),
        ({"between": "3,1"}, "START < END"),
        ({"between": "a,b"}, "START,END"),
        ({"between": "-1,3"}, "0 <= START"),
        ({"between": "1,inf"}, "START,END"),
    ):
        with pytest.raises(UserError, match=message):
            index.search("a red screen", **bad)


def test_filters_from_the_command_line_and_the_api(folder_index: Path) -> None:
    from fastapi.testclient import TestClient

    from tvr.search.server import create_app

    result = runner.invoke(app, ["search", str(folder_index), "a red screen", "--between", "4.5,20", "--json"])
    assert result.exit_code == 0, result.output
    assert [r["video"] for r in json.loads(result.stdout)] == ["sub/yellow.mp4"]  # the only video longer than 4.5 s
    for args, message in (
        (["--between", "20,4"], "--between '20,4': expected START,END"),
        (["--under", "/abs"], "--under '/abs': expected a folder"),
        (
            ["--under", "sub", "--video", str(folder_index / "manifest.json"), "--captions", "x"],
            "--under and --between",
        ),
    ):
        refused(
            runner.invoke(app, ["search", str(folder_index), *([] if "--video" in args else ["red"]), *args]), message
        )
    client = TestClient(create_app(open_index(folder_index)))
    answer = client.get("/api/search", params={"q": "a red screen", "k": 5, "under": "sub"})
    assert answer.status_code == 200 and {h["video"] for h in answer.json()} == {"sub/yellow.mp4", "sub/magenta.mp4"}
    answer = client.get("/api/search", params={"q": "a red screen", "between": "4.5,20", "all_windows": "true"})
    assert answer.status_code == 200 and {(h["start"], h["end"]) for h in answer.json()} == {
        (2.0, 6.0),
        (4.0, 8.0),
        (5.0, 9.0),
    }
    for params, needle in (({"under": "../x"}, "under '../x'"), ({"between": "nope"}, "between 'nope'")):
        answer = client.get("/api/search", params={"q": "red", **params})
        assert answer.status_code == 422 and needle in answer.json()["error"]
    page = client.get("/").text
    assert 'id="under"' in page and 'id="between"' in page


# --------------------------------------------------------------------------------------------- the exact rerank


def head_checkpoint(search_setup, target: Path, head: dict) -> Path:
    """The trained tiny backbone under another head (at its initialisation); TV-ProxyNet reads per-video proxies,
    which a tiny CLIP-ViP with its proxy projection makes (randomly initialised: the scores need no training)."""
    from tvr.config import config_from_dict, config_to_dict
    from tvr.models.build import build_model
    from tvr.models.checkpoint import load_model
    from tvr.pipeline import resolve_config
    from tvr.train.checkpoint import save_checkpoint

    trained, cfg = load_model(search_setup.checkpoint)
    values = config_to_dict(cfg)
    values["head"] = {"logit_scale_init": 2.6592, **head}
    proxies = head["name"] == "proxy"
    if proxies:
        values["model"].update(
            {"backbone": "clipvip", "temporal": "none", "clipvip": {"num_proxies": 4, "proxy_projection": True}}
        )
        values["data"]["sampling"] = "clipvip"
        values["head"]["options"] = {"ffn_dim": 16, "gamma": 0.3}
    head_cfg = config_from_dict(values)
    head_cfg = resolve_config(head_cfg)
    torch.manual_seed(0)
    model = build_model(resolve_run(head_cfg))
    if not proxies:
        own = model.state_dict()
        own.update({k: v for k, v in trained.state_dict().items() if not k.startswith("head.")})
        model.load_state_dict(own)
    save_checkpoint(target, model, config=head_cfg)
    return target


@pytest.mark.parametrize("kind", [LOCAL, EDGE])
@pytest.mark.parametrize(
    "head",
    [
        {"name": "gare", "options": {"psi_init": "identity"}},
        {"name": "proxy"},
        {"name": "gravialign", "options": {"inference_mode": "s_align"}},
    ],
    ids=["gare", "tv-proxynet", "gravialign"],
)
def test_reranked_scores_are_the_heads_own(head: dict, kind: str, search_setup, tmp_path: Path) -> None:
    """A non-indexable head on a Qdrant store: every window, reranked from the shards the points lead to, scores what
    ``head.score`` gives on that window's features (|Δ| ≤ 1e-5), and the order is the exact one."""
    encoder = CheckpointEncoder(head_checkpoint(search_setup, tmp_path / "head.pt", head))
    assert not encoder.head.indexable
    options = IndexOptions(window=4.0, stride=2.0, workers=1, progress=False, shard_windows=3)
    target = address(kind, tmp_path / "store")
    build_index(search_setup.videos, target, encoder, options)
    index = open_index(target, encoder=encoder)
    assert index.state_cls is not None and len(index.readers) > 1
    video_state, labels = exhaustive_video_state(search_setup.videos, index, encoder)
    with torch.no_grad():
        for caption, _, _ in VIDEOS.values():
            exact = encoder.head.score(encoder.encode_texts([caption]), video_state)[0]
            hits = index.search(caption, k=len(labels), rerank=len(labels), all_windows=True)
            found = [labels.index((h.video, h.start, h.end)) for h in hits]
            assert sorted(found) == list(range(len(labels)))
            np.testing.assert_allclose([h.score for h in hits], exact[found].numpy(), rtol=0, atol=1e-5)
            assert all(a >= b - 1e-6 for a, b in zip(exact[found], exact[found][1:], strict=False))
            assert {h.video for h in index.search(caption, k=2, under="sub")} == {"sub/magenta.mp4", "sub/yellow.mp4"}
    index.close()


# --------------------------------------------------------------------------------------------- updates


def points(target: str) -> list[tuple]:
    """Every window point of a store: (video, window, start, end, model), sorted, with its vector."""
    from tvr.search.stores import parse_target

    engine = parse_target(target).engine()
    try:
        found = sorted(
            (p["video"], p["window"], p["start"], p["end"], p["model"])
            for p in engine.scroll([("match", "kind", "window")])
        )
    finally:
        engine.close()
    return found


def assert_same_collection(a: str, b: str) -> None:
    """Two local-mode stores hold the same index: every window point (payload and vector bytes), every video record
    (but where in the shards it is, and the mtime: they differ between runs and copies), the manifest's rows and
    shortlist."""
    from qdrant_client import QdrantClient

    from tvr.search.stores import parse_target

    def read(target: str) -> tuple:
        client = QdrantClient(path=str(parse_target(target).folder / "qdrant"))
        try:
            found, offset = [], None
            while True:
                batch, offset = client.scroll("tvr", limit=256, offset=offset, with_payload=True, with_vectors=True)
                found += batch
                if offset is None:
                    break
        finally:
            client.close()
        windows = sorted(
            (str(p.id), json.dumps(p.payload, sort_keys=True), np.asarray(p.vector["window"], np.float32).tobytes())
            for p in found
            if p.payload["kind"] == "window"
        )
        records = sorted(
            (str(p.id), {k: v for k, v in p.payload.items() if k not in ("shard", "rows", "mtime_ns")})
            for p in found
            if p.payload["kind"] == "video"
        )
        (manifest,) = [p.payload for p in found if p.payload["kind"] == "manifest"]
        return windows, records, manifest["rows"], manifest["ann"], manifest["store"]

    assert read(a) == read(b)


@pytest.mark.parametrize("kind", [LOCAL, EDGE])
def test_a_changed_folder_updates_only_what_changed(kind: str, search_setup, tmp_path: Path) -> None:
    """The folder index's incremental rules on a Qdrant store: a deleted video's points go, a changed one is
    embedded again (its old windows gone), a new one is added, the others are kept; the result answers as a fresh
    build of the changed folder does; a run on an unchanged folder embeds nothing."""
    videos = tmp_path / "videos"
    shutil.copytree(search_setup.videos, videos)
    target = address(kind, tmp_path / "store")
    assert runner.invoke(app, index_args(videos, target, search_setup.checkpoint)).exit_code == 0
    before = points(target)
    (videos / "blue.mp4").unlink()
    write_colour_video(videos / "sub" / "yellow.mp4", (230, 220, 30), 2.0)  # changed: one window instead of four
    (videos / "new").mkdir()
    shutil.copy(search_setup.videos / "red.mp4", videos / "new" / "red2.mp4")
    result = runner.invoke(app, index_args(videos, target, search_setup.checkpoint))
    assert result.exit_code == 0, result.output
    report = json.loads((tmp_path / "store" / "report.json").read_text())
    assert report["embedded"] == 2 and report["reused"] == 3 and report["dropped"] == ["blue.mp4"]
    after = points(target)
    assert [p for p in before if p[0] not in ("blue.mp4", "sub/yellow.mp4")] == [
        p for p in after if p[0] not in ("new/red2.mp4", "sub/yellow.mp4")
    ]
    assert [p[:2] for p in after if p[0] == "sub/yellow.mp4"] == [("sub/yellow.mp4", 0)]
    fresh = address(kind, tmp_path / "fresh")
    assert runner.invoke(app, index_args(videos, fresh, search_setup.checkpoint)).exit_code == 0
    assert points(fresh) == after
    updated, rebuilt = open_index(target), open_index(fresh)
    try:
        assert updated.videos == [
            {**v, "mtime_ns": u["mtime_ns"]} for v, u in zip(rebuilt.videos, updated.videos, strict=True)
        ]
        scores = window_scores(rebuilt)
        for caption, _, _ in VIDEOS.values():
            a, b = rebuilt.search(caption, k=9, all_windows=True), updated.search(caption, k=9, all_windows=True)
            assert_same_hits(a, b, scores, caption)  # red.mp4 and its copy tie
        assert {h.video for h in updated.search("a red screen", k=2)} == {"red.mp4", "new/red2.mp4"}
    finally:
        updated.close()
        rebuilt.close()
    assert runner.invoke(app, index_args(videos, target, search_setup.checkpoint)).exit_code == 0
    assert json.loads((tmp_path / "store" / "report.json").read_text())["embedded"] == 0
    assert points(target) == after


@needs_client
def test_a_failed_sync_is_never_searched_and_the_next_run_finishes_it(
    search_setup, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The collection is written after the videos are embedded; a job that stops in the middle of it (here: the
    engine fails on the second upsert) leaves the collection marked unfinished, refused by every query, and the
    next run (nothing embedded again) ends with what an uninterrupted run writes."""
    from tvr.search.stores import qdrant_engines

    encoder = CheckpointEncoder(search_setup.checkpoint)
    options = IndexOptions(window=4.0, stride=2.0, workers=1, progress=False, shard_windows=1)
    whole = address("local", tmp_path / "whole")
    build_index(search_setup.videos, whole, encoder, options)
    target = address("local", tmp_path / "store")
    real = qdrant_engines.ClientEngine.upsert
    calls = []

    def failing(self, ids, vectors, payloads):  # noqa: ANN001, ANN202
        calls.append(len(ids))
        if len(calls) == 3:  # the manifest, the first windows, then this
            raise qdrant_engines.QdrantError("the connection dropped")
        return real(self, ids, vectors, payloads)

    monkeypatch.setattr(qdrant_engines, "BATCH", 2)
    monkeypatch.setattr(qdrant_engines.ClientEngine, "upsert", failing)
    with pytest.raises(qdrant_engines.QdrantError, match="the connection dropped"):
        build_index(search_setup.videos, target, encoder, options)
    monkeypatch.undo()
    with pytest.raises(IndexFormatError, match="not finished"):
        open_index(target, encoder=encoder)
    refused(runner.invoke(app, ["search", target, "a red screen"]), "not finished")
    report = build_index(search_setup.videos, target, encoder, options)
    assert report["embedded"] == 0 and report["reused"] == 5
    assert points(target) == points(whole)
    index = open_index(target, encoder=encoder)
    assert [h.video for h in index.search("a red screen", k=1)] == ["red.mp4"]
    index.close()


# --------------------------------------------------------------------------------------------- refused


@needs_client
def _collection(folder: Path, size: int, *points) -> None:  # noqa: ANN002
    """A local collection ``tvr`` in ``folder`` with ``size``-float ``window`` vectors, holding ``points``."""
    from qdrant_client import QdrantClient, models

    client = QdrantClient(path=str(folder / "qdrant"))
    vectors = {"window": models.VectorParams(size=size, distance=models.Distance.DOT)}
    client.create_collection("tvr", vectors_config=vectors)
    if points:
        client.upsert("tvr", list(points))
    client.close()


def test_another_model_or_vector_size_or_foreign_collection_is_refused(search_setup, tmp_path: Path) -> None:
    from qdrant_client import QdrantClient, models
    from test_search import other_checkpoint

    args = index_args
    target = address("local", tmp_path / "store")
    assert runner.invoke(app, args(search_setup.videos, target, search_setup.checkpoint)).exit_code == 0
    other = other_checkpoint(search_setup.checkpoint, tmp_path / "other.pt")
    with pytest.raises(EncoderMismatchError, match="was built with checkpoint"):
        open_index(target, checkpoint=other)
    # the collection itself says which model wrote it: a fresh state folder beside a copy of it is refused too
    shutil.copytree(tmp_path / "store" / "qdrant", tmp_path / "copy" / "qdrant")
    result = runner.invoke(app, args(search_setup.videos, address("local", tmp_path / "copy"), other))
    refused(result, "was built with")
    # a collection of another vector size
    client = QdrantClient(path=str(tmp_path / "sized" / "qdrant"))
    client.create_collection(
        "tvr", vectors_config={"window": models.VectorParams(size=3, distance=models.Distance.DOT)}
    )
    client.close()
    result = runner.invoke(
        app, args(search_setup.videos, address("local", tmp_path / "sized"), search_setup.checkpoint)
    )
    refused(result, "'window' vectors have 3 floats")
    # a collection holding points tvr did not write
    client = QdrantClient(path=str(tmp_path / "foreign" / "qdrant"))
    client.create_collection(
        "tvr", vectors_config={"window": models.VectorParams(size=3, distance=models.Distance.DOT)}
    )
    client.upsert("tvr", [models.PointStruct(id=1, vector={"window": [1.0, 0.0, 0.0]}, payload={"x": 1})])
    client.close()
    result = runner.invoke(
        app, args(search_setup.videos, address("local", tmp_path / "foreign"), search_setup.checkpoint)
    )
    refused(result, "holds points tvr index did not write")
    with pytest.raises(IndexFormatError, match="not a tvr search index"):
        open_index(address("local", tmp_path / "foreign"))
    # a manifest whose vectors were changed under it
    source = QdrantClient(path=str(tmp_path / "store" / "qdrant"))
    from tvr.search.stores.qdrant import MANIFEST_ID

    manifest = source.retrieve("tvr", [MANIFEST_ID], with_payload=True)[0].payload
    source.close()
    client = QdrantClient(path=str(tmp_path / "resized" / "qdrant"))
    client.create_collection(
        "tvr", vectors_config={"window": models.VectorParams(size=5, distance=models.Distance.DOT)}
    )
    client.upsert("tvr", [models.PointStruct(id=MANIFEST_ID, vector={}, payload=manifest)])
    client.close()
    with pytest.raises(IndexFormatError, match="vectors of size 5.*the collection was changed"):
        open_index(address("local", tmp_path / "resized"))
    with pytest.raises(IndexFormatError, match="no such collection"):
        open_index(address("local", tmp_path / "nothing"))


@pytest.mark.parametrize("kind", [LOCAL, EDGE])
def test_a_pretrained_model_indexes_into_qdrant_and_another_is_refused(
    kind: str, search_setup, dual_encoders, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``tvr index --model`` (a tiny CLIP) into a collection: the collection carries the model's stamp and answers
    as the folder index of the same model does; a SigLIP is refused in a line — adding to the same store, adding to a
    copy of the collection alone (the collection itself says which model wrote it), and opening it."""
    window = ["--window", "2", "--stride", "1", "-j", "1"]
    target = address(kind, tmp_path / "store")
    for out in (str(tmp_path / "idx"), target):
        args = ["index", str(search_setup.videos), "--out", out, "--model", str(dual_encoders.clip), *window]
        result = runner.invoke(app, args)
        assert result.exit_code == 0, result.output
    faiss, qdrant = open_index(tmp_path / "idx"), open_index(target)
    try:
        stamp = qdrant.manifest["model"]
        assert stamp == faiss.manifest["model"] and (stamp["encoder"], stamp["family"]) == ("pretrained", "clip")
        assert qdrant.rows == faiss.rows and qdrant.videos == faiss.videos
        scores = window_scores(faiss)
        for caption, _, _ in VIDEOS.values():
            for where in FILTERS:
                for k, all_windows in ((3, False), (4, True)):
                    a = faiss.search(caption, k=k, all_windows=all_windows, **where)
                    b = qdrant.search(caption, k=k, all_windows=all_windows, **where)
                    assert_same_hits(a, b, scores, caption)
    finally:
        qdrant.close()
    siglip = ["--model", str(dual_encoders.siglip), *window]
    result = runner.invoke(app, ["index", str(search_setup.videos), "--out", target, *siglip])
    refused(result, "was built with the pretrained model")
    engine_folder = "qdrant" if kind == "local" else "edge"
    shutil.copytree(tmp_path / "store" / engine_folder, tmp_path / "copy" / engine_folder)
    result = runner.invoke(app, ["index", str(search_setup.videos), "--out", address(kind, tmp_path / "copy"), *siglip])
    refused(result, "was built with the pretrained model")
    monkeypatch.setenv("TVR_QUICK_QUERIES", "0")  # the model given, not the exported text side of the index's own
    with pytest.raises(EncoderMismatchError, match="built with the pretrained model"):
        open_index(target, model=str(dual_encoders.siglip))


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]  # closed again when the socket is: nothing listens there


@needs_client
def test_bad_addresses_and_unreachable_hosts_are_one_line(
    search_setup, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TVR_QDRANT_TIMEOUT", "2")
    videos, checkpoint = search_setup.videos, search_setup.checkpoint
    for out, message in (
        ("http://localhost:6333/videos", "unknown scheme 'http'"),
        ("qdrnt://localhost:6333/videos", "unknown scheme 'qdrnt'"),
        ("qdrant:videos", "expected qdrant://HOST:PORT/COLLECTION"),
        ("qdrant://localhost:6333/", "expected qdrant://HOST:PORT/COLLECTION"),
        ("qdrant://localhost:99999/videos", "the port is not a number"),
        ("qdrant://key:secret@localhost:6333/videos", "put the API key in QDRANT_API_KEY"),
        ("qdrant://localhost:6333/videos", "name the folder of the index's rerank state with --state DIR"),
        ("qdrant+local:", "no folder after qdrant+local:"),
    ):
        result = runner.invoke(app, ["index", str(videos), "--out", out, "--checkpoint", str(checkpoint)])
        refused(result, message)
        assert "secret" not in result.output
    port = _closed_port()
    unreachable = f"qdrant://127.0.0.1:{port}/videos"
    args = ["index", str(videos), "--out", unreachable, "--state", str(tmp_path / "state"), "--checkpoint", "nope.pt"]
    result = runner.invoke(app, args)  # refused before the (missing) checkpoint is even looked at
    refused(result, f"{unreachable}: cannot reach the Qdrant server")
    for command in (["search", unreachable, "a red screen"], ["eval-search", unreachable, __file__]):
        result = runner.invoke(app, command)
        refused(result, "cannot reach the Qdrant server")
    with pytest.raises(UserError, match="cannot reach the Qdrant server"):
        open_index(unreachable)
    with pytest.raises(UserError, match="unknown scheme 'ftp'"):
        open_index("ftp://example.org/videos")


@needs_client
def test_the_api_key_comes_from_the_environment_and_stays_out_of_messages(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """``QDRANT_API_KEY`` is sent as Qdrant's ``api-key`` header; a server that refuses it gets a line asking for
    another, without the key — from Python and from the command line, in no log record either; no command takes a
    key as an option."""
    seen: list[str | None] = []

    class Refusing(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 - the handler's name in http.server
            seen.append(self.headers.get("api-key"))
            body = json.dumps({"status": {"error": "Invalid api-key"}}).encode()
            self.send_response(401)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args) -> None:  # noqa: ANN002
            pass

    server = http.server.HTTPServer(("127.0.0.1", 0), Refusing)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        monkeypatch.setenv("QDRANT_API_KEY", "s3cret-key")
        caplog.set_level("DEBUG")
        with pytest.raises(UserError) as info:
            open_index(f"qdrant://127.0.0.1:{server.server_port}/videos")
        result = runner.invoke(app, ["search", f"qdrant://127.0.0.1:{server.server_port}/videos", "a red screen"])
        refused(result, "set QDRANT_API_KEY to a key it accepts")
        assert "s3cret" not in result.output and "s3cret" not in caplog.text
    finally:
        server.shutdown()
        server.server_close()
    message = str(info.value)
    assert "401" in message and "set QDRANT_API_KEY to a key it accepts" in message and "s3cret" not in message
    assert seen and set(seen) == {"s3cret-key"}
    for command in ("index", "search", "serve", "eval-search"):
        assert "api-key" not in runner.invoke(app, [command, "--help"]).output.lower()


def _nested(depth: int) -> dict:
    value: dict = {}
    for _ in range(depth):
        value = {"a": value}
    return value


@needs_client
def test_a_tampered_collection_is_refused_in_a_line(search_setup, tmp_path: Path) -> None:
    """A collection's points are data: a video record naming a path outside the indexed folder, a manifest without
    its settings, a window hit naming a window its video does not have — each refused in one line, never followed."""
    from qdrant_client import QdrantClient

    from tvr.search.stores.qdrant import MANIFEST_ID, record_id, window_id

    pristine = tmp_path / "pristine"
    target = address("local", pristine)
    assert runner.invoke(app, index_args(search_setup.videos, target, search_setup.checkpoint)).exit_code == 0

    def tampered(name: str, point: str, change: dict) -> str:
        shutil.copytree(pristine, tmp_path / name)
        client = QdrantClient(path=str(tmp_path / name / "qdrant"))
        client.set_payload("tvr", change, points=[point])
        client.close()
        return address("local", tmp_path / name)

    for name, point, change, match in (
        ("outside", record_id("red.mp4"), {"video": "../../etc/passwd"}, "is not one tvr index writes"),
        ("shard", record_id("red.mp4"), {"shard": "../elsewhere"}, "is not one tvr index writes"),
        ("rows", record_id("red.mp4"), {"windows": 7}, "is not one tvr index writes"),
        ("source", MANIFEST_ID, {"source": "/"}, "'source' is a string; expected the indexed folder"),
        ("stride", MANIFEST_ID, {"stride": -2}, "'stride' is a number; expected a positive number"),
        ("store", MANIFEST_ID, {"store": {"format": "x"}}, "not one tvr index writes"),
        ("unfinished", MANIFEST_ID, {"store": {"format": "tvr-qdrant-store", "version": 1}}, "not finished"),
        ("deep", MANIFEST_ID, {"model": _nested(150)}, "nested more than 100 levels deep"),
    ):
        with pytest.raises(IndexFormatError, match=match) as info:
            open_index(tampered(name, point, change))
        assert "\n" not in str(info.value)
    index = open_index(tampered("window", window_id("red.mp4", 0), {"window": 5}))
    try:
        with pytest.raises(IndexFormatError, match="window 5, which its video records do not hold"):
            index.search("a red screen", k=1)
    finally:
        index.close()
