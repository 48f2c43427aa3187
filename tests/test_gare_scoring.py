"""Factorised GARE scoring (spec §3.3a) against the reference-style oracle, a pair-by-pair loop and the head."""

from __future__ import annotations

import copy
import itertools
import math

import pytest
import torch
import torch.nn.functional as F
from gare_oracle import gare_reference_scores
from torch.utils._python_dispatch import TorchDispatchMode

from tvr.methods.gare import GareHead
from tvr.methods.gare.psi import GareOptions, Psi
from tvr.methods.gare.scoring import fast_path_support, gare_pair_scores, gare_pairwise_scores
from tvr.types import TextFeatures, VideoFeatures

D, FR, L = 32, 6, 5
N_T, N_V = 7, 9


def random_psi(dim: int = D, seed: int = 0, eps: tuple[float, float, float] = (1e-3, 1e-3, 1e-3)) -> Psi:
    """ψ with random weights, random biases and non-trivial LayerNorm affine parameters (every term matters).
    ``eps`` sets LN1, LN2, LN3's eps (large enough that mishandling one would show)."""
    torch.manual_seed(seed)
    psi = Psi(dim)
    with torch.no_grad():
        for module in psi.modules():
            if isinstance(module, torch.nn.LayerNorm):
                module.weight.normal_(1.0, 0.3)
                module.bias.normal_(0.0, 0.3)
            elif isinstance(module, torch.nn.Linear):
                module.weight.normal_(0.0, 1.5 / math.sqrt(dim))
                module.bias.normal_(0.0, 0.2)
    psi.ln_in.eps, psi.ln_attn.eps, psi.ln_out.eps = eps
    return psi.eval()


