"""Every registered head under two gloo processes (unequal shares: 4 + 3 items).

Training: DistributedDataParallel over the per-rank loss gives every parameter (head, and the trainable modules
before the feature gather on both sides) the gradient one process computes on the global batch, every rank holds
the global loss, buffers a training forward updates agree, and each of the four heads (CLIP4Clip, GARE, TV-ProxyNet,
GraviAlign, every variant) computes its per-pair work for its own texts only (a 1/W share). Evaluation: the sharded
encode + score gives every rank one process's encoded split, metrics and chosen inference setting.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor, nn
from two_process import run_two_processes

from tvr.config import Config, EvalConfig, HeadConfig
from tvr.eval.runner import encode_split_cached, evaluate_encoded
from tvr.models.heads import registry
from tvr.models.heads.base import LN_100
from tvr.models.model import RetrievalModel
from tvr.train.distributed import wrap_model
from tvr.types import TextFeatures, VideoFeatures

D, FRAMES, WORDS, PROXIES = 16, 4, 5, 4
SIZES = (4, 3)
TOY = "toy_heads:BilinearHead"
#: heads whose loss takes the shard (pairwise work split by rows)
SHARDED_HEADS = {"clip4clip", "gare", "proxy", "gravialign"}

#: every registered head with its defaults, plus the option variants that change what the loss computes
VARIANTS: list[tuple[str, dict[str, Any]]] = [(name, {}) for name in registry.available_heads()] + [
    ("clip4clip", {"video_pool": "text_softmax"}),
    ("gare", {"context": "words", "corrected_side": "video", "mask_frames": True}),
    (
        "gare",
        {"gap_query": False, "psi_init": "identity", "video_pool": "mean", "kl_reduction": "mean", "kl_weight": 0.07},
    ),
    ("proxy", {"dash": "linear", "layers": 1, "heads": 2}),
    ("gravialign", {"infonce_on": "both", "sgi_to_backbone": False}),
    ("gravialign", {"sgi_objective": "contrastive"}),
    (TOY, {}),
]


class _Bridge(nn.Module):
    """Trainable before the gather, on every text and video field (as a backbone or the two-tower bridge is)."""

    def __init__(self) -> None:
        super().__init__()
        self.text_lin = nn.Linear(D, D)
        self.video_lin = nn.Linear(D, D)

    def text(self, f: TextFeatures) -> TextFeatures:
        return TextFeatures(f.eot + self.text_lin(f.eot), f.words + self.text_lin(f.words), f.word_mask)

    def video(self, f: VideoFeatures) -> VideoFeatures:
        return VideoFeatures(f.frames + self.video_lin(f.frames), f.frame_mask, f.proxies + self.video_lin(f.proxies))


class _Temporal(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(D, D)

    def forward(self, frames: Tensor, frame_mask: Tensor) -> Tensor:
        return frames + 0.5 * self.lin(frames)


def global_batch(n: int = sum(SIZES), seed: int = 0) -> dict[str, Tensor]:
    """Cached-feature batch of ``n`` aligned pairs carrying every field a head may read."""
    g = torch.Generator().manual_seed(seed)
    base = torch.randn(n, D, generator=g)
    word_mask = (torch.arange(WORDS)[None] < torch.randint(2, WORDS + 1, (n, 1), generator=g)).long()
    frame_mask = (torch.arange(FRAMES)[None] < torch.randint(1, FRAMES + 1, (n, 1), generator=g)).long()
    return {
        "text_eot": base + 0.3 * torch.randn(n, D, generator=g),
        "text_words": base[:, None] + torch.randn(n, WORDS, D, generator=g),
        "text_word_mask": word_mask,
        "frame_feats": base[:, None] + 0.5 * torch.randn(n, FRAMES, D, generator=g),
        "video_mask": frame_mask,
        "video_proxies": base[:, None] + 0.5 * torch.randn(n, PROXIES, D, generator=g),
    }


def build_model(name: str, options: dict[str, Any]) -> RetrievalModel:
    torch.manual_seed(0)
    head = registry.build_head(HeadConfig(name=name, options=dict(options), logit_scale_init=1.0), D, LN_100)
    model = RetrievalModel(None, _Temporal(), head, bridge=_Bridge())
    for module in model.modules():
        if isinstance(module, nn.Dropout):
            module.p = 0.0  # one draw per pair is not the single process's draw: compare without dropout
    return model.train()


def _rows(batch: dict[str, Tensor], rows: slice) -> dict[str, Tensor]:
    return {k: v[rows] for k, v in batch.items()}


def _assert_close(name: str, value: Tensor, ref: Tensor) -> None:
    """Equal up to float32 rounding of a different summation order: the heads compute in float32, and a gradient
    that is a small difference of larger terms (a bias behind a cancelling sum) keeps only their absolute rounding,
    seen up to 1.2e-4 of its norm. A convention error (a missing sum over ranks, a wrong slice, no averaging, a
    statistic over one rank's pairs) is off by O(1) relative, so 1e-3 separates the two."""
    err, scale = float((value - ref).norm()), float(ref.norm())
    assert err <= 1e-3 * scale + 1e-7, f"{name}: |difference| {err:.3g} vs |reference| {scale:.3g}"


def _watch_pairwise(head: nn.Module, name: str, options: dict[str, Any]) -> tuple[list[int], Callable[[], None]]:
    """Record how many texts each call of the head's per-pair work gets; returns the record and what undoes the
    watch. The per-pair work: CLIP4Clip's score of texts × videos (text-conditioned pooling), GARE's ψ, TV-ProxyNet's
    proxy generator, GraviAlign's S_align of texts × videos (the contrastive objective, and the running statistics
    of the positive one)."""
    seen: list[int] = []
    if name in ("gare", "proxy"):
        words = name == "gare" and options.get("context") == "words"

        def hook(module: nn.Module, args: tuple[Any, ...]) -> None:
            # ψ's query is [N_t, N_v, D], transposed to [N_v, N_t, D] for word context; the generator: texts first
            seen.append(int(args[0].shape[1] if words else args[0].shape[0]))

        return seen, getattr(head, "psi" if name == "gare" else "generator").register_forward_pre_hook(hook).remove
    if name == "clip4clip":
        score_block = head.score_block

        def scored(text_state: Any, video_state: Any) -> Tensor:
            seen.append(len(text_state))
            return score_block(text_state, video_state)

        head.score_block = scored
        return seen, lambda: delattr(head, "score_block")
    if name == "gravialign":
        import tvr.methods.gravialign.head as module

        originals = {f: getattr(module, f) for f in ("sgi_align_pairwise", "s_align_scores")}

        def counted(function: Callable[..., Tensor]) -> Callable[..., Tensor]:
            def call(mu_v: Tensor, logvar_v: Tensor, mu_t: Tensor, *args: Any, **kwargs: Any) -> Tensor:
                seen.append(int(mu_t.shape[0]))  # videos first, then texts
                return function(mu_v, logvar_v, mu_t, *args, **kwargs)

            return call

        for function, original in originals.items():
            setattr(module, function, counted(original))
        return seen, lambda: [setattr(module, f, original) for f, original in originals.items()]
    return seen, lambda: None


def reference_step(name: str, options: dict[str, Any]) -> RetrievalModel:
    """One process on the global batch (run before the process group exists: a model under torchrun gathers)."""
    model = build_model(name, options)
    out = model(global_batch())
    out["loss"].backward()
    model.reference_loss = out["loss"].detach()
    return model


def _check_training(rank: int, world: int, info: Any, references: list[RetrievalModel]) -> None:
    batch = global_batch()
    rows = slice(sum(SIZES[:rank]), sum(SIZES[: rank + 1]))
    for (name, options), ref in zip(VARIANTS, references, strict=True):
        where = f"{name} {options}"
        model = build_model(name, options)
        seen, unwatch = _watch_pairwise(model.head, name, options)
        ddp = wrap_model(model, info)
        out = ddp(_rows(batch, rows))
        out["loss"].backward()
        unwatch()
        _assert_close(f"{where}: loss", out["loss"].detach(), ref.reference_loss)
        for (key, p), ref_p in zip(model.named_parameters(), ref.parameters(), strict=True):
            if not p.requires_grad:
                continue
            assert p.grad is not None and ref_p.grad is not None, f"{where}: {key} has no gradient"
            _assert_close(f"{where}: grad {key}", p.grad, ref_p.grad)
        for (key, buf), ref_buf in zip(model.named_buffers(), ref.buffers(), strict=True):
            if buf.is_floating_point():
                _assert_close(f"{where}: buffer {key}", buf, ref_buf)
            else:
                assert torch.equal(buf, ref_buf), f"{where}: buffer {key}"
        if name in SHARDED_HEADS:
            # the per-pair work ran, and only for this rank's texts
            assert seen and set(seen) == {SIZES[rank]}, f"{where}: per-pair work saw {seen} texts, own {SIZES[rank]}"
        del ddp


# --------------------------------------------------------------------------------------------- evaluation


@dataclasses.dataclass
class _Cached:
    """The fields of a feature cache's split that encode_split_cached reads."""

    texts: list[str]
    video_ids: list[str]
    frames: Tensor
    frame_mask: Tensor
    proxies: Tensor
    eot: Tensor
    words: Tensor
    word_mask: Tensor


@dataclasses.dataclass
class _Split:
    name: str
    texts: list[str]
    text_video: list[int]
    videos: list[str]
    protocol: str


def eval_split() -> tuple[_Split, _Cached]:
    """9 videos, 13 captions (1 or 2 per video); the cache lacks video v4 (unreadable), so its captions drop."""
    videos = [f"v{k}" for k in range(9)]
    text_video = [k for k in range(9) for _ in range(1 + k % 2)][:13]
    texts = [f"caption {i} of {videos[v]}" for i, v in enumerate(text_video)]
    kept = [v for v in videos if v != "v4"]
    feats = global_batch(len(kept), seed=1)
    caps = global_batch(len(texts), seed=2)
    for i, v in enumerate(text_video):  # captions near their video
        if videos[v] in kept:
            caps["text_eot"][i] += feats["frame_feats"][kept.index(videos[v])].mean(0)
    cached = _Cached(
        texts,
        kept,
        feats["frame_feats"],
        feats["video_mask"],
        feats["video_proxies"],
        caps["text_eot"],
        caps["text_words"],
        caps["text_word_mask"],
    )
    return _Split("val", texts, text_video, videos, "multi_caption"), cached


def _without_timing(metrics: dict) -> dict:
    info = {k: v for k, v in metrics["info"].items() if k != "scoring_seconds"}
    return {**metrics, "info": info}


def _check_evaluation(rank: int, world: int, info: Any) -> None:
    split, cached = eval_split()
    device = torch.device("cpu")
    for name, options, eval_options in [(n, {}, {}) for n in registry.available_heads()] + [
        ("gare", {}, {"rerank_k": 3}),
    ]:
        cfg = Config(eval=EvalConfig(batch_size=3, dsl=True, **eval_options))
        models = [build_model(name, options).eval() for _ in range(2)]
        one = encode_split_cached(models[0], split, cached, cfg, device)
        sharded = encode_split_cached(models[1], split, cached, cfg, device, distributed=True)
        assert sharded.video_ids == one.video_ids and sharded.text_video == one.text_video
        assert sharded.skipped == one.skipped and [s["id"] for s in one.skipped] == ["v4"]
        for field in ("eot", "words", "word_mask"):
            torch.testing.assert_close(getattr(sharded.text, field), getattr(one.text, field))
        for field in ("frames", "frame_mask", "proxies"):
            torch.testing.assert_close(getattr(sharded.video, field), getattr(one.video, field))
        expected = evaluate_encoded(models[0], one, cfg, device, select_inference=True)
        got = evaluate_encoded(models[1], sharded, cfg, device, select_inference=True, distributed=True)
        assert _without_timing(got) == _without_timing(expected), name
        assert models[1].head.inference_setting() == models[0].head.inference_setting()


def test_every_head_trains_with_the_gradient_of_one_process_on_two_ranks() -> None:
    references = [reference_step(name, options) for name, options in VARIANTS]
    run_two_processes(_check_training, references)


def test_sharded_evaluation_gives_one_process_metrics() -> None:
    run_two_processes(_check_evaluation)
