"""``tvr index`` / ``tvr search`` / ``tvr.search.open_index`` on real (tiny) videos with a trained tiny checkpoint:
windows, the CLI and JSON fields, bad files, a build killed with SIGKILL and resumed, a changed folder, a mismatched
model, exact GARE reranking against exhaustive scoring, the ANN kinds, and ranking captions for a clip."""

from __future__ import annotations

import csv
import importlib.util
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch
from search_fixtures import VIDEOS, exhaustive_video_state, index_args, write_colour_video
from typer.testing import CliRunner

from tvr.cli import app
from tvr.models.run_spec import resolve_run
from tvr.search import Hit, ann, open_index
from tvr.search.build import IndexOptions, build_index
from tvr.search.encoders import CheckpointEncoder, EncoderMismatchError
from tvr.search.layout import ANN_FILE, MANIFEST, TABLES
from tvr.search.windows import DEFAULT_STRIDE, DEFAULT_WINDOW, plan_windows
from tvr.utils.errors import UserError
from tvr.utils.io import is_temporary_name

OPTIONS = IndexOptions(window=4.0, stride=2.0, workers=1, progress=False)
HAS_QDRANT_CLIENT = importlib.util.find_spec("qdrant_client") is not None
runner = CliRunner()


def logical(index: Path) -> dict:
    """What a query can see of an index: manifest (minus the run-specific shard names), each row's video and times,
    the embeddings in row order, and the FAISS file's bytes (where a row sits inside which shard may differ)."""
    manifest = json.loads((index / MANIFEST).read_text())
    opened = open_index(index)
    emb = np.stack(
        [opened.readers[int(s)].emb[int(r)] for s, r in zip(opened.table_shard, opened.table_row, strict=True)]
    )
    manifest.pop("shards")
    return {
        "manifest": manifest,
        "tables": [np.asarray(np.load(index / t)) for t in TABLES[2:]],
        "emb": emb,
        "ann": (index / ANN_FILE).read_bytes(),
    }


def assert_same_index(a: Path, b: Path) -> None:
    la, lb = logical(a), logical(b)
    for key in ("videos", "rows", "ann", "window", "stride", "frames"):
        if key == "videos":  # mtimes differ between copies of a folder; sizes and windows do not
            strip = [{k: v for k, v in e.items() if k != "mtime_ns"} for e in la["manifest"][key]]
            assert strip == [{k: v for k, v in e.items() if k != "mtime_ns"} for e in lb["manifest"][key]]
        else:
            assert la["manifest"][key] == lb["manifest"][key], key
    for x, y in zip(la["tables"], lb["tables"], strict=True):
        np.testing.assert_array_equal(x, y)
    np.testing.assert_array_equal(la["emb"], lb["emb"])
    assert la["ann"] == lb["ann"]


# --------------------------------------------------------------------------------------------- windows


def test_windows_cover_the_video_with_overlap() -> None:
    assert (DEFAULT_WINDOW, DEFAULT_STRIDE) == (10.0, 5.0)
    assert plan_windows(7.5) == [(0.0, 7.5)]  # a short video is one window
    assert plan_windows(10.0) == [(0.0, 10.0)]
    assert plan_windows(20.0) == [(0.0, 10.0), (5.0, 15.0), (10.0, 20.0)]
    # the last window ends at the end, overlapping its neighbour more than the others do
    assert plan_windows(23.0) == [(0.0, 10.0), (5.0, 15.0), (10.0, 20.0), (13.0, 23.0)]
    assert plan_windows(9.0, 4.0, 2.0) == [(0.0, 4.0), (2.0, 6.0), (4.0, 8.0), (5.0, 9.0)]
    with pytest.raises(ValueError, match="stride"):
        plan_windows(20.0, 4.0, 5.0)  # a gap between windows would leave footage unsearchable
    with pytest.raises(ValueError, match="window"):
        plan_windows(20.0, 0.0, 1.0)


# --------------------------------------------------------------------------------------------- index + search


