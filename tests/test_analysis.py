"""tvr.analysis: every figure's numbers against autograd, closed forms and hand computations on tiny models."""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from PIL import Image

from tvr.analysis import pair_gradients, protocol_ranks, rank_histogram, score_distributions, split_label
from tvr.analysis.figures import jsonable, new_figure, png_size, write_figure
from tvr.analysis.pairs import sample_negatives, sample_pair_batches
from tvr.analysis.summaries import describe, spearman
from tvr.eval.protocol import evaluate
from tvr.losses import symmetric_infonce
from tvr.methods.clip4clip import Clip4ClipHead
from tvr.methods.gare import GareHead, GareOptions
from tvr.methods.gare.figures.geometry import delta_geometry, gare_scores_without_delta, hard_negative_alignment
from tvr.methods.gare.figures.gradients import gare_batch_gradients, gare_gradient_tension
from tvr.methods.gare.psi import gare_block, gare_delta, gare_pair_features, pooled_video
from tvr.methods.gravialign import GraviAlignHead, GraviAlignOptions
from tvr.methods.gravialign.figures import (
    caption_lengths,
    mean_variance,
    mode_comparison,
    sgi_term_distributions,
    uncertainty_vs_ambiguity,
)
from tvr.methods.gravialign.losses import sgi_align_terms
from tvr.methods.proxy import ProxyHead, ProxyOptions
from tvr.methods.proxy.figures import embed_2d, gamma_sweep, proxy_queries, proxy_query_correlation
from tvr.types import TextFeatures, VideoFeatures

D = 16
GARE_VARIANTS = [
    {},
    {"corrected_side": "video"},
    {"context": "words", "mask_frames": True},
    {"video_pool": "mean", "eta": -1.0},
    {"gap_query": False},
]


def gare_features(n_t: int, n_v: int, seed: int = 0, frames: int = 4, words: int = 5):
    g = torch.Generator().manual_seed(seed)
    word_mask = torch.ones(n_t, words, dtype=torch.long)
    word_mask[1:, -2:] = 0
    frame_mask = torch.ones(n_v, frames, dtype=torch.long)
    frame_mask[1:, -1] = 0
    return (
        TextFeatures(torch.randn(n_t, D, generator=g), torch.randn(n_t, words, D, generator=g), word_mask),
        VideoFeatures(torch.randn(n_v, frames, D, generator=g), frame_mask),
    )


def gare_head(**options: object) -> GareHead:
    torch.manual_seed(0)
    head = GareHead(D, GareOptions(**options), logit_scale_init=math.log(20.0))
    with torch.no_grad():  # non-trivial LayerNorm affines, so no term is accidentally symmetric
        for module in head.psi.modules():
            if isinstance(module, torch.nn.LayerNorm):
                module.weight.uniform_(0.5, 1.5)
                module.bias.normal_(0.0, 0.1)
            if isinstance(module, torch.nn.Linear):
                module.weight.normal_(0.0, 0.3)
    return head.eval()


def infonce_weights(scores: torch.Tensor, scale: float) -> torch.Tensor:
    """∂L/∂s_ij of L = ½[CE_rows(τS) + CE_cols(τS)] in closed form: τ/(2B)·[(P − I) + (Q − I)], P row-, Q
    column-softmax of τS."""
    n = scores.shape[0]
    z = scale * scores
    eye = torch.eye(n, dtype=scores.dtype)
    return scale / (2 * n) * ((z.softmax(dim=1) - eye) + (z.softmax(dim=0) - eye))