def random_inputs(
    n_t: int = N_T,
    n_v: int = N_V,
    dim: int = D,
    frames: int = FR,
    words: int = L,
    seed: int = 1,
    dtype: torch.dtype = torch.float32,
) -> dict:
    g = torch.Generator().manual_seed(seed)
    frame_mask = torch.ones(n_v, frames, dtype=torch.long)
    frame_mask[1, 1:] = 0  # a video with a single real frame
    frame_mask[2, frames // 2 :] = 0
    frame_mask[4, 0] = 0  # a hole, not only trailing padding
    word_mask = torch.ones(n_t, words, dtype=torch.long)
    word_mask[1, 2:] = 0
    word_mask[3, 1:] = 0
    return {
        "text": (2.0 * torch.randn(n_t, dim, generator=g)).to(dtype),
        "frames": (2.0 * torch.randn(n_v, frames, dim, generator=g) + 0.5).to(dtype),
        "words": torch.randn(n_t, words, dim, generator=g).to(dtype),
        "frame_mask": frame_mask,
        "word_mask": word_mask,
    }


def features(inp: dict, masks: bool = True) -> tuple[TextFeatures, VideoFeatures]:
    """``masks=False``: every slot counts as real (the reference never masks)."""
    fm = inp["frame_mask"] if masks else torch.ones_like(inp["frame_mask"])
    wm = inp["word_mask"] if masks else torch.ones_like(inp["word_mask"])
    return TextFeatures(inp["text"], inp["words"], wm), VideoFeatures(inp["frames"], fm)


def options(
    side: str = "text",
    context: str = "frames",
    pool: str = "text_softmax",
    eta: float = 1.0,
    gap: bool = True,
    mask_frames: bool = False,
) -> GareOptions:
    return GareOptions(
        corrected_side=side, context=context, video_pool=pool, eta=eta, gap_query=gap, mask_frames=mask_frames
    )


def fast(psi, inp, masks: bool = True, text_chunk=None, video_chunk=None, **kw):
    return gare_pairwise_scores(
        psi, *features(inp, masks), options(**kw), text_chunk=text_chunk, video_chunk=video_chunk
    )


def reference(psi, inp, masks: bool = True, text_chunk: int = 16, video_chunk: int = 16, **kw):
    return gare_reference_scores(psi, *features(inp, masks), options(**kw), text_chunk, video_chunk)


VARIANTS = list(
    itertools.product(
        ["text", "video"], ["frames", "words"], ["mean", "text_softmax"], [1.0, -1.0], [True, False], [False, True]
    )
)
KEYS = ("side", "context", "pool", "eta", "gap", "mask_frames")


@pytest.fixture(scope="module")
def psi() -> Psi:
    return random_psi()


@pytest.fixture(scope="module")
def inputs() -> dict:
    return random_inputs()


# ----------------------------------------------------------------------------- fast == reference, every variant


@pytest.mark.parametrize("masks", [False, True], ids=["nomask", "mask"])
@pytest.mark.parametrize(",".join(KEYS), VARIANTS)
def test_fast_equals_reference(psi, inputs, side, context, pool, eta, gap, mask_frames, masks) -> None:
    kw = dict(side=side, context=context, pool=pool, eta=eta, gap=gap, mask_frames=mask_frames)
    got = fast(psi, inputs, masks=masks, text_chunk=3, video_chunk=4, **kw)
    ref = reference(psi, inputs, masks=masks, **kw)
    assert got.shape == (N_T, N_V) and got.dtype == torch.float32
    assert torch.isfinite(got).all()
    assert (got - ref).abs().max().item() <= 1e-5


@pytest.mark.parametrize(
    "side,context,pool", list(itertools.product(["text", "video"], ["frames", "words"], ["mean", "text_softmax"]))
)
def test_fast_is_exact_in_float64(psi, side, context, pool) -> None:
    """In float64 the factorisation agrees to rounding: it is an identity, not an approximation."""
    inp = random_inputs(dtype=torch.float64)
    for gap, mask_frames in itertools.product([True, False], [False, True]):
        kw = dict(side=side, context=context, pool=pool, gap=gap, mask_frames=mask_frames, eta=-1.0)
        got = fast(psi, inp, **kw)
        assert got.dtype == torch.float64
        assert (got - reference(psi, inp, **kw)).abs().max().item() < 1e-12


def test_layernorm_eps_enters_exactly(inputs) -> None:
    """A large eps changes the scores; the factorised path must follow it (σ² = ‖Cx‖²/D + eps)."""
    psi_small, psi_big = random_psi(), random_psi(eps=(0.5, 0.5, 0.5))
    got = fast(psi_big, inputs)
    ref = reference(psi_big, inputs)
    other = reference(psi_small, inputs)
    assert (got - ref).abs().max().item() <= 1e-5
    assert (ref - other).abs().max().item() > 1e-3


@pytest.mark.parametrize("eps", [(1e-3, 0.3, 0.05), (0.3, 1e-3, 0.05), (0.05, 0.3, 1e-3)])
@pytest.mark.parametrize("context,pool", [("frames", "text_softmax"), ("frames", "mean"), ("words", "mean")])
def test_each_layernorm_keeps_its_own_eps(context, pool, eps) -> None:
    """Three different eps: swapping any two of them inside the factorisation changes the result (each LayerNorm's
    σ² must use its own eps), checked in float64 so a swap cannot hide in float32 noise."""
    inp = random_inputs(dtype=torch.float64, dim=16)
    inp["frames"] = 0.05 * inp["frames"]  # small activations: eps is a large part of every σ²
    psi = random_psi(dim=16, eps=eps)
    kw = dict(context=context, pool=pool, mask_frames=True)
    got = fast(psi, inp, **kw)
    assert (got - reference(psi, inp, **kw)).abs().max().item() < 1e-10
    for a, b in ((0, 1), (1, 2), (0, 2)):
        swapped = list(eps)
        swapped[a], swapped[b] = swapped[b], swapped[a]
        other = random_psi(dim=16, eps=tuple(swapped))
        assert (reference(other, inp, **kw) - got).abs().max().item() > 1e-6


def test_all_padded_video_is_finite_and_matches(psi) -> None:
    inp = random_inputs()
    inp["frame_mask"][5] = 0
    for side, mask_frames in itertools.product(["text", "video"], [False, True]):
        kw = dict(side=side, mask_frames=mask_frames)
        got = fast(psi, inp, **kw)
        assert torch.isfinite(got).all()
        assert (got - reference(psi, inp, **kw)).abs().max().item() <= 1e-5


@pytest.mark.parametrize("context", ["frames", "words"])
def test_chunking_does_not_change_scores(psi, inputs, context) -> None:
    full = fast(psi, inputs, context=context)
    for chunk, video_chunk in [(1, 1), (2, 4), (3, 2), (7, 9), (100, 100), (5, 3)]:
        part = fast(psi, inputs, context=context, text_chunk=chunk, video_chunk=video_chunk)
        torch.testing.assert_close(part, full, rtol=0, atol=1e-6)
        ref = reference(psi, inputs, context=context, text_chunk=chunk, video_chunk=video_chunk)
        assert (ref - full).abs().max().item() <= 1e-5


# ----------------------------------------------------------------------------- the direct path itself


def naive_pair_scores(
    psi: Psi,
    inp: dict,
    *,
    side: str,
    context: str,
    pool: str,
    eta: float,
    gap: bool,
    mask_frames: bool,
    masks: bool,
    temp: float = 3.0,
) -> torch.Tensor:
    """One pair at a time, straight from spec §3.1/§3.8: ψ is called on a single query with its own context."""
    t_all, x_all, w_all = inp["text"].double(), inp["frames"].double(), inp["words"].double()
    psi = copy.deepcopy(psi).double()
    n_t, n_v, frames = t_all.shape[0], x_all.shape[0], x_all.shape[1]
    fmask = inp["frame_mask"].bool() if masks else torch.ones(n_v, frames, dtype=torch.bool)
    wmask = inp["word_mask"].bool() if masks else torch.ones(n_t, w_all.shape[1], dtype=torch.bool)
    out = torch.empty(n_t, n_v, dtype=torch.float64)
    for i, j in itertools.product(range(n_t), range(n_v)):
        t, x, m = t_all[i], x_all[j], fmask[j]
        if mask_frames and masks:
            vbar = x[m].mean(0) if m.any() else torch.zeros_like(t)
        else:
            vbar = x.mean(0)
        ctx, cm = (x, m) if context == "frames" else (w_all[i], wmask[i])
        if mask_frames and masks and cm.any():
            ctx = ctx[cm]  # dropping padded keys == masking them
        query = eta * (vbar - t) if gap else t
        out_psi = psi(query.view(1, 1, -1), ctx.unsqueeze(0))[0, 0]
        delta = out_psi if gap else eta * (vbar - out_psi)
        if pool == "mean":
            vp = vbar
        else:
            weights = torch.softmax(x @ t / temp, dim=0)
            if masks:
                weights = weights * m.double()
            vp = weights @ x
        a, b = (t + delta, vp) if side == "text" else (t, vp + delta)
        out[i, j] = F.cosine_similarity(a, b, dim=0, eps=0)
    return out


@pytest.mark.parametrize(",".join(KEYS), VARIANTS[::3] + [VARIANTS[-1], VARIANTS[1]])
def test_reference_equals_naive_pair_loop(side, context, pool, eta, gap, mask_frames) -> None:
    """The oracle (the library's per-pair block run on blocks) equals spec §3.1/§3.8 written out pair by pair."""
    psi = random_psi()
    inp = random_inputs(n_t=4, n_v=5, dtype=torch.float64)
    inp["frame_mask"][3] = 0  # an all-padded video as well
    kw = dict(side=side, context=context, pool=pool, eta=eta, gap=gap, mask_frames=mask_frames)
    naive = naive_pair_scores(psi, inp, masks=True, **kw)
    ref = reference(psi, inp, text_chunk=2, video_chunk=3, **kw)
    # an all-padded video scores 0/0 with text_softmax on the text side: both paths give 0 (eps-clamped) or nan
    finite = torch.isfinite(naive)
    torch.testing.assert_close(ref[finite], naive[finite], rtol=0, atol=1e-10)


@pytest.mark.parametrize(",".join(KEYS), VARIANTS[::2] + VARIANTS[1::7])
def test_gare_head_scores_equal_reference(side, context, pool, eta, gap, mask_frames) -> None:
    """The head in eval mode (auto scorer) gives the reference scores for every variant."""
    inp = random_inputs()
    head = GareHead(D, options(side, context, pool, eta, gap, mask_frames)).eval()
    head.psi = random_psi()
    text, video = features(inp)
    got = head.score(head.encode_texts(text), head.encode_videos(video))
    ref = reference(head.psi, inp, side=side, context=context, pool=pool, eta=eta, gap=gap, mask_frames=mask_frames)
    assert (got - ref).abs().max().item() <= 1e-5


# ----------------------------------------------------------------------------- memory


class MaxNumel(TorchDispatchMode):
    """Records the largest tensor any aten op produces while active."""

    def __init__(self) -> None:
        super().__init__()
        self.max_numel = 0
        self.where = ""

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # noqa: ANN001, ANN204
        out = func(*args, **(kwargs or {}))
        for t in out if isinstance(out, (tuple, list)) else (out,):
            if isinstance(t, torch.Tensor) and t.numel() > self.max_numel:
                self.max_numel, self.where = t.numel(), str(func)
        return out


@pytest.mark.parametrize(
    "context,pool", [("frames", "text_softmax"), ("frames", "mean"), ("words", "mean"), ("words", "text_softmax")]
)
def test_fast_path_never_allocates_per_pair_vectors(context, pool) -> None:
    """No tensor of N_t·N_v·D/4 elements or more appears in the fast path (per-pair state is O(F)); the
    reference path with whole-gallery blocks does allocate such tensors, so the check can fail."""
    dim, n_t, n_v = 128, 64, 64
    psi = random_psi(dim)
    inp = random_inputs(n_t=n_t, n_v=n_v, dim=dim, frames=4, words=3)
    bound = n_t * n_v * dim // 4
    kw = dict(context=context, pool=pool, mask_frames=True)
    with MaxNumel() as fast_mode:
        fast(psi, inp, text_chunk=n_t, video_chunk=n_v, **kw)
    assert fast_mode.max_numel < bound, (fast_mode.max_numel, fast_mode.where)
    with MaxNumel() as direct_mode:
        reference(psi, inp, text_chunk=n_t, video_chunk=n_v, **kw)
    assert direct_mode.max_numel >= n_t * n_v * dim


# ----------------------------------------------------------------------------- dispatch


class OtherPsi(Psi):
    def forward(self, query, context, context_mask=None):  # noqa: ANN001, ANN201
        return super().forward(query, context, context_mask) * 2.0


def test_uncovered_psi_is_refused(inputs) -> None:
    other = OtherPsi(D).eval()
    covered, preferred, reason = fast_path_support(other, GareOptions())
    assert (covered, preferred) == (False, False) and "OtherPsi" in reason
    with pytest.raises(NotImplementedError, match="OtherPsi"):
        fast(other, inputs)


def test_word_frame_cross_terms_are_reported_when_large() -> None:
    """Word context + text_softmax needs an L×F cross term per pair; it is not preferred when L·F > D, but still
    exact when requested."""
    psi = random_psi(dim=16)
    inp = random_inputs(dim=16, frames=6, words=5)  # L·F = 30 > 16
    covered, preferred, reason = fast_path_support(psi, options(context="words"), 5, 6)
    assert covered and not preferred and "cross-Gram" in reason
    assert fast_path_support(psi, options(context="words", pool="mean"), 5, 6)[:2] == (True, True)
    got = fast(psi, inp, context="words")
    assert (got - reference(psi, inp, context="words")).abs().max().item() <= 1e-5


def test_training_mode_psi_is_scored_without_dropout(inputs) -> None:
    psi = random_psi()
    expected = reference(psi, inputs)
    psi.train()
    torch.manual_seed(3)
    torch.testing.assert_close(fast(psi, inputs), expected, rtol=0, atol=1e-5)
    assert psi.training


def test_folded_weights_follow_parameter_updates(inputs) -> None:
    psi = random_psi()
    before = fast(psi, inputs)
    with torch.no_grad():
        psi.delta_proj.weight.mul_(2.0)
    after = fast(psi, inputs)
    assert (after - before).abs().max().item() > 1e-3
    assert (after - reference(psi, inputs)).abs().max().item() <= 1e-5


def test_bad_inputs_are_named(psi, inputs) -> None:
    text, video = features(inputs)
    opts = GareOptions()
    with pytest.raises(ValueError, match="frames"):
        gare_pairwise_scores(psi, text, VideoFeatures(video.frames[..., :5], video.frame_mask), opts)
    with pytest.raises(ValueError, match="frame_mask"):
        gare_pairwise_scores(psi, text, VideoFeatures(video.frames, video.frame_mask[:, :2]), opts)
    with pytest.raises(ValueError, match="words"):
        gare_pairwise_scores(psi, TextFeatures(text.eot), video, GareOptions(context="words"))
    with pytest.raises(TypeError, match="GareOptions"):
        gare_pairwise_scores(psi, text, video, {"context": "frames"})
    with pytest.raises(ValueError, match="text_chunk"):
        gare_pairwise_scores(psi, text, video, opts, text_chunk=0)
    with pytest.raises(ValueError, match="video indices"):
        gare_pair_scores(psi, text, video, opts, torch.tensor([0]), torch.tensor([N_V]))


# ----------------------------------------------------------------------------- given pairs


@pytest.mark.parametrize(
    "pool,mask_frames,side", [("text_softmax", False, "text"), ("mean", True, "video"), ("text_softmax", True, "video")]
)
def test_pair_scores_equal_the_dense_matrix(psi, pool, mask_frames, side) -> None:
    """The ragged per-video path scores exactly the requested pairs, in any order, with repeats."""
    inp = random_inputs(n_t=11, n_v=23)
    text, video = features(inp)
    opts = options(side=side, pool=pool, mask_frames=mask_frames)
    full = gare_pairwise_scores(psi, text, video, opts)
    g = torch.Generator().manual_seed(5)
    ti, vi = torch.randint(0, 11, (200,), generator=g), torch.randint(0, 23, (200,), generator=g)
    got = gare_pair_scores(psi, text, video, opts, ti, vi, video_chunk=4)
    torch.testing.assert_close(got, full[ti, vi], rtol=0, atol=1e-5)
    with pytest.raises(ValueError, match="frame context"):
        gare_pair_scores(psi, text, video, options(context="words"), ti, vi)
