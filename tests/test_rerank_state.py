"""The state a search index stores per video (``head.rerank_state``) scores exactly what ``head.score`` gives on the
video features it was made from, for every head and every GARE / TV-ProxyNet variant the factorised scorers cover,
also after a float16 round trip (within a stated tolerance) and on any subset of rows (an index gathers the
shortlist's rows)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from test_head_contract import HEADS, MIXTURE, TOY, build, features

from tvr.config import HeadConfig
from tvr.methods.gare.scoring import GareRerankState
from tvr.methods.proxy import ProxyRerankState
from tvr.models.heads import registry
from tvr.models.heads.base import LN_100
from tvr.search.store import ShardReader, write_shard
from tvr.types import VideoFeatures

D = 32


def _head(name: str, **options: object):
    torch.manual_seed(0)
    head = registry.build_head(HeadConfig(name=name, options=dict(options)), D, LN_100)
    return head.eval()


def _check(head, stored_type=None) -> None:
    text, video = features(7, 11, seed=3)
    ts, vs = head.encode_texts(text), head.encode_videos(video)
    expected = head.score(ts, vs)
    state = head.rerank_state(vs)
    if stored_type is not None:
        assert isinstance(state, stored_type)
    assert len(state) == 11
    torch.testing.assert_close(head.score_rerank(ts, state), expected, rtol=1e-5, atol=1e-5)
    rows = torch.tensor([9, 2, 2, 5])
    torch.testing.assert_close(head.score_rerank(ts, state[rows]), expected[:, rows], rtol=1e-5, atol=1e-5)
    half = state.to("cpu", torch.float16) if hasattr(state, "to") else state
    torch.testing.assert_close(head.score_rerank(ts, half), expected, rtol=0, atol=5e-3)


@pytest.mark.parametrize("name", HEADS + [TOY, MIXTURE])
def test_every_head_rerank_state_scores_like_score(name: str) -> None:
    _check(build(name).eval())


@pytest.mark.parametrize(
    "options",
    [
        {},
        {"video_pool": "mean"},
        {"gap_query": False},
        {"mask_frames": True},
        {"corrected_side": "video", "eta": -1.0},
        {"video_pool": "mean", "gap_query": False, "mask_frames": True},
    ],
)
def test_gare_stores_its_psi_state(options: dict) -> None:
    _check(_head("gare", **options), GareRerankState)


def test_gare_word_context_keeps_the_features() -> None:
    head = _head("gare", context="words")
    _, video = features(2, 3)
    assert not isinstance(head.rerank_state(head.encode_videos(video)), GareRerankState)


@pytest.mark.parametrize("options", [{}, {"dash": "linear", "heads": 2, "layers": 3}, {"delta": -1.0, "eta": -1.0}])
def test_proxy_stores_its_folded_rounds(options: dict) -> None:
    _check(_head("proxy", **options), ProxyRerankState)


def test_proxy_gamma_zero_is_the_plain_cosine() -> None:
    head = _head("proxy", gamma=0.0, select_gamma=False)
    _check(head, ProxyRerankState)


def test_gare_float16_index_is_as_precise_for_offset_features(tmp_path) -> None:
    """GARE stores standardised frames z = (x − μ)/σ, not x, and keeps the fields that carry the features' own scale
    in float32: features sharing a large offset (as some encoders' do) lose nothing more in a float16 index than
    centred ones — with x, ‖v̄‖² or X Xᵀ in float16 they would overflow to inf and score NaN."""
    head = _head("gare")
    text, video = features(5, 9, seed=4)
    assert "z" not in GareRerankState.full_precision and "vv" in GareRerankState.full_precision
    for k, offset in enumerate((0.0, 40.0, 1000.0)):
        moved = VideoFeatures(video.frames + offset, video.frame_mask, video.proxies)
        ts, vs = head.encode_texts(text), head.encode_videos(moved)
        expected = head.score(ts, vs)
        state = head.rerank_state(vs)
        torch.testing.assert_close(head.score_rerank(ts, state), expected, rtol=1e-5, atol=1e-5)
        reader = ShardReader(write_shard(tmp_path, f"s{k}", torch.zeros(9, 1), state, [], half=True))
        stored = reader.state(np.arange(9), GareRerankState)
        assert stored.z.dtype == torch.float16 and stored.vv.dtype == torch.float32
        torch.testing.assert_close(head.score_rerank(ts, stored), expected, rtol=0, atol=5e-3)
