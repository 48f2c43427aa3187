"""The numpy query side (tvr.search.numpy_query): written by ``tvr index`` for a two-tower model with ConSE or fused
ConSE and an indexable head, checked against the model; ``tvr search`` answers from it without importing torch,
with the full model's hits and scores within 1e-5; a model it does not compute, or an export that disagrees, gets
none; the real MiniLM-L6 agrees with it on both real sets' captions and paraphrases."""

from __future__ import annotations

import csv
import json
import shutil
from pathlib import Path

import numpy as np
import pytest
from search_fixtures import cold_search
from test_query_encoder import CAPTIONS
from test_search import OPTIONS
from test_two_tower import HAS_REAL_WEIGHTS, tiny_values

from tvr.config import config_from_dict
from tvr.search import open_index
from tvr.search.build import build_index
from tvr.search.encoders import ConfigEncoder
from tvr.search.numpy_export import export_numpy_query, largest_difference
from tvr.search.numpy_query import TOLERANCE, NumpyQueryEncoder, gelu, load_numpy_query_encoder, numpy_export_folder
from tvr.search.query_encoder import PROBE_TEXTS, export_query_encoder


def _two_tower(fused: bool, max_words: int = 16, head: str = "clip4clip") -> ConfigEncoder:
    extra = {"conse_class_weight": 0.5, "conse_class_temperature": 0.05} if fused else {}
    values = tiny_values(bridge="conse", head=head, **extra)
    values["model"]["temporal"] = "meanP"
    values["data"].update({"max_frames": 4, "frame_rate": 1.0, "max_words": max_words})
    return ConfigEncoder(config_from_dict(values), name=f"tiny two-tower, conse, fused={fused}")


def _same_hits_close_scores(quick, full, texts, **kwargs) -> None:
    for text in texts:
        got, want = quick.search(text, k=5, **kwargs), full.search(text, k=5, **kwargs)
        assert [(h.video, h.start, h.end, h.rank) for h in got] == [(h.video, h.start, h.end, h.rank) for h in want]
        assert max(abs(a.score - b.score) for a, b in zip(got, want, strict=True)) <= TOLERANCE, text


def test_gelu_is_the_exact_one() -> None:
    """Within one float32 step of x·Φ(x) computed in float64 with ``math.erf`` (or 1e-13, where Φ(x) is so small
    that float64's 1 + erf(x/√2) cancels); torch's float32 GELU, which the export is checked against, is itself up
    to a step or so away from it."""
    import math

    x = np.concatenate([np.linspace(-12, 12, 24001), np.random.default_rng(0).normal(0, 3, 20000)]).astype(np.float32)
    exact = np.array([0.5 * v * (1.0 + math.erf(v / math.sqrt(2.0))) for v in x.astype(np.float64).tolist()])
    error = np.abs(gelu(x).astype(np.float64) - exact)
    assert np.all(error <= np.maximum(np.spacing(np.abs(exact).astype(np.float32)), 1e-13))


@pytest.mark.parametrize("fused", [False, True], ids=["conse", "fused-conse"])
def test_tvr_index_writes_it_and_search_answers_from_it(fused: bool, search_setup, tmp_path: Path) -> None:
    encoder = _two_tower(fused)
    build_index(search_setup.videos, tmp_path / "idx", encoder, OPTIONS)
    assert export_query_encoder(encoder) is not None  # what tvr index runs once the index is built
    folder = numpy_export_folder(encoder.stamp())
    assert {p.name for p in folder.iterdir()} == {"meta.json", "weights.npz", "tokenizer.json"}
    meta = json.loads((folder / "meta.json").read_text())
    assert meta["fusion"]["kind"] == ("fused" if fused else "none") and 0 <= meta["largest_difference"] <= TOLERANCE
    quick = open_index(tmp_path / "idx", without_torch=True)
    assert isinstance(quick.encoder, NumpyQueryEncoder) and quick.head is None and quick.indexable
    full = open_index(tmp_path / "idx", encoder=encoder)
    texts = [*CAPTIONS, "a green screen " * 9]  # the last one is truncated to max_words
    _same_hits_close_scores(quick, full, texts)
    _same_hits_close_scores(quick, full, texts, all_windows=True)
    assert largest_difference(encoder, quick.encoder, texts) <= TOLERANCE
    # the library's query vectors: the numpy side's within the tolerance of the model's, float32 [n, d] both
    vectors = quick.encode_queries(texts)
    assert vectors.dtype == np.float32 and vectors.shape == (len(texts), quick.dim)
    np.testing.assert_allclose(vectors, full.encode_queries(texts), atol=TOLERANCE)
    # without the flag an index keeps the torch query path (a server's micro-batches equal serial answers bit for bit)
    assert not isinstance(open_index(tmp_path / "idx").encoder, NumpyQueryEncoder)
    # ranking captions for a clip needs the image side: the full model loads
    ranked = quick.rank_captions(search_setup.videos / "green.mp4", ["a green screen", "a red screen"])
    assert len(ranked) == 2 and quick.head is not None and not isinstance(quick.encoder, NumpyQueryEncoder)


