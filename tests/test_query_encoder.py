"""The exported text side of an index's model (tvr.search.query_encoder): written by ``tvr index``, used by the next
``open_index`` instead of the full model, with bit-identical answers (an indexable head, GARE's exact rerank, a
two-tower model with an HF fast tokenizer); a checkpoint that changed since is not trusted to it; a cold ``tvr search``
in a fresh process imports neither transformers nor PyAV and prints nothing on stderr."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest
import torch
from search_fixtures import VIDEOS, cold_search
from test_search import OPTIONS, gare_checkpoint

from tvr.search import open_index
from tvr.search.build import build_index
from tvr.search.encoders import CheckpointEncoder, ConfigEncoder
from tvr.search.query_encoder import QueryEncoder, export_folder, export_query_encoder, load_query_encoder

CAPTIONS = [caption for caption, _, _ in VIDEOS.values()] + ["a screen", "Ünïcödé!!", "red " * 40]


def _same_answers(quick, full, texts=CAPTIONS, **kwargs) -> None:
    for text in texts:
        assert quick.search(text, k=5, **kwargs) == full.search(text, k=5, **kwargs), text


@pytest.fixture
def built(search_index: Path) -> Path:
    return search_index


def test_tvr_index_exports_the_text_side_and_search_uses_it(built: Path, search_setup) -> None:
    quick = open_index(built)
    assert isinstance(quick.encoder, QueryEncoder)  # `tvr index` exported it
    files = {p.name for p in quick.encoder.folder.iterdir()}
    assert files == {"meta.json", "text.pt", "head.pt", "vocab.json", "merges.txt"}
    full = open_index(built, encoder=CheckpointEncoder(search_setup.checkpoint))
    _same_answers(quick, full)
    # ranking captions for a clip needs the image side: the full model loads then, checked against the stamp
    ranked = quick.rank_captions(search_setup.videos / "green.mp4", [c for c, _, _ in VIDEOS.values()])
    assert ranked[0].caption == "a green screen" and not isinstance(quick.encoder, QueryEncoder)


def test_a_changed_checkpoint_is_not_answered_by_its_export(built: Path, search_setup, tmp_path: Path) -> None:
    stamp = json.loads((built / "settings.json").read_text())["model"]
    assert load_query_encoder(stamp) is not None
    info = os.stat(search_setup.checkpoint)
    os.utime(search_setup.checkpoint, ns=(info.st_atime_ns, info.st_mtime_ns + 1_000_000_000))
    try:
        assert load_query_encoder(stamp) is None
        # the full model loads and hashes the file, as before; the same bytes: accepted, and exported again
        assert not isinstance(open_index(built).encoder, QueryEncoder)
        assert load_query_encoder(stamp) is not None
    finally:
        os.utime(search_setup.checkpoint, ns=(info.st_atime_ns, info.st_mtime_ns))
    assert load_query_encoder(stamp) is None
    assert not isinstance(open_index(built).encoder, QueryEncoder) and load_query_encoder(stamp) is not None


def test_gare_rerank_is_identical_through_the_export(search_setup, tmp_path: Path) -> None:
    encoder = CheckpointEncoder(gare_checkpoint(search_setup, tmp_path / "gare.pt"))
    build_index(search_setup.videos, tmp_path / "idx", encoder, OPTIONS)
    assert export_query_encoder(encoder) is not None
    quick = open_index(tmp_path / "idx")
    assert isinstance(quick.encoder, QueryEncoder) and not quick.head.indexable
    full = open_index(tmp_path / "idx", encoder=encoder)
    _same_answers(quick, full, all_windows=True)
    _same_answers(quick, full, rerank=3)


def test_two_tower_fast_tokenizer_export(search_setup, tmp_path: Path) -> None:
    from test_two_tower import tiny_values

    from tvr.config import config_from_dict

    values = tiny_values()
    values["data"].update({"max_frames": 4, "frame_rate": 1.0, "max_words": 16})
    encoder = ConfigEncoder(config_from_dict(values), name="tiny two-tower")
    build_index(search_setup.videos, tmp_path / "idx", encoder, OPTIONS)
    folder = export_query_encoder(encoder)
    assert folder is not None and (folder / "tokenizer.json").is_file()
    quick = open_index(tmp_path / "idx")
    assert isinstance(quick.encoder, QueryEncoder)
    _same_answers(quick, open_index(tmp_path / "idx", encoder=encoder))


def test_queries_are_padded_to_their_length_group(search_setup, tmp_path: Path) -> None:
    """With data.max_words = 32, a query of at most 16 tokens is encoded at 16 (half the text encoder's work); the
    export is checked at every length and answers as the full model does. (That a query's answer does not depend on
    the queries of its group is a property of the real text model, checked in test_search.py: this tiny BERT's
    rows already differ in the last bit between a batch of one and of several at any length.)"""
    from test_two_tower import tiny_values

    from tvr.config import config_from_dict
    from tvr.search.encoders import QUERY_LENGTHS

    values = tiny_values()
    values["data"].update({"max_frames": 4, "frame_rate": 1.0, "max_words": 32})
    encoder = ConfigEncoder(config_from_dict(values), name="tiny two-tower, 32 words")
    build_index(search_setup.videos, tmp_path / "idx", encoder, OPTIONS)
    assert export_query_encoder(encoder) is not None
    texts = [*CAPTIONS, "a green screen " * 5, "a red screen with a white square moving from left to right slowly"]
    lengths = encoder.query_lengths(texts)
    counts = encoder.token_ids(texts, 32)[1].sum(dim=1).tolist()
    assert QUERY_LENGTHS == (16,) and set(lengths) == {16, 32}
    assert all(n == (16 if c <= 16 else 32) for n, c in zip(lengths, counts, strict=True))
    quick = open_index(tmp_path / "idx")
    assert isinstance(quick.encoder, QueryEncoder)
    _same_answers(quick, open_index(tmp_path / "idx", encoder=encoder), texts)


def test_an_export_that_disagrees_is_not_written(search_setup, tmp_path: Path, monkeypatch) -> None:
    encoder = CheckpointEncoder(search_setup.checkpoint)
    stamp = {**encoder.stamp(), "id": "0" * 64}
    monkeypatch.setattr(encoder, "stamp", lambda: stamp)
    real = QueryEncoder.text_features

    def off_by_one_ulp(self, texts, length=None):
        features = real(self, texts, length)
        features.eot = torch.nextafter(features.eot, torch.full_like(features.eot, float("inf")))
        return features

    monkeypatch.setattr(QueryEncoder, "text_features", off_by_one_ulp)
    assert export_query_encoder(encoder) is None
    assert not export_folder(stamp).exists() and load_query_encoder(stamp) is None
    monkeypatch.setenv("TVR_QUICK_QUERIES", "0")
    monkeypatch.setattr(QueryEncoder, "text_features", real)
    assert export_query_encoder(encoder) is None


def test_cold_search_is_quiet_and_imports_only_the_text_side(built: Path, tmp_path: Path) -> None:
    stamp = json.loads((built / "settings.json").read_text())["model"]
    export = export_folder(stamp)  # in the session's export folder (conftest): a fresh process finds a copy here
    shutil.copytree(export, tmp_path / "home" / "query-encoders" / export.name)
    _, answer, loaded = cold_search(built, "a magenta screen", 2, tmp_path / "home")
    assert answer[0]["video"] == "sub/magenta.mp4"
    heavy = {"transformers", "sentence_transformers", "sklearn", "av", "fastapi", "tvr.models.backbones.clip.modeling"}
    assert not heavy & set(loaded), heavy & set(loaded)
    assert "tvr.search.query_encoder" in loaded


def test_an_export_others_can_write_is_not_run(built: Path) -> None:
    stamp = json.loads((built / "settings.json").read_text())["model"]
    folder = export_folder(stamp)
    assert load_query_encoder(stamp) is not None
    text = folder / "text.pt"
    mode = text.stat().st_mode
    text.chmod(mode | 0o020)  # group-writable: someone else could have replaced the TorchScript
    try:
        assert load_query_encoder(stamp) is None
    finally:
        text.chmod(mode)
    assert load_query_encoder(stamp) is not None


def test_an_export_checked_at_other_query_lengths_is_not_used(built: Path) -> None:
    """A search pads queries to encoders.QUERY_LENGTHS: an export checked at other lengths (one made before they
    changed) is not trusted with them."""
    stamp = json.loads((built / "settings.json").read_text())["model"]
    meta_file = export_folder(stamp) / "meta.json"
    original = meta_file.read_text()
    assert load_query_encoder(stamp) is not None and json.loads(original)["query_lengths"] == [16]
    try:
        meta_file.write_text(json.dumps({**json.loads(original), "query_lengths": [8, 16]}))
        assert load_query_encoder(stamp) is None
    finally:
        meta_file.write_text(original)
    assert load_query_encoder(stamp) is not None
