"""GARE head (spec §3): ψ, the per-pair block against a pair-by-pair reference, chunking, training, presets."""

from __future__ import annotations

import dataclasses
import itertools
import math
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

import tvr.methods.gare.head as gare_module
from tvr.config import Config, HeadConfig, load_config
from tvr.losses import symmetric_infonce
from tvr.methods.gare import GareHead, GareOptions, Psi, gare_block
from tvr.methods.gare.losses import gare_direction, gare_kl, gare_radius
from tvr.models.heads.base import LN_100
from tvr.pipeline import resolve_config
from tvr.types import TextFeatures, VideoFeatures

REPO = Path(__file__).resolve().parents[1]
PRESETS = sorted((REPO / "tvr" / "methods" / "gare" / "presets").rglob("*.yaml"))


def load(path: Path) -> Config:
    """A preset with its head options resolved against the head's dataclass (as every entry point does)."""
    cfg = load_config(path)
    cfg = resolve_config(cfg)
    return cfg


D = 32


def make_features(n_t: int, n_v: int, dim: int = D, frames: int = 6, words: int = 5, seed: int = 0):
    """Random features with some padded frames / words (the first item of each is never padded)."""
    g = torch.Generator().manual_seed(seed)
    eot = torch.randn(n_t, dim, generator=g)
    word_feats = torch.randn(n_t, words, dim, generator=g)
    word_lens = torch.randint(2, words + 1, (n_t,), generator=g)
    word_lens[0] = words
    word_mask = (torch.arange(words).unsqueeze(0) < word_lens.unsqueeze(1)).long()
    frame_feats = torch.randn(n_v, frames, dim, generator=g)
    frame_lens = torch.randint(1, frames + 1, (n_v,), generator=g)
    frame_lens[0] = frames
    frame_mask = (torch.arange(frames).unsqueeze(0) < frame_lens.unsqueeze(1)).long()
    return TextFeatures(eot, word_feats, word_mask), VideoFeatures(frame_feats, frame_mask)


def pair_reference(psi: Psi, text: TextFeatures, video: VideoFeatures, o: GareOptions) -> torch.Tensor:
    """s_ij computed one pair at a time straight from the spec's formulas (ψ called on a single query)."""
    n_t, n_v = len(text), len(video)
    scores = torch.empty(n_t, n_v)
    for i, j in itertools.product(range(n_t), range(n_v)):
        t = text.eot[i]
        frames, fmask = video.frames[j], video.frame_mask[j].float()
        if o.mask_frames:
            vbar = (frames * fmask[:, None]).sum(0) / fmask.sum().clamp_min(1)
        else:
            vbar = frames.mean(0)
        query = o.eta * (vbar - t) if o.gap_query else t
        if o.context == "frames":
            ctx, cmask = frames, video.frame_mask[j]
        else:
            ctx, cmask = text.words[i], text.word_mask[i]
        if o.mask_frames:
            ctx = ctx[cmask.bool()]  # dropping padded keys == masking them
        out = psi(query.view(1, 1, -1), ctx.unsqueeze(0))[0, 0]
        delta = out if o.gap_query else o.eta * (vbar - out)
        if o.video_pool == "mean":
            vpool = vbar
        else:
            w = torch.softmax(frames @ t / o.pool_temperature, dim=0) * fmask
            vpool = (w[:, None] * frames).sum(0)
        if o.corrected_side == "text":
            scores[i, j] = F.cosine_similarity(t + delta, vpool, dim=0, eps=0)
        else:
            scores[i, j] = F.cosine_similarity(t, vpool + delta, dim=0, eps=0)
    return scores


VARIANTS = [
    dict(corrected_side=side, context=ctx, eta=eta, gap_query=gap)
    for side, ctx, eta, gap in itertools.product(["text", "video"], ["frames", "words"], [1.0, -1.0], [True, False])
]


# ----------------------------------------------------------------------------- ψ