def test_a_model_it_does_not_compute_gets_none(search_setup, tmp_path: Path) -> None:
    projection = ConfigEncoder(config_from_dict(tiny_values()), name="tiny two-tower, projection")
    assert export_numpy_query(projection, list(PROBE_TEXTS)) is None  # a learned projection after the tower
    gare = _two_tower(False, head="gare")
    assert export_numpy_query(gare, list(PROBE_TEXTS)) is None  # not indexable: its rerank needs torch
    assert not numpy_export_folder(projection.stamp()).exists() and not numpy_export_folder(gare.stamp()).exists()


def test_an_export_that_disagrees_is_not_written(monkeypatch) -> None:
    encoder = _two_tower(True, max_words=12)
    real_vector, real_ids = NumpyQueryEncoder.query_vector, NumpyQueryEncoder.token_ids

    def off_by_twice_the_tolerance(self, text):
        vector = real_vector(self, text)
        vector[0, 0] += 2 * TOLERANCE
        return vector

    def one_token_short(self, text):
        return real_ids(self, text)[:-1]

    for name, wrong in (("query_vector", off_by_twice_the_tolerance), ("token_ids", one_token_short)):
        with monkeypatch.context() as patch:
            patch.setattr(NumpyQueryEncoder, name, wrong)
            assert export_numpy_query(encoder, list(PROBE_TEXTS)) is None, name
        assert not numpy_export_folder(encoder.stamp()).exists() and load_numpy_query_encoder(encoder.stamp()) is None
    monkeypatch.setenv("TVR_QUICK_QUERIES", "0")
    assert export_numpy_query(encoder, list(PROBE_TEXTS)) is None
    monkeypatch.setenv("TVR_QUICK_QUERIES", "1")
    assert export_numpy_query(encoder, list(PROBE_TEXTS)) is not None  # the real one agrees


def test_cold_search_does_not_import_torch(search_setup, tmp_path: Path) -> None:
    encoder = _two_tower(True)
    build_index(search_setup.videos, tmp_path / "idx", encoder, OPTIONS)
    folder = export_numpy_query(encoder, list(PROBE_TEXTS))
    assert folder is not None
    shutil.copytree(folder, tmp_path / "home" / "query-encoders" / folder.name)
    _, got, loaded = cold_search(tmp_path / "idx", "a magenta screen", 3, tmp_path / "home")
    assert "tvr.search.numpy_query" in loaded and not {"torch", "transformers", "av"} & set(loaded)
    want = open_index(tmp_path / "idx", encoder=encoder).search("a magenta screen", k=3)
    assert [(h["video"], h["start"], h["end"]) for h in got] == [(h.video, h.start, h.end) for h in want]
    assert max(abs(h["score"] - w.score) for h, w in zip(got, want, strict=True)) <= TOLERANCE


def test_the_real_text_tower_agrees_on_the_real_queries(tmp_path: Path) -> None:
    """MiniLM-L6 with the default fused ConSE: every caption and paraphrase of both shared real sets within the
    tolerance (the export's own check uses the probe texts only)."""
    from conftest import SHARED_DATA

    from tvr.config import load_config

    files = [SHARED_DATA / name / "captions.csv" for name in ("real-scenes", "real-scenes-2")]
    if not HAS_REAL_WEIGHTS or not all(f.is_file() for f in files):
        pytest.skip("offline weight packages or ../shared/data/real-scenes(-2) missing")
    texts = [row["caption"] for f in files for row in csv.DictReader(f.open(encoding="utf-8"))]
    texts += [
        row["paraphrase"]
        for row in csv.DictReader((SHARED_DATA / "real-scenes-2" / "captions.csv").open(encoding="utf-8"))
    ]
    encoder = ConfigEncoder(load_config("two_tower/zero_shot"), name="two_tower/zero_shot")
    folder = export_numpy_query(encoder, list(PROBE_TEXTS))
    assert folder is not None
    assert largest_difference(encoder, NumpyQueryEncoder(folder), texts) <= TOLERANCE


def test_cold_search_through_the_model_prints_no_library_warning(
    search_setup, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With no export in an empty cache `tvr search` loads the two-tower model; sentence-transformers' deprecation
    notes and transformers' config notes (one of them printed twice before) stay off stderr."""
    for variable in ("TRANSFORMERS_VERBOSITY", "HF_HUB_DISABLE_PROGRESS_BARS"):  # set by earlier in-process commands
        monkeypatch.delenv(variable, raising=False)
    build_index(search_setup.videos, tmp_path / "idx", _two_tower(False), OPTIONS)
    (tmp_path / "home").mkdir(mode=0o700)
    _, got, loaded = cold_search(tmp_path / "idx", "a magenta screen", 3, tmp_path / "home")  # asserts stderr empty
    assert "sentence_transformers" in loaded and len(got) == 3