@pytest.fixture(scope="module")
def built(search_setup, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("index") / "idx"
    result = runner.invoke(app, index_args(search_setup.videos, out, search_setup.checkpoint, "-j", "2"))
    assert result.exit_code == 0, result.output
    return out


def test_search_finds_the_described_video(built: Path, search_setup) -> None:
    index = open_index(built)
    assert len(index) == len(VIDEOS)
    for name, (caption, _, _) in VIDEOS.items():
        hits = index.search(caption, k=3)
        assert isinstance(hits[0], Hit) and hits[0].video == name, (caption, hits)
        assert [h.rank for h in hits] == [1, 2, 3]
        assert len({h.video for h in hits}) == 3  # one result per video
        assert hits[0].score >= hits[1].score >= hits[2].score
    # the 9-second video is indexed as 4-second windows every 2 seconds; each hit says where it is
    windows = index.search("a yellow screen", k=4, all_windows=True)
    assert [(h.start, h.end) for h in windows if h.video == "sub/yellow.mp4"] != []
    assert {(h.start, h.end) for h in windows} <= {(0.0, 4.0), (2.0, 6.0), (4.0, 8.0), (5.0, 9.0)}
    report = json.loads((built / "report.json").read_text())
    assert report["indexed"] == 5 and report["rows"] == 8 and report["bad"] == [] and report["ann"]["kind"] == "flat"


def test_search_cli_json_and_table(built: Path) -> None:
    result = runner.invoke(app, ["search", str(built), "a blue screen", "-k", "2", "--json"])
    assert result.exit_code == 0, result.output
    rows = json.loads(result.stdout)
    assert [set(r) >= {"video", "start", "end", "score", "rank"} for r in rows] == [True, True]
    assert rows[0]["video"] == "blue.mp4" and rows[0]["rank"] == 1 and rows[0]["start"] == 0.0
    assert rows[0]["end"] == pytest.approx(2.5)
    result = runner.invoke(app, ["search", str(built), "a blue screen", "--all-windows", "-k", "8", "--json"])
    assert len(json.loads(result.stdout)) == 8  # every window of the index
    result = runner.invoke(app, ["search", str(built), "a green screen"])
    assert result.exit_code == 0 and "green.mp4" in result.stdout
    result = runner.invoke(app, ["search", str(built)])
    assert result.exit_code == 2 and "give a query" in result.output


def test_video_to_text_ranks_captions(built: Path, search_setup, tmp_path: Path) -> None:
    captions = tmp_path / "captions.txt"
    captions.write_text("\n".join(c for c, _, _ in VIDEOS.values()) + "\n\n")
    result = runner.invoke(
        app,
        [
            "search",
            str(built),
            "--video",
            str(search_setup.videos / "green.mp4"),
            "--captions",
            str(captions),
            "--json",
        ],
    )
    assert result.exit_code == 0, result.output
    rows = json.loads(result.stdout)
    assert rows[0]["caption"] == "a green screen" and len(rows) == 5
    assert [r["rank"] for r in rows] == [1, 2, 3, 4, 5]


def test_ann_kinds_agree_on_the_small_index(search_setup, tmp_path: Path) -> None:
    encoder = CheckpointEncoder(search_setup.checkpoint)
    tops = {}
    for kind in ("flat", "ivf", "hnsw"):
        options = IndexOptions(window=4.0, stride=2.0, workers=1, progress=False, ann_kind=kind, nlist=2)
        report = build_index(search_setup.videos, tmp_path / kind, encoder, options)
        assert report["ann"]["kind"] == kind
        index = open_index(tmp_path / kind, encoder=encoder)
        tops[kind] = [[h.video for h in index.search(c, k=5)] for c, _, _ in VIDEOS.values()]
    assert tops["ivf"] == tops["flat"] == tops["hnsw"]
    # the graph is built deterministically: building it again gives the same file
    options = IndexOptions(window=4.0, stride=2.0, workers=1, progress=False, ann_kind="hnsw")
    build_index(search_setup.videos, tmp_path / "hnsw2", encoder, options)
    assert (tmp_path / "hnsw2" / ANN_FILE).read_bytes() == (tmp_path / "hnsw" / ANN_FILE).read_bytes()
    # a query's search effort: the index's setting unless the caller names one, and only a positive integer
    assert ann.hnsw_graph(open_index(tmp_path / "hnsw", encoder=encoder).ann).hnsw.efSearch == 256
    assert ann.hnsw_graph(open_index(tmp_path / "hnsw", encoder=encoder, ef_search=512).ann).hnsw.efSearch == 512
    with pytest.raises(UserError, match="ef_search=0: expected a positive integer"):
        open_index(tmp_path / "hnsw", encoder=encoder, ef_search=0)


def test_hnsw_search_beam_grows_with_the_graph() -> None:
    from tvr.search import ann

    beams = {rows: ann.choose("auto", rows, 512).ef_search for rows in (60_000, 333_000, 600_000, 1_000_000)}
    assert beams == {60_000: 256, 333_000: 256, 600_000: 320, 1_000_000: 448}
    assert ann.choose("hnsw", 1000, 8).ef_search == 256 and ann.choose("auto", 1000, 8).kind == "flat"


@pytest.mark.parametrize("storage", ["float32", "float16"])
def test_hnsw_graphs_return_exact_inner_products_and_load_as_recorded(storage: str, tmp_path: Path) -> None:
    """Whatever the graph stores, a search returns the float32 inner products of the rows it finds (a float16 graph
    re-scores its candidates from a float32 copy); a manifest without ``storage`` (before issue 35 item 7) means
    a float32 graph, and the recorded beam is set on the graph inside any wrapper."""
    rng = np.random.default_rng(3)
    rows = rng.standard_normal((3000, 16)).astype(np.float32)
    queries = rng.standard_normal((5, 16)).astype(np.float32)
    settings = ann.choose("hnsw", len(rows), 16)
    assert settings.storage == ann.HNSW_STORAGE and settings.ef_construction == ann.HNSW_EF_CONSTRUCTION
    settings.storage = storage
    index = ann.build(settings, None, [rows[:1000], rows[1000:]])
    scores, found = ann.search(index, queries, 10)
    exact = queries @ rows.T
    # float32 products up to summation order (float16 vectors would be off by ~1e-3 of a score this size)
    np.testing.assert_allclose(scores, np.take_along_axis(exact, found, axis=1), rtol=0, atol=1e-5)
    assert (np.sort(found, axis=1) == np.sort(np.argsort(-exact, axis=1)[:, :10], axis=1)).all()
    ann.save(index, tmp_path / "ann.faiss")
    recorded = settings.to_dict()
    if storage == "float32":  # as an index built before issue 35 item 7 records it
        del recorded["storage"], recorded["ef_construction"]
    loaded = ann.load(tmp_path / "ann.faiss", recorded, ef_search=77)
    assert ann.hnsw_graph(loaded).hnsw.efSearch == 77
    assert type(ann.hnsw_graph(loaded)).__name__ == ("IndexHNSWFlat" if storage == "float32" else "IndexHNSWSQ")
    np.testing.assert_array_equal(ann.search(loaded, queries, 10)[1], found)


@pytest.mark.parametrize("kind", ["flat", "hnsw", "ivf"])
def test_faiss_thread_counts_are_set_per_call_and_restored(kind: str) -> None:
    """Building and searching set FAISS's OpenMP threads for their own call only: the caller's setting survives."""
    import faiss

    from tvr.search import ann

    rows = np.random.default_rng(0).standard_normal((400, 8)).astype(np.float32)
    settings = ann.choose(kind, len(rows), 8, nlist=4)
    before = faiss.omp_get_max_threads()
    try:
        faiss.omp_set_num_threads(3)
        index = ann.build(settings, rows, [rows[:150], rows[150:]])
        assert faiss.omp_get_max_threads() == 3
        for queries in (rows[:1], rows[:5]):
            ann.search(index, queries, 4)
            assert faiss.omp_get_max_threads() == 3
    finally:
        faiss.omp_set_num_threads(before)


# --------------------------------------------------------------------------------------------- bad files


def test_bad_files_are_skipped_and_reported(search_setup, tmp_path: Path) -> None:
    videos = tmp_path / "videos"
    shutil.copytree(search_setup.videos, videos)
    (videos / "empty.mp4").write_bytes(b"")
    (videos / "noise.mp4").write_bytes(os.urandom(4096))
    (videos / "notes.mkv").write_text("not a video at all\n")
    data = (videos / "red.mp4").read_bytes()
    (videos / "cut.mp4").write_bytes(data[: len(data) // 3])  # the index is at the front: opens, then breaks
    result = runner.invoke(app, index_args(videos, tmp_path / "idx", search_setup.checkpoint))
    assert result.exit_code == 0, result.output
    report = json.loads((tmp_path / "idx" / "report.json").read_text())
    bad = {b["video"]: b["error"] for b in report["bad"]}
    assert {"empty.mp4", "noise.mp4", "notes.mkv"} <= set(bad)
    assert "empty" in bad["empty.mp4"] and "unreadable" in bad["noise.mp4"]
    assert "skipped" in result.output and "report.json" in result.output
    # a cut file is either indexed over the frames that decode or reported: never fatal, never silent
    assert ("cut.mp4" in bad) != any(
        v["video"] == "cut.mp4" for v in json.loads((tmp_path / "idx" / MANIFEST).read_text())["videos"]
    )
    assert open_index(tmp_path / "idx").search("a red screen", k=1)[0].video in ("red.mp4", "cut.mp4")


# --------------------------------------------------------------------------------------------- resume / update


#: the stores the resume and update tests run on: the index folder, and a Qdrant collection (local mode)
STORES = [
    "folder",
    pytest.param(
        "qdrant+local", marks=pytest.mark.skipif(not HAS_QDRANT_CLIENT, reason="qdrant-client is not installed")
    ),
]


def store_target(store: str, folder: Path) -> Path | str:
    """``--out`` for ``store`` with its files in ``folder``."""
    return folder if store == "folder" else f"{store}:{folder}"


def assert_same_store(store: str, a: Path, b: Path) -> None:
    """The indexes of ``store`` in folders ``a`` and ``b`` are the same index: for a folder, its files; for a Qdrant
    collection, every point (payload and vector) and video record."""
    if store == "folder":
        assert_same_index(a, b)
    else:
        from test_search_qdrant import assert_same_collection

        assert_same_collection(store_target(store, a), store_target(store, b))


@pytest.mark.parametrize("store", STORES)
def test_killed_build_resumes_to_the_identical_index(store: str, search_setup, tmp_path: Path) -> None:
    """SIGKILL a real `tvr index` process after its first shard is written, resume it: the same index as an
    uninterrupted run (manifest, row tables, embeddings, FAISS bytes; or every point of the collection); the finished
    shard is not redone."""
    videos = tmp_path / "videos"
    for copy in range(3):  # 15 videos, one shard each: enough work left to kill the run in the middle
        for name in VIDEOS:
            target = videos / f"c{copy}" / name
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy(search_setup.videos / name, target)
    whole = store_target(store, tmp_path / "whole")
    args = index_args(videos, whole, search_setup.checkpoint, "--shard-windows", "1", "-j", "1")
    assert runner.invoke(app, args).exit_code == 0

    out = tmp_path / "killed"
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1]), "TVR_NO_PROGRESS": "1"}
    command = [
        sys.executable,
        "-m",
        "tvr",
        *index_args(videos, store_target(store, out), search_setup.checkpoint, "--shard-windows", "1", "-j", "1"),
    ]
    proc = subprocess.Popen(
        command, env=env, start_new_session=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    killed_with = None
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline and proc.poll() is None:
        shards = [p for p in (out / "shards").glob("*") if not is_temporary_name(p.name)] if out.exists() else []
        if shards:
            os.killpg(proc.pid, signal.SIGKILL)
            killed_with = len(shards)
            break
        time.sleep(0.005)
    proc.wait()
    assert killed_with is not None and proc.returncode == -signal.SIGKILL, "the run ended before it was killed"
    assert not (out / MANIFEST).exists()  # unfinished: a query says so
    result = runner.invoke(app, ["search", str(store_target(store, out)), "a red screen"])
    assert result.exit_code == 2 and "not finished" in result.output

    result = runner.invoke(app, [*command[3:]])
    assert result.exit_code == 0, result.output
    report = json.loads((out / "report.json").read_text())
    assert report["reused"] >= killed_with and report["reused"] + report["embedded"] == 15
    assert not [p for p in out.rglob("*") if is_temporary_name(p.name)]
    assert_same_store(store, tmp_path / "whole", out)


@pytest.mark.parametrize("store", STORES)
def test_changed_folder_updates_only_what_changed(store: str, search_setup, tmp_path: Path) -> None:
    videos = tmp_path / "videos"
    shutil.copytree(search_setup.videos, videos)
    out = tmp_path / "idx"
    target = store_target(store, out)
    assert runner.invoke(app, index_args(videos, target, search_setup.checkpoint)).exit_code == 0
    (videos / "blue.mp4").unlink()  # deleted
    write_colour_video(videos / "green.mp4", (30, 200, 40), 6.0)  # changed: now longer (more windows)
    shutil.copy(search_setup.videos / "red.mp4", videos / "new" / "red2.mp4") if (
        videos / "new"
    ).mkdir() is None else None  # added
    result = runner.invoke(app, index_args(videos, target, search_setup.checkpoint))
    assert result.exit_code == 0, result.output
    report = json.loads((out / "report.json").read_text())
    assert report["embedded"] == 2 and report["reused"] == 3 and report["dropped"] == ["blue.mp4"]
    index = open_index(target)
    names = [v["video"] for v in index.videos]
    assert names == sorted(["green.mp4", "new/red2.mp4", "red.mp4", "sub/magenta.mp4", "sub/yellow.mp4"])
    assert {h.video for h in index.search("a red screen", k=2)} == {"red.mp4", "new/red2.mp4"}
    index.close()
    # nothing stale is left: the update equals a fresh build of the changed folder
    fresh = store_target(store, tmp_path / "fresh")
    assert runner.invoke(app, index_args(videos, fresh, search_setup.checkpoint)).exit_code == 0
    assert_same_store(store, tmp_path / "fresh", out)
    # a re-run on an unchanged folder embeds nothing
    assert runner.invoke(app, index_args(videos, target, search_setup.checkpoint)).exit_code == 0
    assert json.loads((out / "report.json").read_text())["embedded"] == 0


# --------------------------------------------------------------------------------------------- model stamp


def other_checkpoint(checkpoint: Path, target: Path) -> Path:
    """The same model with one weight nudged: a different model as far as an index is concerned."""
    payload = torch.load(checkpoint, map_location="cpu", weights_only=True)
    key = next(k for k in payload["model"] if k.startswith("head.") or k.startswith("temporal."))
    payload["model"][key] = payload["model"][key] + 1e-3
    torch.save(payload, target)
    return target


def test_a_different_model_is_refused(built: Path, search_setup, tmp_path: Path) -> None:
    other = other_checkpoint(search_setup.checkpoint, tmp_path / "other.pt")
    with pytest.raises(EncoderMismatchError, match="was built with checkpoint"):
        open_index(built, checkpoint=other)
    result = runner.invoke(app, ["search", str(built), "a red screen", "--checkpoint", str(other)])
    assert result.exit_code == 2 and "cannot be compared" in result.output
    # adding to the index with another model is refused too, before anything is written
    before = sorted(p.name for p in (built / "shards").iterdir())
    result = runner.invoke(app, index_args(search_setup.videos, built, other))
    assert result.exit_code == 2 and "was built with" in result.output
    assert sorted(p.name for p in (built / "shards").iterdir()) == before
    result = runner.invoke(
        app,
        [
            "index",
            str(search_setup.videos),
            "--out",
            str(built),
            "--checkpoint",
            str(search_setup.checkpoint),
            "--window",
            "6",
            "--stride",
            "2",
        ],
    )
    assert result.exit_code == 2 and "other settings" in result.output and "window" in result.output
    # a checkpoint that moved is found again with --checkpoint, and still checked
    moved = shutil.copy(search_setup.checkpoint, tmp_path / "moved.pt")
    assert open_index(built, checkpoint=moved).search("a red screen", k=1)[0].video == "red.mp4"


# --------------------------------------------------------------------------------------------- exact rerank


def gare_checkpoint(search_setup, target: Path) -> Path:
    """The trained tiny backbone under a GARE head (ψ at its initialisation): a non-indexable model."""
    from tvr.config import config_from_dict, config_to_dict
    from tvr.models.build import build_model
    from tvr.models.checkpoint import load_model
    from tvr.train.checkpoint import save_checkpoint

    trained, cfg = load_model(search_setup.checkpoint)
    values = config_to_dict(cfg)
    values["head"] = {"name": "gare", "logit_scale_init": 2.6592, "options": {"psi_init": "identity"}}
    gare_cfg = config_from_dict(values)
    from tvr.pipeline import resolve_config

    gare_cfg = resolve_config(gare_cfg)
    model = build_model(resolve_run(gare_cfg))
    own = model.state_dict()
    own.update({k: v for k, v in trained.state_dict().items() if not k.startswith("head.")})
    model.load_state_dict(own)
    save_checkpoint(target, model, config=gare_cfg)
    return target


def test_gare_rerank_is_exhaustive_exact_scoring(search_setup, tmp_path: Path) -> None:
    ckpt = gare_checkpoint(search_setup, tmp_path / "gare.pt")
    encoder = CheckpointEncoder(ckpt)
    assert not encoder.head.indexable
    several_shards = IndexOptions(window=4.0, stride=2.0, workers=1, progress=False, shard_windows=3)
    build_index(search_setup.videos, tmp_path / "idx", encoder, several_shards)
    index = open_index(tmp_path / "idx", encoder=encoder)
    assert index.state_cls.__name__ == "GareRerankState" and len(index.readers) > 1
    # exhaustive: every window's features scored by the head itself
    video_state, labels = exhaustive_video_state(search_setup.videos, index, encoder)
    for caption, _, _ in VIDEOS.values():
        exact = encoder.head.score(encoder.encode_texts([caption]), video_state)[0]
        order = torch.argsort(exact, descending=True, stable=True)
        hits = index.search(caption, k=len(labels), rerank=len(labels), all_windows=True)
        found = [labels.index((h.video, h.start, h.end)) for h in hits]
        assert sorted(found) == list(range(len(labels)))
        # each hit carries its window's exact score, and the hits are in exact order (windows whose exact scores
        # tie — a still video's overlapping windows — may come in either order)
        np.testing.assert_allclose([h.score for h in hits], exact[found].numpy(), rtol=0, atol=1e-5)
        np.testing.assert_allclose(exact[found].numpy(), exact[order].numpy(), rtol=0, atol=1e-6)
    # float16 rerank state: the same order here, scores within 1e-2
    half = IndexOptions(window=4.0, stride=2.0, workers=1, progress=False, state_dtype="float16")
    build_index(search_setup.videos, tmp_path / "half", encoder, half)
    half_index = open_index(tmp_path / "half", encoder=encoder)
    for caption, _, _ in VIDEOS.values():
        a = index.search(caption, k=5)
        b = half_index.search(caption, k=5)
        assert [h.video for h in a][:1] == [h.video for h in b][:1]
        np.testing.assert_allclose([h.score for h in a], [h.score for h in b], atol=1e-2)


def test_a_config_model_and_a_list_file(search_setup, tmp_path: Path) -> None:
    """`tvr index LIST --config FILE`: the model a config builds (no checkpoint), stamped by a hash of its weights;
    a list file names the videos (relative to its folder; comments and blank lines skipped)."""
    import yaml
    from search_fixtures import TINY

    videos = tmp_path / "videos"
    shutil.copytree(search_setup.videos, videos)
    listing = videos / "list.txt"
    listing.write_text("# two of them\nred.mp4\n\nsub/yellow.mp4\n")
    config = tmp_path / "tiny.yaml"
    values = {
        "data": {"max_frames": 4, "frame_rate": 1.0, "image_size": 32, "max_words": 16},
        "model": {"clip": "tiny", "temporal": "meanP", "tiny": TINY},
        "head": {"name": "clip4clip"},
    }
    config.write_text(yaml.safe_dump(values))
    args = [
        "index",
        str(listing),
        "--out",
        str(tmp_path / "idx"),
        "--config",
        str(config),
        "--window",
        "4",
        "--stride",
        "2",
        "-j",
        "1",
    ]
    result = runner.invoke(app, args)
    assert result.exit_code == 0, result.output
    manifest = json.loads((tmp_path / "idx" / MANIFEST).read_text())
    assert manifest["source"]["kind"] == "list" and [v["video"] for v in manifest["videos"]] == [
        "red.mp4",
        "sub/yellow.mp4",
    ]
    assert manifest["model"]["encoder"] == "config"
    index = open_index(tmp_path / "idx")  # the model is rebuilt from the stamp's config and checked against it
    assert {h.video for h in index.search("anything", k=2)} == {"red.mp4", "sub/yellow.mp4"}
    result = runner.invoke(app, [*args, "--set", "train.seed=1"])  # other weights: another model
    assert result.exit_code == 2 and "was built with the model of config" in result.output
    outside = videos / "bad.txt"
    outside.write_text("../elsewhere.mp4\n")
    result = runner.invoke(app, ["index", str(outside), "--out", str(tmp_path / "x"), "--config", str(config)])
    assert result.exit_code == 2 and "outside the list's folder" in result.output


def test_default_encoder_on_real_clips(shared_data: Path, tmp_path: Path) -> None:
    """No --checkpoint: the default encoder (two-tower, real offline weights) indexes real footage and finds the
    described clip; the index reopens with the same model (rebuilt from its stamp) and refuses another one."""
    videos = tmp_path / "clips"
    videos.mkdir()
    for name in ("brown_bear_rock.mp4", "bus_road.mp4", "kitesurfer_sea.mp4"):
        shutil.copy(shared_data / "real-scenes" / name, videos / name)
    result = runner.invoke(app, ["index", str(videos), "--out", str(tmp_path / "idx"), "-j", "1"])
    assert result.exit_code == 0, result.output
    manifest = json.loads((tmp_path / "idx" / MANIFEST).read_text())
    assert manifest["model"]["encoder"] == "config" and manifest["model"]["name"] == "two_tower/zero_shot"
    result = runner.invoke(app, ["search", str(tmp_path / "idx"), "a brown bear walking on the rock", "--json"])
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)[0]["video"] == "brown_bear_rock.mp4"
    # queries of 16 tokens or fewer are encoded at 16, longer ones at 32: answered together (one pass per length,
    # as the server's micro-batches and --queries are), each query gets exactly the answer it gets alone
    index = open_index(tmp_path / "idx")
    texts = ["a bear", "a red bus on a wet road in the city at night", "a kitesurfer " * 6, "bus", "a brown bear"]
    with open(shared_data / "real-scenes" / "captions.csv", newline="", encoding="utf-8") as handle:
        texts += [row["caption"] for row in csv.DictReader(handle)]
    assert sorted(set(index.encoder.query_lengths(texts))) == [16, 32]
    threads = torch.get_num_threads()
    torch.set_num_threads(2)  # a caller on several threads: a query's features must still not depend on its batch
    try:
        assert index.search_many(texts, k=3) == [index.search(text, k=3) for text in texts]
        assert torch.get_num_threads() == 2  # the caller's setting is restored
    finally:
        torch.set_num_threads(threads)
    result = runner.invoke(
        app,
        [
            "index",
            str(videos),
            "--out",
            str(tmp_path / "idx"),
            "--set",
            "train.seed=3",
            "--config",
            "two_tower/zero_shot",
            "--set",
            "model.two_tower.conse_top_k=5",
        ],
    )
    assert result.exit_code == 2 and "was built with" in result.output


def test_a_second_job_on_the_same_index_stops_at_once(search_setup, tmp_path: Path) -> None:
    from tvr.utils.lock import folder_lock

    out = tmp_path / "idx"
    with folder_lock(out, "index"):  # another live `tvr index` holding the folder
        result = runner.invoke(app, index_args(search_setup.videos, out, search_setup.checkpoint))
    assert result.exit_code == 2 and "in use by another tvr job" in result.output
    assert not (out / "shards").exists()