def test_psi_shapes_and_reexport() -> None:
    from tvr.methods.gare.psi import Psi as PsiOriginal

    assert Psi is PsiOriginal
    psi = Psi(D).eval()
    out = psi(torch.randn(3, 4, D), torch.randn(4, 7, D))
    assert out.shape == (3, 4, D)
    assert psi.attention_weights(torch.randn(3, 4, D), torch.randn(4, 7, D)).shape == (3, 4, 7)
    with pytest.raises(ValueError, match="N_v"):
        psi(torch.randn(3, 4, D), torch.randn(5, 7, D))


def test_psi_mask_equals_dropping_padded_keys() -> None:
    psi = Psi(D).eval()
    query, ctx = torch.randn(2, 3, D), torch.randn(3, 5, D)
    mask = torch.tensor([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1], [1, 0, 0, 0, 0]])
    masked = psi(query, ctx, mask)
    for j in range(3):
        keep = mask[j].bool()
        alone = psi(query[:, j : j + 1], ctx[j : j + 1, keep])
        torch.testing.assert_close(masked[:, j : j + 1], alone)
    weights = psi.attention_weights(query, ctx, mask)
    assert torch.all(weights[:, ~mask.bool()] == 0)


def test_psi_inits() -> None:
    normal = Psi(256, init="normal0.02")
    identity = Psi(D, init="identity")
    for name in ("q_proj", "k_proj", "v_proj", "out_proj", "linear", "delta_proj"):
        lin_n, lin_i = getattr(normal, name), getattr(identity, name)
        assert lin_n.weight.std().item() == pytest.approx(0.02, rel=0.05)
        assert abs(lin_n.weight.mean().item()) < 2e-3
        assert torch.count_nonzero(lin_n.bias) == 0
        torch.testing.assert_close(lin_i.weight, torch.eye(D))
        assert torch.count_nonzero(lin_i.bias) == 0
    for ln in (identity.ln_in, identity.ln_attn, identity.ln_out):
        assert torch.all(ln.weight == 1) and torch.all(ln.bias == 0)
    with pytest.raises(ValueError, match="psi init"):
        Psi(D, init="xavier")


def test_head_psi_init_and_dropout_follow_options() -> None:
    head = GareHead(D, GareOptions(psi_init="identity", psi_dropout=0.1))
    torch.testing.assert_close(head.psi.q_proj.weight, torch.eye(D))
    assert head.psi.dropout.p == 0.1


# ----------------------------------------------------------------------------- the block


