"""CLIP4Clip head (mean and text-softmax pooling) and the head registry."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

import tvr.methods.clip4clip.head as c4c_mod
from tvr.methods.clip4clip import Clip4ClipHead, Clip4ClipOptions, Clip4ClipTextState, Clip4ClipVideoState
from tvr.models.heads.base import LN_100, RetrievalHead
from tvr.types import TextFeatures, VideoFeatures

D, F_SLOTS = 16, 5


def make_features(n_t: int, n_v: int, seed: int = 0) -> tuple[TextFeatures, VideoFeatures]:
    g = torch.Generator().manual_seed(seed)
    text = TextFeatures(eot=torch.randn(n_t, D, generator=g, dtype=torch.float64).float())
    frames = torch.randn(n_v, F_SLOTS, D, generator=g)
    lengths = torch.randint(1, F_SLOTS + 1, (n_v,), generator=g)
    mask = (torch.arange(F_SLOTS)[None, :] < lengths[:, None]).long()
    return text, VideoFeatures(frames=frames, frame_mask=mask)


def mean_formula(text: TextFeatures, video: VideoFeatures) -> torch.Tensor:
    t = text.eot.double()
    t = t / t.norm(dim=-1, keepdim=True)
    v_out = []
    for frames, mask in zip(video.frames.double(), video.frame_mask, strict=True):
        real = frames[mask.bool()]
        real = real / real.norm(dim=-1, keepdim=True)
        v = real.mean(dim=0)
        v_out.append(v / v.norm())
    return t @ torch.stack(v_out).t()


def text_softmax_formula(text: TextFeatures, video: VideoFeatures, temp: float) -> torch.Tensor:
    """Direct per-pair computation: softmax over all slots, mask after, no renormalisation, cosine."""
    t = text.eot.double()
    out = torch.zeros(len(t), len(video.frames), dtype=torch.float64)
    for i in range(len(t)):
        for j, (frames, mask) in enumerate(zip(video.frames.double(), video.frame_mask, strict=True)):
            w = torch.softmax(frames @ t[i] / temp, dim=0) * mask.double()
            pooled = (w[:, None] * frames).sum(dim=0)
            out[i, j] = torch.dot(t[i], pooled) / (t[i].norm() * pooled.norm())
    return out


def symmetric_ce_by_hand(logits: torch.Tensor) -> torch.Tensor:
    n = logits.shape[0]
    rows = -torch.stack([logits[i, i] - torch.logsumexp(logits[i], dim=0) for i in range(n)]).mean()
    cols = -torch.stack([logits[i, i] - torch.logsumexp(logits[:, i], dim=0) for i in range(n)]).mean()
    return 0.5 * (rows + cols)


# ------------------------------------------------------------------------------------------ mean pooling


def test_mean_score_equals_formula_and_is_indexable() -> None:
    head = Clip4ClipHead(D)
    assert head.indexable is True and RetrievalHead.indexable is False
    text, video = make_features(7, 6)
    ts, vs = head.encode_texts(text), head.encode_videos(video)
    assert isinstance(ts, Clip4ClipTextState) and isinstance(vs, Clip4ClipVideoState)
    assert ts.emb.shape == (7, D) and vs.emb.shape == (6, D) and vs.frames is None
    got = head.score(ts, vs)
    assert torch.allclose(got.double(), mean_formula(text, video), atol=1e-6)
    # indexable contract: the score is the dot product of the emb fields
    assert torch.allclose(got, ts.emb @ vs.emb.t())


def test_masked_frames_do_not_matter_in_mean_mode() -> None:
    head = Clip4ClipHead(D)
    text, video = make_features(4, 6, seed=1)
    base = head.score(head.encode_texts(text), head.encode_videos(video))
    noisy = video.frames.clone()
    noisy[video.frame_mask == 0] = torch.randn(int((video.frame_mask == 0).sum()), D) * 100
    assert (video.frame_mask == 0).any()
    changed = head.score(head.encode_texts(text), head.encode_videos(VideoFeatures(noisy, video.frame_mask)))
    assert torch.equal(base, changed)


def test_video_without_frames_scores_zero_not_nan() -> None:
    head = Clip4ClipHead(D)
    text, video = make_features(3, 2)
    video.frame_mask[1] = 0
    s = head.score(head.encode_texts(text), head.encode_videos(video))
    assert torch.isfinite(s).all() and torch.equal(s[:, 1], torch.zeros(3))


# ------------------------------------------------------------------------------------------ text-softmax pooling


def test_text_softmax_score_equals_formula(monkeypatch: pytest.MonkeyPatch) -> None:
    head = Clip4ClipHead(D, Clip4ClipOptions(video_pool="text_softmax", pool_temperature=3.0))
    assert head.indexable is False
    text, video = make_features(6, 5, seed=2)
    text = TextFeatures(eot=text.eot * 0.5)  # keep the softmax away from one-hot so every weight matters
    want = text_softmax_formula(text, video, 3.0)
    ts, vs = head.encode_texts(text), head.encode_videos(video)
    assert torch.allclose(head.score(ts, vs).double(), want, atol=1e-5)
    # the inner video split of score_block (bounded scratch memory) gives the same matrix
    monkeypatch.setattr(c4c_mod, "POOL_CHUNK_ELEMENTS", 7)
    assert torch.allclose(head.score(ts, vs).double(), want, atol=1e-5)


def test_text_softmax_padded_slots_only_rescale_the_pooled_vector() -> None:
    # reference behaviour: padded slots take softmax mass but contribute no vector (no renormalisation); the
    # cosine is scale-invariant, so the score equals softmax pooling over the real frames only
    head = Clip4ClipHead(D, Clip4ClipOptions(video_pool="text_softmax", pool_temperature=1.0))
    t = torch.tensor([[1.0, 0.0]])
    frames = torch.tensor([[[1.0, 0.0], [0.0, 1.0], [5.0, 5.0]]])
    mask = torch.tensor([[1, 1, 0]])
    s = head.score(head.encode_texts(TextFeatures(t)), head.encode_videos(VideoFeatures(frames, mask)))
    w = torch.softmax(torch.tensor([1.0, 0.0, 5.0]), dim=0)
    pooled = w[0] * frames[0, 0] + w[1] * frames[0, 1]  # ‖pooled‖ ≈ 0.025: most mass went to the padded slot
    assert s.item() == pytest.approx((pooled[0] / pooled.norm()).item(), abs=1e-6)
    renorm = torch.softmax(torch.tensor([1.0, 0.0]), dim=0)
    assert s.item() == pytest.approx((renorm[0] / renorm.norm()).item(), abs=1e-6)


def test_masked_frames_do_not_matter_in_text_softmax_mode() -> None:
    head = Clip4ClipHead(D, Clip4ClipOptions(video_pool="text_softmax"))
    text, video = make_features(4, 6, seed=1)
    base = head.score(head.encode_texts(text), head.encode_videos(video))
    noisy = video.frames.clone()
    pad = video.frame_mask == 0
    noisy[pad] = torch.randn(int(pad.sum()), D) * 3
    changed = head.score(head.encode_texts(text), head.encode_videos(VideoFeatures(noisy, video.frame_mask)))
    assert torch.allclose(base, changed, atol=1e-5)


@pytest.mark.parametrize("pool", ["mean", "text_softmax"])
def test_chunked_score_equals_unchunked(pool: str) -> None:
    head = Clip4ClipHead(D, Clip4ClipOptions(video_pool=pool))
    text, video = make_features(11, 9, seed=3)
    ts, vs = head.encode_texts(text), head.encode_videos(video)
    full = head.score(ts, vs)
    assert full.shape == (11, 9)
    assert torch.allclose(head.score(ts, vs, text_chunk=3, video_chunk=2), full, atol=1e-6)
    # slicing a state (Sliceable) gives the matching rows
    assert torch.allclose(head.score(ts[2:5], vs), full[2:5], atol=1e-6)


# ------------------------------------------------------------------------------------------ loss


@pytest.mark.parametrize("pool", ["mean", "text_softmax"])
def test_loss_equals_hand_computed_infonce(pool: str) -> None:
    head = Clip4ClipHead(D, Clip4ClipOptions(video_pool=pool), logit_scale_init=math.log(20.0))
    text, video = make_features(6, 6, seed=4)
    out = head.loss(text, video)
    assert set(out) == {"loss", "infonce", "logit_scale"}
    sims = mean_formula(text, video) if pool == "mean" else text_softmax_formula(text, video, 3.0)
    want = symmetric_ce_by_hand(20.0 * sims)
    assert out["loss"].item() == pytest.approx(want.item(), rel=1e-5)
    assert out["logit_scale"].item() == pytest.approx(20.0, rel=1e-6)
    assert not out["infonce"].requires_grad and not out["logit_scale"].requires_grad
    out["loss"].backward()
    assert head.logit_scale.grad is not None and head.logit_scale.grad.abs() > 0


def test_loss_gradient_reaches_features() -> None:
    head = Clip4ClipHead(D, Clip4ClipOptions(video_pool="text_softmax"))
    text, video = make_features(4, 4, seed=5)
    eot = text.eot.clone().requires_grad_(True)
    frames = video.frames.clone().requires_grad_(True)
    head.loss(TextFeatures(eot), VideoFeatures(frames, video.frame_mask))["loss"].backward()
    assert eot.grad.abs().sum() > 0 and frames.grad.abs().sum() > 0
    assert torch.isfinite(frames.grad).all()


def test_logit_scale_clamp() -> None:
    head = Clip4ClipHead(D, logit_scale_init=1.0, logit_scale_max=LN_100)
    with torch.no_grad():
        head.logit_scale.fill_(6.0)
    head.clamp_logit_scale()
    assert head.logit_scale.item() == pytest.approx(LN_100)
    with torch.no_grad():
        head.logit_scale.fill_(2.0)
    head.clamp_logit_scale()
    assert head.logit_scale.item() == pytest.approx(2.0)


def test_bad_options() -> None:
    with pytest.raises(ValueError, match="video_pool"):
        Clip4ClipHead(D, Clip4ClipOptions(video_pool="max"))
    with pytest.raises(ValueError, match="pool_temperature"):
        Clip4ClipHead(D, Clip4ClipOptions(video_pool="text_softmax", pool_temperature=0.0))


def test_states_follow_dtype_and_device_helpers() -> None:
    head = Clip4ClipHead(D, Clip4ClipOptions(video_pool="text_softmax"))
    text, video = make_features(3, 4)
    vs = head.encode_videos(video).to("cpu", torch.float64)
    assert vs.frames.dtype == torch.float64 and vs.gram.dtype == torch.float64 and len(vs) == 4
    both = Clip4ClipVideoState.cat([vs[:2], vs[2:]])
    assert torch.equal(both.gram, vs.gram)
    assert torch.allclose(F.normalize(vs.emb, dim=-1), vs.emb)
