"""tvr's GARE against the authors' current release (tests/gare_release_oracle.py): the loss, each of its terms, the
gradients it sends into ψ and into both modalities' features, and the scores, on the same weights and inputs."""

from __future__ import annotations

import pytest
import torch
from gare_release_oracle import ReleaseConfig, ReleaseWeights, release_kl, release_loss, release_similarity

from tvr.config import load_config
from tvr.methods.gare import GareHead, GareOptions
from tvr.methods.gare.losses import gare_kl
from tvr.pipeline import resolve_config
from tvr.types import TextFeatures, VideoFeatures

D, B, F_ = 24, 7, 5
CURRENT = "gare/ablations/release_2026_05_31"


def release_options() -> GareOptions:
    cfg = load_config(CURRENT)
    cfg = resolve_config(cfg)
    return GareOptions(**{**cfg.head.options.__dict__, "psi_dropout": 0.0})


def weights_of(head: GareHead) -> ReleaseWeights:
    psi = head.psi

    def pair(module):
        return module.weight, module.bias

    return ReleaseWeights(
        layer_norm1=pair(psi.ln_in), q_proj=pair(psi.q_proj), k_proj=pair(psi.k_proj), v_proj=pair(psi.v_proj),
        out_proj=pair(psi.out_proj), layer_norm2=pair(psi.ln_attn), linear1=pair(psi.linear),
        layer_norm3=pair(psi.ln_out), mean_proj=pair(psi.delta_proj),
    )  # fmt: skip


def inputs(seed: int, scale_video: float = 1.0):
    """Texts and videos of unequal scales (as two towers give them), two videos with padded frame slots (holding
    features, as the temporal module's output does there)."""
    g = torch.Generator().manual_seed(seed)
    cls = torch.randn(B, D, generator=g)
    frames = scale_video * torch.randn(B, F_, D, generator=g)
    mask = torch.ones(B, F_, dtype=torch.long)
    mask[1, 3:] = 0
    mask[4, 1:] = 0
    return cls.requires_grad_(), frames.requires_grad_(), mask


def head_with_random_psi(seed: int) -> GareHead:
    head = GareHead(D, release_options())
    with torch.no_grad():
        g = torch.Generator().manual_seed(seed + 100)
        for ln in (head.psi.ln_in, head.psi.ln_attn, head.psi.ln_out):  # LayerNorms away from their init
            ln.weight.copy_(0.5 + torch.rand(D, generator=g))
            ln.bias.copy_(0.1 * torch.randn(D, generator=g))
        head.logit_scale.fill_(3.1)
    return head


def test_the_current_release_preset_is_the_shipped_msrvtt_head() -> None:
    current, shipped = load_config(CURRENT), load_config("gare/msrvtt")
    current, shipped = resolve_config(current), resolve_config(shipped)
    assert current.head == shipped.head
    options = current.head.options
    assert (options.kl_reduction, options.kl_weight, options.mask_frames) == ("sum", 1e-4, False)


@pytest.mark.parametrize("seed,scale_video", [(0, 1.0), (1, 4.0), (2, 0.3)])
def test_loss_terms_and_gradients_equal_the_current_release(seed: int, scale_video: float) -> None:
    head = head_with_random_psi(seed).train()
    cls, frames, mask = inputs(seed, scale_video)
    ours = head.loss(TextFeatures(cls), VideoFeatures(frames, mask))
    cfg = ReleaseConfig()
    o = head.options
    assert (cfg.temp, cfg.alpha, cfg.beta) == (o.pool_temperature, o.direction_alpha, o.kl_weight)
    assert (cfg.lambda_dir, cfg.lambda_epsilon, cfg.lambda_lower) == (
        o.direction_weight, o.radius_weight, o.radius_lambda,
    )  # fmt: skip
    cls2, frames2 = cls.detach().clone().requires_grad_(), frames.detach().clone().requires_grad_()
    theirs = release_loss(weights_of(head), cls2, frames2, mask, head.logit_scale, cfg)
    for key in ("infonce", "kl", "direction", "radius"):
        torch.testing.assert_close(ours[key], theirs[key].detach(), rtol=2e-5, atol=2e-6, msg=key)
    torch.testing.assert_close(ours["loss"], theirs["loss"], rtol=2e-5, atol=2e-6)

    params = list(head.parameters())
    ours_grads = torch.autograd.grad(ours["loss"], [cls, frames, *params])
    theirs_grads = torch.autograd.grad(theirs["loss"], [cls2, frames2, *params])
    # the text's gradient includes the gap query's part (the release does not detach the anchor there)
    names = ["text", "frames", *(n for n, _ in head.named_parameters())]
    for name, a, b in zip(names, ours_grads, theirs_grads, strict=True):
        # float32: a gradient summed over the batch's pairs in another order differs in its last digits
        assert (a - b).abs().max() <= 1e-4 * b.abs().max() + 1e-7, name


def test_scores_equal_the_current_release() -> None:
    head = head_with_random_psi(3).eval()
    cls, frames, mask = inputs(3, 5.0)
    with torch.no_grad():
        text, video = TextFeatures(cls.detach()), VideoFeatures(frames.detach(), mask)
        ours = head.score(head.encode_texts(text), head.encode_videos(video))
        theirs, _ = release_similarity(weights_of(head), cls.detach(), frames.detach(), mask, 3.0)
    torch.testing.assert_close(ours, theirs, rtol=0, atol=2e-6)


def test_the_two_releases_kl_forms_are_the_two_reductions() -> None:
    delta = torch.randn(6, 4, D, generator=torch.Generator().manual_seed(5), dtype=torch.float64)
    torch.testing.assert_close(gare_kl(delta, "sum"), release_kl(delta, multivariate=True), rtol=1e-12, atol=0)
    torch.testing.assert_close(gare_kl(delta, "mean"), release_kl(delta, multivariate=False), rtol=1e-12, atol=0)
