"""RetrievalModel = optional backbone + optional bridge + temporal module + method head.

Batches are dicts. A *raw* batch carries tokens and pixels; a *cached* batch (``tvr features``) carries
backbone outputs, so the backbone is skipped and only the bridge (if any), the temporal module and the head train.
The bridge (two-tower backbone: learned projections or ConSE, :mod:`tvr.models.backbones.two_tower.bridge`) maps
backbone features into
the space the head compares in; it runs on raw and cached batches alike.

Raw keys:    text_ids [B, L] long, text_mask [B, L], video [B, F, 3, S, S] float, video_mask [B, F]
Cached keys: text_eot [B, D], text_words [B, L, D], text_word_mask [B, L], frame_feats [B, F, D], video_mask [B, F]
             (+ video_proxies [B, M, D] for backbones with video proxies)
Both may carry ``video_ids`` / ``captions`` (lists) and ``skipped`` (ids of unreadable videos left out).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor, nn

from tvr.models.heads.base import RetrievalHead
from tvr.types import TextFeatures, VideoFeatures
from tvr.utils.distributed import gather_batch

NO_DECAY_MARKERS = ("bias", "norm", "ln_", "layer_norm", "layernorm", "embedding", "logit_scale")


def _is_no_decay(name: str, param: nn.Parameter) -> bool:
    lowered = name.lower()
    return param.ndim < 2 or any(marker in lowered for marker in NO_DECAY_MARKERS)


class RetrievalModel(nn.Module):
    def __init__(
        self, backbone: nn.Module | None, temporal: nn.Module, head: RetrievalHead, bridge: nn.Module | None = None
    ) -> None:
        super().__init__()
        self.backbone = backbone
        self.bridge = bridge
        self.temporal = temporal
        self.head = head

    # ------------------------------------------------------------------ features
    def text_features(self, batch: dict[str, Any]) -> TextFeatures:
        """Text features in the head's space (backbone, then the bridge if any)."""
        if "text_eot" in batch:
            feats = TextFeatures(batch["text_eot"], batch.get("text_words"), batch.get("text_word_mask"))
        elif self.backbone is None:
            raise ValueError("batch has raw tokens but the model was built without a backbone (cached mode)")
        else:
            feats = self.backbone.encode_text(batch["text_ids"], batch["text_mask"])
        return feats if self.bridge is None else self.bridge.text(feats)

    def frame_features(self, batch: dict[str, Any]) -> VideoFeatures:
        """Frame features in the head's space (backbone, then the bridge if any), before the temporal module."""
        if "frame_feats" in batch:
            feats = VideoFeatures(batch["frame_feats"], batch["video_mask"], batch.get("video_proxies"))
        elif self.backbone is None:
            raise ValueError("batch has raw pixels but the model was built without a backbone (cached mode)")
        else:
            feats = self.backbone.encode_video(batch["video"], batch["video_mask"])
        return feats if self.bridge is None else self.bridge.video(feats)

    def video_features(self, batch: dict[str, Any]) -> VideoFeatures:
        frames = self.frame_features(batch)
        proxies = frames.proxies.float() if frames.proxies is not None else None
        return VideoFeatures(self.temporal(frames.frames.float(), frames.frame_mask), frames.frame_mask, proxies)

    # ------------------------------------------------------------------ training
    def forward(self, batch: dict[str, Any]) -> dict[str, Tensor]:
        """The training loss dict (``{"loss": ..., components...}``) of ``batch``.

        This is ``forward`` so that DistributedDataParallel's hooks see the training step. Under torchrun the
        per-rank features are all-gathered first and the head gets the global batch with this rank's
        :class:`~tvr.utils.distributed.RowShard` (a head that splits its pairwise work computes it for its own
        rows only); every rank ends with the same global loss (see :mod:`tvr.train.distributed` for
        the gradient convention).
        """
        text = self.text_features(batch)
        video = self.video_features(batch)
        text = text.to(text.eot.device, torch.float32)
        text, video, shard = gather_batch(text, video)
        return self.head.loss(text, video, shard=shard)

    def loss(self, batch: dict[str, Any]) -> dict[str, Tensor]:
        """Alias of :meth:`forward` (``model(batch)``); prefer calling the module so DDP wrappers stay in the loop."""
        return self(batch)

    def after_optimizer_step(self) -> None:
        self.head.clamp_logit_scale()

    def parameter_groups(self, lr: float, backbone_lr_coef: float, weight_decay: float) -> list[dict]:
        """AdamW groups: backbone at lr × coef, everything else at lr; no decay on biases/norms/embeddings. The
        head's :meth:`~tvr.models.heads.base.RetrievalHead.param_rules` move parameters into groups of their own
        (own lr, fixed schedule, decay override); a group may carry ``"schedule"`` for the scheduler."""
        rules = list(self.head.param_rules(lr, lr * backbone_lr_coef))
        default: dict[tuple[bool, bool], list[tuple[str, nn.Parameter]]] = {}
        ruled: dict[tuple[int, bool], list[tuple[str, nn.Parameter]]] = {}
        for name, param in self.named_parameters():
            if not param.requires_grad:
                continue
            no_decay = _is_no_decay(name, param)
            index = next(
                (
                    k
                    for k, r in enumerate(rules)
                    if name.startswith(r.prefix)
                    and (r.contains is None or r.contains in name)
                    and (r.applies_to == "all" or (r.applies_to == "nodecay") == no_decay)
                ),
                None,
            )
            if index is None:
                default.setdefault((name.startswith("backbone."), no_decay), []).append((name, param))
            else:
                forced = rules[index].decay
                ruled.setdefault((index, no_decay if forced is None else not forced), []).append((name, param))
        out = []
        for (is_backbone, no_decay), items in sorted(default.items()):
            out.append(
                _group(
                    items,
                    lr * (backbone_lr_coef if is_backbone else 1.0),
                    0.0 if no_decay else weight_decay,
                    f"{'backbone' if is_backbone else 'head'}{'-nodecay' if no_decay else ''}",
                    None,
                )
            )
        for (index, no_decay), items in sorted(ruled.items()):
            rule = rules[index]
            base = lr * (backbone_lr_coef if items[0][0].startswith("backbone.") else 1.0)
            out.append(
                _group(
                    items,
                    rule.lr if rule.lr is not None else base,
                    0.0 if no_decay else weight_decay,
                    f"{rule.group}{'-nodecay' if no_decay else ''}",
                    rule.schedule,
                )
            )
        return out


def _group(
    items: list[tuple[str, nn.Parameter]], lr: float, weight_decay: float, name: str, schedule: str | None
) -> dict:
    group = {
        "params": [p for _, p in items],
        "names": [n for n, _ in items],
        "lr": lr,
        "weight_decay": weight_decay,
        "group": name,
    }
    if schedule is not None:
        group["schedule"] = schedule
    return group
