"""Shared fixtures: where the real data lives, and tiny deterministic set-ups."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

SHARED_DATA = Path(os.environ.get("TVR_SHARED_DATA", Path(__file__).resolve().parents[2] / "shared" / "data"))


@pytest.fixture
def shared_data() -> Path:
    """The read-only real data folder (../shared/data); skips the test when it is absent."""
    if not SHARED_DATA.is_dir():
        pytest.skip(f"real data folder not found: {SHARED_DATA}")
    return SHARED_DATA


@pytest.fixture(autouse=True)
def _seed_everything() -> None:
    torch.manual_seed(0)


@pytest.fixture(autouse=True, scope="session")
def _query_encoder_exports(tmp_path_factory: pytest.TempPathFactory):
    """Indexes' exported text sides (tvr.search.query_encoder) go to a folder of the session, not the user's cache."""
    import tvr.search.numpy_query as numpy_query
    import tvr.search.query_encoder as query_encoder

    folder = tmp_path_factory.mktemp("query-encoders")
    originals = query_encoder.export_root, numpy_query.export_root
    query_encoder.export_root = numpy_query.export_root = lambda: folder
    yield folder
    query_encoder.export_root, numpy_query.export_root = originals


@pytest.fixture(autouse=True, scope="session")
def _indexed_folder_records(tmp_path_factory: pytest.TempPathFactory):
    """Which folder each index of the tests was built from (tvr.search.indexed_folders, tvr serve's default media
    folder) is recorded in a folder of the session, not the user's cache."""
    import tvr.search.indexed_folders as indexed_folders

    folder = tmp_path_factory.mktemp("indexed-folders")
    original = indexed_folders.records_folder
    indexed_folders.records_folder = lambda: folder
    yield folder
    indexed_folders.records_folder = original


@pytest.fixture(scope="session")
def search_setup(tmp_path_factory: pytest.TempPathFactory):
    """Five small distinct colour videos and a tiny checkpoint trained to tell them apart (tests/search_fixtures.py),
    built once per session: ``.videos`` (folder), ``.checkpoint`` (last.pt), ``.root`` (scratch)."""
    from types import SimpleNamespace

    from search_fixtures import train_checkpoint, write_videos

    root = tmp_path_factory.mktemp("search")
    videos = write_videos(root / "videos")
    return SimpleNamespace(root=root, videos=videos, checkpoint=train_checkpoint(root / "work", videos, steps=40))


@pytest.fixture(scope="session")
def search_index(search_setup, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """``tvr index`` of ``search_setup``'s videos with its checkpoint (which also exports the model's text side), for
    the tests that only query it."""
    from search_fixtures import index_args
    from typer.testing import CliRunner

    from tvr.cli import app

    out = tmp_path_factory.mktemp("search_index") / "idx"
    result = CliRunner().invoke(app, index_args(search_setup.videos, out, search_setup.checkpoint))
    assert result.exit_code == 0, result.output
    return out


@pytest.fixture(scope="session")
def dual_encoders(tmp_path_factory: pytest.TempPathFactory):
    """Tiny randomly initialised CLIP, SigLIP and SigLIP 2 (NaFlex) folders saved with save_pretrained, tokenizer
    files made offline (tests/dual_encoder_fixtures.py): ``.clip``, ``.siglip``, ``.siglip2``."""
    from types import SimpleNamespace

    from dual_encoder_fixtures import save_tiny_clip, save_tiny_siglip, save_tiny_siglip2

    root = tmp_path_factory.mktemp("dual_encoders")
    return SimpleNamespace(clip=save_tiny_clip(root), siglip=save_tiny_siglip(root), siglip2=save_tiny_siglip2(root))