def cosine_grad(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """∂cos(a, b)/∂a = (b̂ − cos·â)/‖a‖ (broadcast over leading axes)."""
    na, nb = a.norm(dim=-1, keepdim=True), b.norm(dim=-1, keepdim=True)
    cos = (a * b).sum(-1, keepdim=True) / (na * nb)
    return (b / nb - cos * a / na) / na


# --------------------------------------------------------------------------------------------- gradients


@pytest.mark.parametrize("variant", GARE_VARIANTS, ids=lambda v: ",".join(f"{k}={x}" for k, x in v.items()) or "ref")
def test_summed_pair_gradients_equal_the_anchor_gradient_from_autograd(variant: dict) -> None:
    head = gare_head(**variant)
    text, video = gare_features(5, 5, seed=1)
    result = gare_batch_gradients(head, text, video)
    scale = head.logit_scale.exp().detach()

    t = text.eot.clone().requires_grad_(True)
    scores, _ = gare_block(
        head.psi, dataclasses.replace(head.encode_texts(text), eot=t), head.encode_videos(video), head.options
    )
    (expected,) = torch.autograd.grad(symmetric_infonce(scale * scores), t)
    torch.testing.assert_close(result.gare.total, expected, rtol=1e-4, atol=1e-7)
    torch.testing.assert_close(result.gare.positive + result.gare.negative, expected, rtol=1e-4, atol=1e-7)

    t = text.eot.clone().requires_grad_(True)
    vp = pooled_video(t, head.encode_videos(video), head.options)
    base = (t[:, None] * vp).sum(-1) / (t.norm(dim=-1)[:, None] * vp.norm(dim=-1))
    (expected_base,) = torch.autograd.grad(symmetric_infonce(scale * base), t)
    torch.testing.assert_close(result.baseline.total, expected_base, rtol=1e-4, atol=1e-7)
    # the parts really differ from the sum: the decomposition is not trivial
    assert not torch.allclose(result.gare.positive, result.gare.total, atol=1e-6)


def test_pair_gradients_of_a_cosine_score_match_the_closed_form() -> None:
    g = torch.Generator().manual_seed(3)
    t, v = torch.randn(6, D, generator=g, dtype=torch.float64), torch.randn(6, D, generator=g, dtype=torch.float64)
    scale = 7.0

    def column(anchors: torch.Tensor, j: int) -> torch.Tensor:
        return F.cosine_similarity(anchors, v[j : j + 1], dim=-1)

    result = pair_gradients(column, t, scale)
    scores = F.normalize(t, dim=-1) @ F.normalize(v, dim=-1).T
    weights = infonce_weights(scores, scale)
    expected = weights[:, :, None] * cosine_grad(t[:, None, :], v[None, :, :])
    torch.testing.assert_close(result.per_pair, expected)
    torch.testing.assert_close(result.positive, expected.diagonal(dim1=0, dim2=1).T)
    torch.testing.assert_close(result.negative, expected.sum(1) - expected.diagonal(dim1=0, dim2=1).T)
    assert result.loss == pytest.approx(float(symmetric_infonce(scale * scores)))


@pytest.mark.parametrize("side", ["text", "video"])
def test_delta_gradients_match_the_closed_form(side: str) -> None:
    head = gare_head(corrected_side=side)
    text, video = gare_features(4, 4, seed=2)
    result = gare_batch_gradients(head, text, video)
    t, v = head.encode_texts(text), head.encode_videos(video)
    with torch.no_grad():
        scores, delta = gare_block(head.psi, t, v, head.options)
        vp = pooled_video(t.eot, v, head.options)
    weights = infonce_weights(scores, float(head.logit_scale.detach().exp()))
    if side == "text":
        expected = weights[:, :, None] * cosine_grad(t.eot[:, None, :] + delta, vp)
    else:
        expected = weights[:, :, None] * cosine_grad(vp + delta, t.eot[:, None, :].expand_as(delta))
    torch.testing.assert_close(result.delta, expected, rtol=1e-4, atol=1e-7)


def test_gradient_tension_summary_and_batches() -> None:
    head = gare_head()
    text, video = gare_features(12, 6, seed=4)
    text_video = [k % 6 for k in range(12)]
    data = gare_gradient_tension(
        head, text, video[torch.tensor([0, 1, 2, 3, 4, 5])], text_video, batch_size=4, num_batches=3, seed=0
    )
    assert data["batch_size"] == 4 and data["num_batches"] == 3
    anchors = data["anchor"]["gare"]
    assert len(anchors["positive"]["mean"]) == D and len(anchors["cos_positive_negative"]["values"]) == 12
    assert all(-1.0 <= c <= 1.0 for c in anchors["cos_positive_negative"]["values"])
    assert head.training is False
    # batches: distinct videos, one caption each; a split that fits in one batch has a single batch
    batches = sample_pair_batches(text_video, 4, 5, seed=1)
    for batch in batches:
        assert len({text_video[int(i)] for i in batch}) == 4
    assert len(sample_pair_batches(list(range(5)), 8, 6)) == 1
    with pytest.raises(ValueError, match="at least 2 videos"):
        sample_pair_batches([0, 0, 0], 4, 2)


# --------------------------------------------------------------------------------------------- GARE geometry


@pytest.mark.parametrize("variant", GARE_VARIANTS, ids=lambda v: ",".join(f"{k}={x}" for k, x in v.items()) or "ref")
def test_pair_features_are_the_diagonal_of_the_block(variant: dict) -> None:
    head = gare_head(**variant)
    text, video = gare_features(5, 5, seed=5)
    t, v = head.encode_texts(text), head.encode_videos(video)
    with torch.no_grad():
        delta, pooled = gare_pair_features(head.psi, t, v, head.options)
        block = gare_delta(head.psi, t, v, head.options)
        pool = pooled_video(t.eot, v, head.options).expand(5, 5, D)
    torch.testing.assert_close(delta, block.diagonal(dim1=0, dim2=1).T, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(pooled, pool.diagonal(dim1=0, dim2=1).T, rtol=1e-5, atol=1e-6)


def test_delta_geometry_against_a_hand_computation() -> None:
    anchor = torch.tensor([[1.0, 0.0], [2.0, 0.0]])
    delta = torch.tensor([[0.0, 1.0], [-1.0, 0.0]])
    target = torch.tensor([[0.0, 2.0], [1.0, 0.0]])
    got = delta_geometry(anchor, delta, target)
    expected = {
        "cos_before": [0.0, 1.0],
        "cos_after": [1 / math.sqrt(2), 1.0],
        "norm_before": [1.0, 2.0],
        "norm_after": [math.sqrt(2), 1.0],
        "dist_before": [math.sqrt(5), 1.0],
        "dist_after": [math.sqrt(2), 0.0],
        "angle": [math.degrees(math.acos(2 / math.sqrt(5))), 0.0],
    }
    for key, values in expected.items():
        assert got[key].tolist() == pytest.approx(values, abs=1e-5), key


def test_scores_without_delta_and_hard_negatives() -> None:
    for pool in ("text_softmax", "mean"):
        head = gare_head(video_pool=pool)
        text, video = gare_features(4, 3, seed=6)
        t, v = head.encode_texts(text), head.encode_videos(video)
        before = gare_scores_without_delta(head, t, v)
        vp = pooled_video(t.eot, v, head.options)
        expected = (t.eot[:, None] * vp).sum(-1) / (t.eot.norm(dim=-1)[:, None] * vp.norm(dim=-1))
        torch.testing.assert_close(before, expected, rtol=1e-5, atol=1e-6)

    before = torch.tensor([[0.9, 0.8, 0.1, 0.5], [0.2, 0.3, 0.7, 0.6]])
    after = torch.tensor([[0.7, 0.75, 0.2, 0.4], [0.1, 0.5, 0.6, 0.65]])
    data = hard_negative_alignment(before, after, [0, 1], k=2)
    # caption 0: hardest by the score before are videos 1 (0.8) then 3 (0.5); caption 1: 2 (0.7) then 3 (0.6)
    assert data["before"]["mean"] == pytest.approx([(0.8 + 0.7) / 2, (0.5 + 0.6) / 2])
    assert data["after"]["mean"] == pytest.approx([(0.75 + 0.6) / 2, (0.4 + 0.65) / 2])
    assert data["before"]["gap_to_hardest"] == pytest.approx([0.9 - 0.8, 0.3 - 0.7])
    assert data["after"]["gap_to_hardest"] == pytest.approx([0.7 - 0.75, 0.5 - 0.6])
    assert data["after"]["positive_mean"] == pytest.approx((0.7 + 0.5) / 2)
    assert data["before"]["spread"] == pytest.approx([0.15, 0.05])


def test_sampled_negatives_never_hit_the_positive() -> None:
    text_video = [0, 1, 2, 2, 4, 3]
    ti, vi = sample_negatives(text_video, 5, 3, seed=2)
    assert ti.tolist() == [k for k in range(6) for _ in range(3)]
    pairs = vi.view(6, 3)
    for k, gt in enumerate(text_video):
        assert gt not in pairs[k].tolist() and len(set(pairs[k].tolist())) == 3
    assert sample_negatives([0], 1, 3)[0].numel() == 0


# --------------------------------------------------------------------------------------------- TV-ProxyNet


def proxy_setup(n: int = 6, seed: int = 0) -> tuple[ProxyHead, object, object]:
    torch.manual_seed(seed)
    head = ProxyHead(D, ProxyOptions(ffn_dim=12, num_proxies=3, gamma_max=1.0, gamma_step=0.25)).eval()
    g = torch.Generator().manual_seed(seed)
    text = TextFeatures(torch.randn(n, D, generator=g))
    video = VideoFeatures(torch.randn(n, 1, D, generator=g), torch.ones(n, 1), torch.randn(n, 3, D, generator=g))
    return head, text, video


def test_gamma_sweep_at_zero_equals_the_baseline_recall() -> None:
    head, text, video = proxy_setup()
    ts, vs = head.encode_texts(text), head.encode_videos(video)
    data = gamma_sweep(head, ts, vs, list(range(6)), "one_to_one")
    assert [r["gamma"] for r in data["rows"]] == [0.0, 0.25, 0.5, 0.75, 1.0]
    # the CLIP-ViP baseline on the same features: a CLIP4Clip head (mean pooling of the one slot)
    baseline = Clip4ClipHead(D)
    sim = baseline.score(baseline.encode_texts(text), baseline.encode_videos(video))
    expected = evaluate(sim, list(range(6)), "one_to_one")
    assert data["rows"][0]["t2v"] == expected["t2v"] and data["rows"][0]["v2t"] == expected["v2t"]
    # every other γ is what the head itself scores with that γ stored
    for row in data["rows"][1:]:
        head.set_inference_setting({"gamma": row["gamma"]})
        metrics = evaluate(head.score(ts, vs), list(range(6)), "one_to_one")
        assert row["t2v"] == pytest.approx(metrics["t2v"]) and row["v2t"] == pytest.approx(metrics["v2t"])


def test_q_is_the_text_side_of_the_score() -> None:
    head, text, video = proxy_setup(seed=1)
    ts, vs = head.encode_texts(text), head.encode_videos(video)
    head.set_inference_setting({"gamma": 0.7})
    data = proxy_queries(head, ts[:4], vs, 0.7)
    assert data["q"].shape == (4, 6, D)
    # with unit v_j the score cos(t, v) + γ·cos(t^p, v) is q_ij · v_j (seed 002 appendix)
    got = torch.einsum("tvd,vd->tv", data["q"], F.normalize(data["v"], dim=-1))
    torch.testing.assert_close(got, head.score(ts[:4], vs), rtol=1e-5, atol=1e-6)
    # and |q|² = 1 + γ² + 2γ·s(t, t^p)
    tp = head.generator(ts.emb[:4], vs.proxies)
    s = F.cosine_similarity(ts.emb[:4, None], tp, dim=-1)
    torch.testing.assert_close(data["q"].square().sum(-1), 1 + 0.49 + 1.4 * s, rtol=1e-5, atol=1e-6)


def test_query_proxy_correlation_against_the_generator() -> None:
    head, text, video = proxy_setup(seed=2)
    ts, vs = head.encode_texts(text), head.encode_videos(video)
    text_video = [0, 1, 2, 3, 4, 5]
    data = proxy_query_correlation(head, ts, vs, text_video, negatives_per_text=2, seed=3)
    _, neg_videos = sample_negatives(text_video, 6, 2, seed=3)
    with torch.no_grad():
        full = F.cosine_similarity(ts.emb[:, None], head.generator(ts.emb, vs.proxies), dim=-1)
    assert data["positive"] == pytest.approx(full.diagonal().tolist(), abs=1e-5)
    expected_neg = full[torch.arange(6).repeat_interleave(2), neg_videos].view(6, 2)
    assert data["negative"] == pytest.approx(expected_neg.reshape(-1).tolist(), abs=1e-5)
    frac = float((full.diagonal() <= expected_neg.mean(1)).float().mean())
    assert data["fraction_positive_below_negative_mean"] == pytest.approx(frac)


def test_two_dimensional_embeddings() -> None:
    g = torch.Generator().manual_seed(0)
    plane = torch.randn(30, 2, generator=g, dtype=torch.float64)
    basis = torch.linalg.qr(torch.randn(6, 2, generator=g, dtype=torch.float64))[0]
    points = plane @ basis.T + 3.0
    coords = embed_2d(points, "pca")
    # points on a plane: PCA's two components keep every distance
    np.testing.assert_allclose(
        torch.cdist(torch.from_numpy(coords), torch.from_numpy(coords)).numpy(),
        torch.cdist(points, points).numpy(),
        atol=1e-6,
    )
    tsne = embed_2d(points.float(), "tsne", seed=1)
    assert tsne.shape == (30, 2) and np.isfinite(tsne).all()
    np.testing.assert_array_equal(tsne, embed_2d(points.float(), "tsne", seed=1))
    with pytest.raises(ValueError, match="umap"):
        embed_2d(points, "umap")


# --------------------------------------------------------------------------------------------- GraviAlign


def gravi_setup(n: int = 6, seed: int = 0) -> tuple[GraviAlignHead, object, object, TextFeatures]:
    torch.manual_seed(seed)
    head = GraviAlignHead(D, GraviAlignOptions(logvar_weight_std=0.3)).eval()
    g = torch.Generator().manual_seed(seed)
    mask = torch.zeros(n, 8, dtype=torch.long)
    for k in range(n):
        mask[k, : 3 + k] = 1
    text = TextFeatures(torch.randn(n, D, generator=g), torch.randn(n, 8, D, generator=g), mask)
    video = VideoFeatures(torch.randn(n, 1, D, generator=g), torch.ones(n, 1))
    return head, head.encode_texts(text), head.encode_videos(video), text


def test_uncertainty_statistics_by_hand() -> None:
    head, ts, vs, text = gravi_setup()
    assert caption_lengths(text).tolist() == [1, 2, 3, 4, 5, 6]  # tokens without SOT / EOT
    assert caption_lengths(TextFeatures(text.eot)) is None
    torch.testing.assert_close(mean_variance(ts), ts.logvar.exp().mean(-1))
    sim = head.score(ts, vs)
    data = uncertainty_vs_ambiguity(ts, vs, sim, list(range(6)), "one_to_one", caption_lengths(text))
    ranks = protocol_ranks(sim, list(range(6)), "one_to_one")
    assert data["t2v_rank"] == ranks["t2v"].tolist() and data["v2t_rank"] == ranks["v2t"].tolist()
    assert data["spearman_text_variance_vs_length"] == pytest.approx(
        spearman(mean_variance(ts).numpy(), np.arange(1, 7))
    )
    assert spearman([1, 2, 3, 4], [10, 20, 30, 40]) == pytest.approx(1.0)
    assert spearman([1, 2, 3, 4], [4, 3, 2, 1]) == pytest.approx(-1.0)
    assert spearman([1, 1, 1], [1, 2, 3]) is None


def test_sgi_terms_and_modes() -> None:
    head, ts, vs, _ = gravi_setup(seed=1)
    data = sgi_term_distributions(head, ts, vs, list(range(6)), negatives_per_text=2, seed=0)
    expected = sgi_align_terms(vs.mu, vs.logvar, ts.mu, ts.logvar, **head.sgi_kwargs())
    for name in "ABC":
        assert data["positive"][name] == pytest.approx(expected[name].tolist(), rel=1e-5)
        assert len(data["negative"][name]) == 12
    modes = mode_comparison(head, ts, vs, list(range(6)), "one_to_one")
    names = [r["setting"]["mode"] for r in modes["rows"]]
    assert names[:3] == ["cos_f", "cos_mu", "s_align"] and names.count("mixed") == 4
    assert [r["chosen"] for r in modes["rows"]].count(True) == 1 and modes["rows"][0]["chosen"]
    for row in modes["rows"][:3]:
        head.set_inference_setting(row["setting"])
        metrics = evaluate(head.score(ts, vs), list(range(6)), "one_to_one")
        assert row["t2v"] == pytest.approx(metrics["t2v"])


# --------------------------------------------------------------------------------------------- any head


@pytest.mark.parametrize("protocol", ["one_to_one", "multi_caption"])
def test_ranks_and_recall_agree_with_the_evaluator(protocol: str) -> None:
    g = torch.Generator().manual_seed(0)
    if protocol == "one_to_one":
        text_video = torch.randperm(9, generator=g).tolist()
        sim = torch.randn(9, 9, generator=g)
    else:
        text_video = [0, 0, 1, 2, 2, 2, 3, 4, 4]
        sim = torch.randn(9, 5, generator=g)
    ranks = protocol_ranks(sim, text_video, protocol)
    metrics = evaluate(sim, text_video, protocol)
    for direction in ("t2v", "v2t"):
        r = ranks[direction]
        for k in (1, 5, 10):
            assert 100 * np.mean(r <= k) == pytest.approx(metrics[direction][f"R{k}"])
        assert np.median(r) == pytest.approx(metrics[direction]["MdR"])
        assert np.mean(r) == pytest.approx(metrics[direction]["MnR"])


def test_score_distributions_and_rank_bins_by_hand() -> None:
    sim = torch.tensor([[0.9, 0.1, 0.3], [0.2, 0.5, float("-inf")], [0.4, 0.6, 0.7]])
    data = score_distributions(sim, [0, 1, 2], bins=4)
    assert data["positive"]["count"] == 3 and data["positive"]["mean"] == pytest.approx((0.9 + 0.5 + 0.7) / 3)
    negatives = [0.1, 0.3, 0.2, 0.4, 0.6]
    assert data["negative"]["count"] == 5 and data["negative"]["non_finite"] == 1
    assert data["negative"]["mean"] == pytest.approx(np.mean(negatives))
    assert data["negative"]["std"] == pytest.approx(np.std(negatives))
    assert sum(data["negative"]["counts"]) == 5 and sum(data["positive"]["counts"]) == 3
    assert data["edges"][0] == pytest.approx(0.1) and data["edges"][-1] == pytest.approx(0.9)
    hist = rank_histogram(np.array([1, 1, 2, 5, 6, 12, 30]), 30)
    assert hist["bins"] == ["1", "2", "3", "4", "5", "6-10", "11-20", "21-30"]
    assert hist["counts"] == [2, 1, 0, 0, 1, 1, 1, 1]
    stats = describe([1.0, 2.0, float("nan"), 3.0])
    assert stats["count"] == 3 and stats["non_finite"] == 1 and stats["median"] == 2.0


def test_a_figure_is_a_png_of_its_size_with_its_numbers(tmp_path: Path) -> None:
    fig, axes = new_figure(4.0, 3.0, 1, 2)
    axes[0, 0].plot([0, 1], [1, 0])
    size = png_size(fig)
    files = write_figure(
        tmp_path,
        "demo",
        fig,
        {"values": np.array([1.0, np.nan]), "t": torch.tensor([2.0])},
        title="a test",
        rows=[{"step": 1, "value": 0.5}, {"step": 2, "value": None, "x": "a"}],
    )
    assert size == (400, 300)
    with Image.open(tmp_path / files.png) as image:
        assert image.size == size and image.format == "PNG"
        assert len(np.unique(np.asarray(image.convert("RGB")).reshape(-1, 3), axis=0)) > 2  # something was drawn
    data = json.loads((tmp_path / files.json).read_text())
    assert data == {"figure": "demo", "title": "a test", "values": [1.0, None], "t": [2.0]}
    assert (tmp_path / "demo.csv").read_text().splitlines() == ["step,value,x", "1,0.5,", "2,,a"]
    assert jsonable({"a": np.float32(1.5), "b": float("inf")}) == {"a": 1.5, "b": None}


def test_split_labels_never_present_test_numbers_as_selection() -> None:
    assert "not for model selection" in split_label("test")
    assert "not for model selection" in split_label("test_multi")
    assert split_label("val") == "val split"
    assert "fitted" in split_label("train")


def test_caption_samples_are_seeded_and_bounded() -> None:
    from tvr.analysis.pairs import sample_captions

    assert sample_captions(5, 10).tolist() == [0, 1, 2, 3, 4]
    rows = sample_captions(100, 7, seed=3)
    assert rows.numel() == 7 and rows.tolist() == sorted(set(rows.tolist()))
    assert rows.tolist() == sample_captions(100, 7, seed=3).tolist()