@pytest.mark.parametrize("variant", VARIANTS, ids=lambda v: "-".join(str(x) for x in v.values()))
@pytest.mark.parametrize("mask_frames", [False, True])
def test_block_matches_pair_by_pair_reference(variant: dict, mask_frames: bool) -> None:
    opts = GareOptions(**variant, mask_frames=mask_frames)
    psi = Psi(D).eval()
    with torch.no_grad():
        for ln in (psi.ln_in, psi.ln_attn, psi.ln_out):  # non-trivial LayerNorm affine parameters
            ln.weight.uniform_(0.5, 1.5)
            ln.bias.normal_(0, 0.1)
    text, video = make_features(4, 3)
    with torch.no_grad():
        scores, delta = gare_block(psi, text, video, opts)
        expected = pair_reference(psi, text, video, opts)
    assert scores.shape == (4, 3) and delta.shape == (4, 3, D)
    torch.testing.assert_close(scores, expected, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("pool", ["mean", "text_softmax"])
@pytest.mark.parametrize("temperature", [3.0, 0.5])
def test_block_pooling_and_temperature(pool: str, temperature: float) -> None:
    opts = GareOptions(video_pool=pool, pool_temperature=temperature)
    psi = Psi(D).eval()
    text, video = make_features(3, 4)
    with torch.no_grad():
        torch.testing.assert_close(gare_block(psi, text, video, opts)[0], pair_reference(psi, text, video, opts))


def test_masking_makes_padding_content_irrelevant() -> None:
    text, video = make_features(3, 4)
    noisy_video = VideoFeatures(
        torch.where(video.frame_mask.bool()[..., None], video.frames, torch.randn_like(video.frames) * 10),
        video.frame_mask,
    )
    noisy_text = TextFeatures(
        text.eot,
        torch.where(text.word_mask.bool()[..., None], text.words, torch.randn_like(text.words) * 10),
        text.word_mask,
    )
    psi = Psi(D).eval()
    with torch.no_grad():
        for context in ("frames", "words"):
            masked = GareOptions(context=context, mask_frames=True, video_pool="mean")
            torch.testing.assert_close(
                gare_block(psi, text, video, masked)[0], gare_block(psi, noisy_text, noisy_video, masked)[0]
            )
            # reference behaviour (unmasked) does see the padding
            plain = dataclasses.replace(masked, mask_frames=False)
            assert not torch.allclose(
                gare_block(psi, text, video, plain)[0], gare_block(psi, noisy_text, noisy_video, plain)[0]
            )


def test_fully_padded_item_stays_finite() -> None:
    text, video = make_features(3, 2)
    video.frame_mask[1] = 0
    text.word_mask[2] = 0
    with torch.no_grad():
        for context in ("frames", "words"):
            scores, _ = gare_block(Psi(D).eval(), text, video, GareOptions(context=context, mask_frames=True))
            assert torch.isfinite(scores).all()


def test_word_context_needs_words() -> None:
    head = GareHead(D, GareOptions(context="words"))
    with pytest.raises(ValueError, match="words"):
        head.encode_texts(TextFeatures(torch.randn(2, D)))


@pytest.mark.parametrize(
    "field,value",
    [
        ("corrected_side", "both"),
        ("context", "audio"),
        ("eta", 0.5),
        ("video_pool", "max"),
        ("pool_temperature", 0.0),
        ("psi_init", "xavier"),
        ("psi_dropout", 1.0),
        ("kl_reduction", "median"),
        ("kl_weight", -1.0),
        ("scorer", "approx"),
    ],
)
def test_invalid_options_name_the_field(field: str, value: object) -> None:
    with pytest.raises(ValueError, match=f"head.options.{field}"):
        GareHead(8, GareOptions(**{field: value}))  # the base constructor checks the options


# ----------------------------------------------------------------------------- scoring


@pytest.mark.parametrize("variant", [VARIANTS[0], VARIANTS[7], VARIANTS[10]])
def test_chunked_score_equals_unchunked(variant: dict) -> None:
    head = GareHead(D, GareOptions(**variant, scorer="exact", mask_frames=True)).eval()
    text, video = make_features(7, 5)
    ts, vs = head.encode_texts(text), head.encode_videos(video)
    with torch.no_grad():
        full, _ = gare_block(head.psi, ts, vs, head.options)
    chunked = head.score(ts, vs, text_chunk=3, video_chunk=2)
    torch.testing.assert_close(chunked, full, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(head.score(ts, vs), full, rtol=1e-6, atol=1e-6)


def test_default_blocks_are_bounded() -> None:
    head = GareHead(D, GareOptions(scorer="exact")).eval()
    seen: list[tuple[int, int]] = []
    original = head.score_block

    def spy(ts, vs):
        seen.append((len(ts), len(vs)))
        return original(ts, vs)

    head.score_block = spy  # type: ignore[method-assign]
    text, video = make_features(GareHead.default_text_chunk + 3, GareHead.default_video_chunk + 1, frames=2, words=2)
    head.score(head.encode_texts(text), head.encode_videos(video))
    assert max(t for t, _ in seen) <= GareHead.default_text_chunk
    assert max(v for _, v in seen) <= GareHead.default_video_chunk
    assert sum(t * v for t, v in seen) == len(text) * len(video)


def test_auto_scorer_agrees_with_exact() -> None:
    text, video = make_features(9, 6)
    for variant in VARIANTS:
        exact = GareHead(D, GareOptions(**variant, scorer="exact")).eval()
        auto = GareHead(D, GareOptions(**variant, scorer="auto")).eval()
        auto.load_state_dict(exact.state_dict())
        ts, vs = exact.encode_texts(text), exact.encode_videos(video)
        torch.testing.assert_close(auto.score(ts, vs), exact.score(ts, vs), rtol=1e-4, atol=1e-4)


def test_two_stage_rerank_scores_the_shortlist_exactly() -> None:
    text, video = make_features(8, 10)
    head = GareHead(D, GareOptions(scorer="auto")).eval()
    ts, vs = head.encode_texts(text), head.encode_videos(video)
    full = head.score(ts, vs)
    for k in (3, 10):
        got = head.score_two_stage(ts, vs, k)
        # the shortlist is the top-k videos by cos(t_i, mean frame); those get the exact score, the rest -inf
        vbar = video.frames.mean(1)
        expected_idx = torch.topk(F.normalize(text.eot, dim=-1) @ F.normalize(vbar, dim=-1).T, k, dim=1).indices
        finite = torch.isfinite(got)
        assert finite.sum(1).tolist() == [k] * len(text)
        assert torch.equal(finite, torch.zeros_like(finite).scatter_(1, expected_idx, True))
        torch.testing.assert_close(got[finite], full[finite], rtol=1e-5, atol=1e-5)
        if k == 10:  # K = gallery: exhaustive exact scoring
            torch.testing.assert_close(got, full, rtol=1e-5, atol=1e-5)


class _DoubledPsi(Psi):
    """A ψ whose structure the factorisation does not know (its own forward)."""

    def forward(self, query, context, context_mask=None):  # noqa: ANN001, ANN201
        return super().forward(query, context, context_mask) * 2.0


def test_scorer_dispatch() -> None:
    text, video = make_features(5, 4)
    head = GareHead(D, GareOptions(scorer="auto")).eval()
    ts, vs = head.encode_texts(text), head.encode_videos(video)
    assert head._use_fast(ts, vs)
    assert not GareHead(D, GareOptions(scorer="exact")).eval()._use_fast(ts, vs)
    # an unknown ψ: auto keeps the exact per-pair path (and still scores), fast refuses
    head.psi = _DoubledPsi(D).eval()
    assert not head._use_fast(ts, vs)
    torch.testing.assert_close(head.score(ts, vs), gare_block(head.psi, ts, vs, head.options)[0], rtol=0, atol=0)
    forced = GareHead(D, GareOptions(scorer="fast")).eval()
    forced.psi = _DoubledPsi(D).eval()
    with pytest.raises(ValueError, match="_DoubledPsi"):
        forced._use_fast(ts, vs)
    # word context + text_softmax: auto keeps the direct path once L·F > D (here 5·6 = 30 ≤ 32 < 8·6 = 48)
    words_head = GareHead(D, GareOptions(scorer="auto", context="words")).eval()
    small_t, small_v = make_features(3, 2, frames=6, words=5)
    big_t, big_v = make_features(3, 2, frames=6, words=8)
    assert words_head._use_fast(words_head.encode_texts(small_t), small_v)
    assert not words_head._use_fast(words_head.encode_texts(big_t), big_v)
    forced = GareHead(D, GareOptions(scorer="fast", context="words")).eval()
    assert forced._use_fast(forced.encode_texts(big_t), big_v)


def test_training_mode_score_uses_direct_path() -> None:
    head = GareHead(D, GareOptions(scorer="auto")).train()
    assert not head._use_fast()
    with pytest.raises(RuntimeError, match="eval mode"):
        GareHead(D, GareOptions(scorer="fast")).train()._use_fast()


# ----------------------------------------------------------------------------- loss and training


def test_loss_components_and_total() -> None:
    head = GareHead(D, GareOptions(psi_dropout=0.0))
    text, video = make_features(6, 6)
    out = head.loss(text, video)
    scores, delta = gare_block(head.psi, head.encode_texts(text), head.encode_videos(video), head.options)
    o = head.options
    infonce = symmetric_infonce(math.exp(LN_100) * scores)
    kl, direction, radius = gare_kl(delta, "sum"), gare_direction(delta, 2.0), gare_radius(delta, 0.5)
    expected = infonce + o.kl_weight * kl + o.direction_weight * direction + o.radius_weight * radius
    for key, value in [("infonce", infonce), ("kl", kl), ("direction", direction), ("radius", radius)]:
        torch.testing.assert_close(out[key], value.detach())
        assert not out[key].requires_grad
    torch.testing.assert_close(out["loss"], expected)
    assert out["loss"].requires_grad


def test_zero_weight_terms_are_skipped(monkeypatch: pytest.MonkeyPatch) -> None:
    def boom(*args, **kwargs):
        raise AssertionError("a zero-weight term was computed")

    for name in ("gare_kl_moments", "gare_direction_rows", "gare_radius_rows", "gare_radius_hinge"):
        monkeypatch.setattr(gare_module, name, boom)
    head = GareHead(D, GareOptions(kl_weight=0.0, direction_weight=0.0, radius_weight=0.0, psi_dropout=0.0))
    text, video = make_features(5, 5)
    out = head.loss(text, video)
    assert not {"kl", "direction", "radius"} & set(out)
    torch.testing.assert_close(out["loss"], out["infonce"])


def test_loss_gradient_reaches_every_psi_parameter_and_logit_scale() -> None:
    head = GareHead(D, GareOptions(mask_frames=True)).train()
    text, video = make_features(6, 6)
    head.loss(text, video)["loss"].backward()
    for name, param in head.named_parameters():
        assert param.grad is not None and torch.isfinite(param.grad).all(), name
        assert param.grad.abs().sum() > 0, name


@pytest.mark.parametrize("variant", VARIANTS, ids=lambda v: "-".join(str(x) for x in v.values()))
@pytest.mark.parametrize("kl_reduction", ["sum", "mean"])
def test_every_variant_trains_and_scores_finitely(variant: dict, kl_reduction: str) -> None:
    opts = GareOptions(**variant, kl_reduction=kl_reduction, kl_weight=1e-4 if kl_reduction == "sum" else 0.07)
    head = GareHead(D, opts)
    text, video = make_features(6, 6)
    out = head.loss(text, video)
    assert all(torch.isfinite(v).all() for v in out.values())
    out["loss"].backward()
    head.eval()
    scores = head.score(head.encode_texts(text), head.encode_videos(video))
    assert scores.shape == (6, 6) and torch.isfinite(scores).all()
    assert scores.abs().max() <= 1 + 1e-5


def test_few_optimisation_steps_decrease_the_loss() -> None:
    torch.manual_seed(0)
    head = GareHead(D, GareOptions(psi_dropout=0.0))
    text, video = make_features(8, 8, frames=4, words=4)
    opt = torch.optim.Adam(head.parameters(), lr=1e-3)
    losses = []
    for _ in range(15):
        out = head.loss(text, video)
        opt.zero_grad()
        out["loss"].backward()
        opt.step()
        head.clamp_logit_scale()
        losses.append(out["loss"].item())
    assert losses[-1] < 0.5 * losses[0], losses


# ----------------------------------------------------------------------------- presets


def test_presets_exist() -> None:
    names = {p.relative_to(REPO / "tvr" / "methods" / "gare" / "presets").as_posix() for p in PRESETS}
    assert {"msrvtt.yaml", "msvd.yaml", "didemo.yaml", "activitynet.yaml"} <= names
    assert len([n for n in names if n.startswith("ablations/")]) >= 7


@pytest.mark.parametrize("path", PRESETS, ids=lambda p: p.relative_to(REPO / "tvr").as_posix())
def test_preset_loads_and_runs_one_step(path: Path) -> None:
    from tvr.models.heads.registry import build_head

    cfg = load(path)
    head = build_head(cfg.head, D, LN_100)
    if path.name == "baseline.yaml":  # GARE's "Baseline" row: no Δ, text-conditioned pooling in the score
        assert cfg.head.name == "clip4clip" and cfg.head.options.video_pool == "text_softmax"
    else:
        assert cfg.head.name == "gare"
        assert isinstance(head, GareHead) and head.options == cfg.head.options
    b = 4
    text, video = make_features(b, b, frames=cfg.data.max_frames, words=cfg.data.max_words)
    opt = torch.optim.SGD(head.parameters(), lr=1e-3)
    out = head.loss(text, video)
    out["loss"].backward()
    opt.step()
    assert torch.isfinite(out["loss"])


def test_paper_settings_in_presets() -> None:
    gare = REPO / "tvr" / "methods" / "gare" / "presets"
    msrvtt = load(gare / "msrvtt.yaml")
    assert msrvtt.head.options == GareOptions()  # the released MSR-VTT configuration is the default
    assert (msrvtt.data.max_words, msrvtt.data.max_frames, msrvtt.model.temporal) == (32, 12, "seqTransf")
    t = msrvtt.train
    expected = (1e-4, 1e-3, 128, 5, 0.1, 5)
    assert (t.lr, t.backbone_lr_coef, t.batch_size, t.epochs, t.warmup, t.schedule_epochs) == expected
    assert (t.weight_decay, t.grad_clip, msrvtt.data.augment) == (0.2, 1.0, True)
    assert load(gare / "msvd.yaml").model.temporal == "none"
    anet = load(gare / "activitynet.yaml")
    opts = anet.head.options
    assert (opts.corrected_side, opts.context, opts.eta) == ("video", "words", 1.0)
    assert (anet.data.max_words, anet.data.max_frames, anet.train.epochs) == (64, 64, 10)
    didemo = load(gare / "didemo.yaml")
    assert (didemo.head.options.corrected_side, didemo.head.options.context) == ("text", "frames")
    assert (didemo.data.max_words, didemo.data.max_frames) == (64, 64)


@pytest.mark.parametrize(
    "name,kl,radius,direction",
    [
        ("delta_only", 0, 0, 0),
        ("delta_radius", 0, 1, 0),
        ("delta_direction", 0, 0, 1),
        ("delta_radius_direction", 0, 1, 1),
        ("delta_ib", 1, 0, 0),
        ("all", 1, 1, 1),
    ],
)
def test_loss_ablation_presets(name: str, kl: int, radius: int, direction: int) -> None:
    cfg = load(REPO / "tvr" / "methods" / "gare" / "presets" / "ablations" / f"{name}.yaml")
    g = cfg.head.options
    assert (g.kl_weight > 0, g.radius_weight > 0, g.direction_weight > 0) == (bool(kl), bool(radius), bool(direction))
    assert cfg.data.dataset == "msrvtt"


def test_no_gap_preset() -> None:
    cfg = load(REPO / "tvr" / "methods" / "gare" / "presets" / "ablations" / "no_gap_query.yaml")
    assert cfg.head.options.gap_query is False and cfg.head.options.context == "frames"


def test_head_config_round_trip_through_registry() -> None:
    from tvr.models.heads.registry import build_head

    head = build_head(HeadConfig(name="gare", options={"corrected_side": "video"}), D, 2.0)
    assert isinstance(head, GareHead) and head.options.corrected_side == "video"
    assert head.logit_scale.item() == pytest.approx(2.0)


def test_a_video_whose_increments_agree_over_texts_keeps_finite_gradients() -> None:
    """Identical captions give every video one Δ over the texts: σ_jd = 0 + 1e-6, a finite L_IB, and the zero
    subgradient where sqrt's derivative would be 0·∞ (bf16 autocast rounds near-equal increments to this case)."""
    torch.manual_seed(0)
    head = GareHead(D, GareOptions(psi_dropout=0.0))
    text, video = make_features(4, 4)
    same = TextFeatures(text.eot[:1].repeat(4, 1), text.words[:1].repeat(4, 1, 1), text.word_mask[:1].repeat(4, 1))
    out = head.loss(same, video)
    delta = gare_block(head.psi, head.encode_texts(same), head.encode_videos(video), head.options)[1]
    expected = gare_kl(delta.detach(), head.options.kl_reduction)  # the formula: −log(1e-6) + ½μ² − ½ per dimension
    assert torch.isfinite(out["kl"]) and torch.allclose(out["kl"], expected, rtol=1e-5)
    out["loss"].backward()
    grads = [p.grad for p in head.parameters() if p.grad is not None]
    assert grads and all(torch.isfinite(g).all() for g in grads)
