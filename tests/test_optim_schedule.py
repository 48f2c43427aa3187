"""Optimizer groups and the learning-rate schedule (spec §1.4)."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from tvr.config import TrainConfig
from tvr.losses import symmetric_infonce
from tvr.models.heads.base import RetrievalHead
from tvr.models.model import RetrievalModel
from tvr.train.optim import build_optimizer, current_lrs, group_names
from tvr.train.schedule import build_scheduler, constant, warmup_cosine


class _Temporal(nn.Module):
    def forward(self, frames: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        return frames


class _Head(RetrievalHead):
    def __init__(self, dim: int = 4) -> None:
        super().__init__(dim)
        self.proj = nn.Linear(dim, dim)
        self.norm = nn.LayerNorm(dim)

    def encode_texts(self, text):
        return self.norm(self.proj(text.eot))

    def encode_videos(self, video):
        return video.frames.mean(1)

    def score_block(self, t, v):
        return t @ v.t()

    def loss(self, text, video, shard=None):
        loss = symmetric_infonce(self.score_block(self.encode_texts(text), self.encode_videos(video)))
        return {"loss": loss}


class _Backbone(nn.Module):
    def __init__(self, dim: int = 4) -> None:
        super().__init__()
        self.visual = nn.Linear(dim, dim)
        self.ln_post = nn.LayerNorm(dim)
        self.token_embedding = nn.Embedding(10, dim)


def _model() -> RetrievalModel:
    return RetrievalModel(_Backbone(), _Temporal(), _Head())


# --------------------------------------------------------------------------------------------- schedule


def test_warmup_cosine_matches_formula() -> None:
    assert warmup_cosine(0.0) == 0.0
    assert warmup_cosine(0.05) == pytest.approx(0.5, abs=1e-15)
    assert warmup_cosine(0.099) == pytest.approx(0.99, abs=1e-12)
    # not re-based after warm-up: at x = 0.1 the multiplier is ½(1 + cos 0.1π), not 1
    assert warmup_cosine(0.1) == pytest.approx(0.5 * (1 + math.cos(0.1 * math.pi)), abs=1e-15)
    assert warmup_cosine(0.1) == pytest.approx(0.97553, abs=1e-5)
    assert warmup_cosine(0.5) == pytest.approx(0.5, abs=1e-15)
    assert warmup_cosine(1.0) == pytest.approx(0.0, abs=1e-15)
    assert warmup_cosine(0.3, warmup=0.5) == pytest.approx(0.6, abs=1e-15)
    assert constant(0.0) == constant(0.7) == 1.0


def test_scheduler_steps_follow_progress() -> None:
    param = nn.Parameter(torch.zeros(1))
    opt = torch.optim.AdamW([{"params": [param], "lr": 1e-4}, {"params": [nn.Parameter(torch.zeros(1))], "lr": 1e-7}])
    total = 20
    sched = build_scheduler(opt, "warmup_cosine", total, 0.1)
    seen = []
    for _ in range(total):
        seen.append((opt.param_groups[0]["lr"], opt.param_groups[1]["lr"]))
        opt.step()
        sched.step()
    for k, (lr_head, lr_backbone) in enumerate(seen):
        f = warmup_cosine(k / total, 0.1)
        assert lr_head == pytest.approx(1e-4 * f, rel=1e-12, abs=1e-20)
        assert lr_backbone == pytest.approx(1e-7 * f, rel=1e-12, abs=1e-23)
    assert seen[0][0] == 0.0  # BertAdam's first step sees progress 0
    assert seen[1][0] == pytest.approx(0.5e-4)
    assert seen[2][0] == pytest.approx(1e-4 * 0.5 * (1 + math.cos(0.1 * math.pi)))


def test_scheduler_rejects_bad_arguments() -> None:
    opt = torch.optim.AdamW([nn.Parameter(torch.zeros(1))], lr=1.0)
    with pytest.raises(ValueError, match="train.schedule"):
        build_scheduler(opt, "linear", 10, 0.1)
    with pytest.raises(ValueError, match="total_steps"):
        build_scheduler(opt, "constant", 0, 0.1)
    sched = build_scheduler(opt, "constant", 10, 0.1)
    assert opt.param_groups[0]["lr"] == 1.0
    opt.step()
    sched.step()
    assert opt.param_groups[0]["lr"] == 1.0


# --------------------------------------------------------------------------------------------- optimizer


def test_parameter_groups_lr_and_decay() -> None:
    model = _model()
    cfg = TrainConfig(lr=1e-4, backbone_lr_coef=1e-3, weight_decay=0.2, betas=(0.9, 0.98), eps=1e-6)
    opt = build_optimizer(model, cfg)
    assert isinstance(opt, torch.optim.AdamW)
    names = group_names(opt)
    assert sorted(names) == ["backbone", "backbone-nodecay", "head", "head-nodecay"]
    by_name = dict(zip(names, opt.param_groups, strict=True))
    param_names = dict(zip(names, opt.tvr_param_names, strict=True))
    for name, group in by_name.items():
        assert "names" not in group and "group" not in group
        assert group["betas"] == (0.9, 0.98) and group["eps"] == 1e-6
        assert group["lr"] == pytest.approx(1e-7 if name.startswith("backbone") else 1e-4, rel=1e-12)
        assert group["weight_decay"] == (0.0 if name.endswith("nodecay") else 0.2)
    assert param_names["backbone"] == ["backbone.visual.weight"]
    assert set(param_names["backbone-nodecay"]) == {
        "backbone.visual.bias",
        "backbone.ln_post.weight",
        "backbone.ln_post.bias",
        "backbone.token_embedding.weight",
    }
    assert param_names["head"] == ["head.proj.weight"]
    no_decay = {"head.logit_scale", "head.proj.bias", "head.norm.weight", "head.norm.bias"}
    assert set(param_names["head-nodecay"]) == no_decay
    # every trainable parameter exactly once
    ids = [id(p) for g in opt.param_groups for p in g["params"]]
    assert sorted(ids) == sorted(id(p) for p in model.parameters())
    assert set(current_lrs(opt)) == set(names)


def test_frozen_parameters_left_out() -> None:
    model = _model()
    for p in model.backbone.parameters():
        p.requires_grad_(False)
    opt = build_optimizer(model, TrainConfig())
    assert sorted(group_names(opt)) == ["head", "head-nodecay"]


def test_weight_decay_is_decoupled() -> None:
    """With a zero gradient Adam's moment update is 0, so one AdamW step only applies p ← p·(1 − lr·wd), and only
    in the decay groups (BertAdam's decoupled decay has the same form)."""
    model = _model()
    cfg = TrainConfig(lr=0.1, backbone_lr_coef=0.5, weight_decay=0.2)
    opt = build_optimizer(model, cfg)
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    for p in model.parameters():
        p.grad = torch.zeros_like(p)
    opt.step()
    after = dict(model.named_parameters())
    assert torch.equal(after["head.proj.weight"], before["head.proj.weight"] * (1 - 0.1 * 0.2))
    assert torch.equal(after["backbone.visual.weight"], before["backbone.visual.weight"] * (1 - 0.05 * 0.2))
    for name in ("head.proj.bias", "head.norm.weight", "backbone.ln_post.bias", "head.logit_scale"):
        assert torch.equal(after[name], before[name])


# --------------------------------------------------------------------------------------------- head rules


class _RuledHead(_Head):
    """proj on its own peak lr; its bias (a no-decay parameter) on a fixed lr; the backbone's norms decayed."""

    def param_rules(self, lr, backbone_lr):
        from tvr.models.heads.base import ParamRule

        return [
            ParamRule("head.proj.", "proj", lr=3 * lr, applies_to="decay"),
            ParamRule("head.proj.", "proj-fixed", lr=5 * lr, schedule="constant", applies_to="nodecay"),
            ParamRule("backbone.ln_post.", "backbone-ln", decay=True),
        ]


def test_head_param_rules_make_groups_with_their_own_lr_decay_and_schedule() -> None:
    model = RetrievalModel(_Backbone(), _Temporal(), _RuledHead())
    cfg = TrainConfig(lr=1e-3, backbone_lr_coef=0.1, weight_decay=0.2, warmup=0.5)
    opt = build_optimizer(model, cfg)
    groups = {
        name: (g, names) for name, g, names in zip(group_names(opt), opt.param_groups, opt.tvr_param_names, strict=True)
    }
    assert groups["proj"][1] == ["head.proj.weight"] and groups["proj"][0]["lr"] == pytest.approx(3e-3)
    assert groups["proj"][0]["weight_decay"] == 0.2
    assert groups["proj-fixed-nodecay"][1] == ["head.proj.bias"]
    assert groups["proj-fixed-nodecay"][0]["lr"] == pytest.approx(5e-3)
    # decay forced on the backbone's LayerNorm; its lr is still the backbone default (lr × coef)
    assert groups["backbone-ln"][1] == ["backbone.ln_post.weight", "backbone.ln_post.bias"]
    assert groups["backbone-ln"][0]["weight_decay"] == 0.2 and groups["backbone-ln"][0]["lr"] == pytest.approx(1e-4)
    # the default groups keep their order ahead of the ruled ones (so older optimizer states still load)
    assert group_names(opt) == [
        "head-nodecay",
        "backbone",
        "backbone-nodecay",
        "proj",
        "proj-fixed-nodecay",
        "backbone-ln",
    ]
    assert "head.norm.weight" in groups["head-nodecay"][1] and "head.logit_scale" in groups["head-nodecay"][1]
    sched = build_scheduler(opt, "warmup_cosine", 10, 0.5)
    lrs = []
    for _ in range(10):
        lrs.append(current_lrs(opt))
        opt.step()
        sched.step()
    assert [r["proj-fixed-nodecay"] for r in lrs] == [pytest.approx(5e-3)] * 10  # constant: no warm-up, no decay
    assert [r["proj"] for r in lrs] == [pytest.approx(3e-3 * warmup_cosine(k / 10, 0.5)) for k in range(10)]
