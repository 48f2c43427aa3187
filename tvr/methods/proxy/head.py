"""TV-ProxyNet head (spec §4): a text proxy t^p_ij for every (text, video) pair, on the CLIP-ViP backbone.

The generator (:mod:`tvr.methods.proxy.generator`: direction leader → director → dash) turns a unit-norm
text t_i and the M projected proxy tokens X̃_j of video j (``VideoFeatures.proxies``) into the proxy
t^p_ij = t_i + dash·d̂_ij.

Score: s_ij = cos(t_i, v_j) + γ·cos(t^p_ij, v_j) (v_j = the CLIP-ViP video feature). The pair (i, j) is always
scored with its own proxy t^p_ij, never with the positive proxy t^p_ii. γ is an inference setting chosen on the
validation split; γ = 0 is the CLIP-ViP baseline and is always reported beside it.

The exact test-time scorers are :mod:`tvr.methods.proxy.scoring`; this module holds the options, the states
and the head (loss, γ, optimizer groups, the per-pair oracle).
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

from tvr.config import bounded, choice
from tvr.losses import symmetric_infonce
from tvr.methods.proxy.generator import DASHES, ProxyDecoderLayer, ProxyGenerator
from tvr.methods.proxy.losses import text_proxy_loss
from tvr.methods.proxy.scoring import (
    SCORERS,
    ProxyRerankState,
    proxy_pair_scores,
    proxy_pairwise_scores,
    proxy_rerank_scores,
    proxy_rerank_state,
    proxy_scores,
    use_fast,
    weights_dtype,
)
from tvr.models.heads.base import ParamRule, RetrievalHead
from tvr.models.heads.common import check_frames, check_pairs, mean_pooled_video
from tvr.models.heads.registry import register_head
from tvr.types import Sliceable, TextFeatures, VideoFeatures
from tvr.utils.distributed import RowShard

__all__ = [
    "DASHES",
    "SCORERS",
    "ProxyDecoderLayer",
    "ProxyGenerator",
    "ProxyHead",
    "ProxyOptions",
    "proxy_pair_scores",
    "proxy_pairwise_scores",
    "proxy_scores",
]

#: intended = the proxy module on its own peak lr (``proxy_lr``) and the run's schedule; reference = the released
#: code's optimizer groups exactly, its scheduler bug included (spec §4.4), for parity runs
LR_GROUPS = ("intended", "reference")
#: paper = ½ per direction pair (spec §4.3 ★); release = the released code's sum over both directions (2×)
LOSS_SCALES = ("paper", "release")
#: the released code's no-decay test: a parameter whose name contains this is not decayed (spec §4.4)
RELEASE_NO_DECAY = "bias"
_EPS = 1e-12


@dataclasses.dataclass
class ProxyOptions:
    """``head.options`` of ``head.name: proxy`` (spec §4). Defaults = the released MSR-VTT B/32 configuration."""

    #: direction-leader rounds k = decoder layers (released code: 2; the paper's Table 4 peaks at 3)
    layers: int = bounded(2, ge=1)
    #: attention heads of each decoder layer (released code: 1); must divide the feature dimension
    heads: int = bounded(1, ge=1)
    #: hidden width of each decoder layer's FFN (released code: 512)
    ffn_dim: int = bounded(512, ge=1)
    #: theta (scalar exp(θ·mean_m S_ijm), MSR-VTT) | linear (exp(W S_ij + b) ∈ R^D, DiDeMo / ActivityNet)
    dash: str = choice("theta", *DASHES)
    #: M video proxies read by the leader and the dash; must equal model.clipvip.num_proxies (spec §4.2 ★: all 4
    #: for both, fixing the released DiDeMo/ActivityNet configs' shape error); with model.backbone: two_tower, the
    #: number of temporal-segment proxies the backbone's bridge derives (docs/methods/two_tower.md)
    num_proxies: int = bounded(4, ge=1)
    #: director d = δ·t − η·l (B/32: δ = η = 1; B/16: δ = η = −1)
    delta: float = 1.0
    eta: float = 1.0
    #: dropout of the decoder layers (attention weights, attention output, FFN hidden and output)
    dropout: float = bounded(0.1, ge=0.0, lt=1.0)
    #: weight α of the proxy loss L_p and β of the positive-proxy loss L_pos (MSR-VTT 0.5 / 0.25)
    alpha: float = bounded(0.5, ge=0.0)
    beta: float = bounded(0.25, ge=0.0)
    #: γ used until validation selects one (and always, with select_gamma: false); spec §4.5 ★: 0.5
    gamma: float = bounded(0.5, ge=0.0)
    #: choose γ on the validation split among 0, gamma_step, …, gamma_max (stored with the checkpoint)
    select_gamma: bool = True
    gamma_max: float = bounded(1.5, ge=0.0)
    gamma_step: float = bounded(0.1, gt=0.0)
    #: peak lr of the proxy generator (TP's tp_learning_rate: 2e-6 MSR-VTT, 4e-6 DiDeMo/ActivityNet);
    #: 0 = proxy_lr_coef × train.lr
    proxy_lr: float = bounded(0.0, ge=0.0)
    #: proxy lr relative to train.lr when proxy_lr is 0 (2: the ratio of every released config)
    proxy_lr_coef: float = bounded(2.0, gt=0.0)
    #: intended (proxy module on proxy_lr with the run's schedule) | reference (the released code's groups exactly:
    #: no decay only on names containing "bias" and the logit scale, proxy weights at the backbone's peak lr and
    #: schedule, every no-decay group at a constant lr; spec §4.4, for parity runs)
    lr_groups: str = choice("intended", *LR_GROUPS)
    #: paper (½ per direction pair, spec §4.3 ★) | release (the released code sums both directions: 2× the loss and
    #: its gradients; for parity runs comparing loss values or relying on the scale under a non-Adam optimizer)
    loss_scale: str = choice("paper", *LOSS_SCALES)
    #: auto | fast | block: the test-time pairwise scorer (auto = factorised wherever it is exact)
    scorer: str = choice("auto", *SCORERS)

    def validate(self) -> None:
        if self.delta == 0.0 and self.eta == 0.0:
            raise ValueError("delta = 0 and eta = 0: the director δ·t − η·l would be zero; set either to non-zero")
        if not (math.isfinite(self.delta) and math.isfinite(self.eta)):
            raise ValueError(f"delta = {self.delta!r}, eta = {self.eta!r}: expected finite numbers")
        if self.gamma_max / self.gamma_step > 1000:
            raise ValueError(
                f"gamma_step = {self.gamma_step!r}: more than 1000 γ candidates up to gamma_max "
                f"{self.gamma_max!r}; use a coarser step"
            )

    def gamma_grid(self) -> list[float]:
        """0, step, 2·step, … up to gamma_max (inclusive, up to rounding)."""
        count = int(math.floor(self.gamma_max / self.gamma_step + 1e-9))
        return [round(k * self.gamma_step, 10) for k in range(count + 1)]


# --------------------------------------------------------------------------------------------- the head


@dataclasses.dataclass
class ProxyTextState(Sliceable):
    """emb: [N, D] unit-norm EOT features t_i."""

    emb: Tensor


@dataclasses.dataclass
class ProxyVideoState(Sliceable):
    """emb: [N, D] unit-norm video features v_j (CLIP-ViP: the projected first proxy); proxies: [N, M, D]."""

    emb: Tensor
    proxies: Tensor


@register_head("proxy")
class ProxyHead(RetrievalHead):
    """TV-ProxyNet (spec §4). Not indexable: the proxy term depends on the pair. Two-stage scoring shortlists by
    cos(t_i, v_j) (the γ = 0 score, from the states' ``emb``) and reranks exactly."""

    Options = ProxyOptions
    analysis_figures = ".figures"
    indexable = False
    requires = frozenset({"proxies"})
    default_text_chunk = 1 << 30  # the factorised scorer tiles internally

    def build(self) -> None:
        opts, dim = self.options, self.dim
        if dim % opts.heads:
            raise ValueError(f"head.options.heads = {opts.heads}: must divide the feature dimension {dim}")
        self.generator = ProxyGenerator(
            dim,
            layers=opts.layers,
            heads=opts.heads,
            ffn_dim=opts.ffn_dim,
            dash=opts.dash,
            num_proxies=opts.num_proxies,
            delta=opts.delta,
            eta=opts.eta,
            dropout=opts.dropout,
        )
        # γ travels with the checkpoint; float64 so the stored value is exactly the chosen candidate
        self.register_buffer("gamma", torch.tensor(float(opts.gamma), dtype=torch.float64))

    def extra_repr(self) -> str:
        o = self.options
        return (
            f"dash={o.dash!r}, layers={o.layers}, M={o.num_proxies}, delta={o.delta}, eta={o.eta}, "
            f"gamma={self.gamma_value}"
        )

    @property
    def gamma_value(self) -> float:
        return float(self.gamma)

    # ------------------------------------------------------------------ states
    def encode_texts(self, text: TextFeatures) -> ProxyTextState:
        return ProxyTextState(F.normalize(text.eot.float(), dim=-1, eps=_EPS))

    def encode_videos(self, video: VideoFeatures) -> ProxyVideoState:
        if video.proxies is None:
            raise ValueError(
                "TV-ProxyNet reads per-video proxies (VideoFeatures.proxies), got None: set model.backbone=clipvip "
                "and model.clipvip.proxy_projection=true, or model.backbone=two_tower (derived proxies)"
            )
        frames, mask = video.frames.float(), video.frame_mask.float()
        check_frames(frames, mask)
        # CLIP-ViP gives one slot (the projected first proxy); several frames are mean-pooled as clip4clip does
        return ProxyVideoState(mean_pooled_video(frames, mask), video.proxies.float())

    # ------------------------------------------------------------------ scoring
    def _method(self) -> str:
        return self.options.scorer

    def _pairwise(self, text_state: ProxyTextState, video_state: ProxyVideoState, **chunks: int | None) -> Tensor:
        return proxy_pairwise_scores(
            self.generator,
            text_state.emb,
            video_state.emb,
            video_state.proxies,
            self.gamma_value,
            method=self._method(),
            **chunks,
        )

    def score_block(self, text_state: ProxyTextState, video_state: ProxyVideoState) -> Tensor:
        return self._pairwise(text_state, video_state)

    @torch.no_grad()
    def score(
        self,
        text_state: ProxyTextState,
        video_state: ProxyVideoState,
        text_chunk: int | None = None,
        video_chunk: int | None = None,
    ) -> Tensor:
        """All pairs in one call of the scorer, which tiles internally (bounded memory); explicit chunks are
        passed on to it."""
        return self._pairwise(text_state, video_state, text_chunk=text_chunk, video_chunk=video_chunk).float()

    @torch.no_grad()
    def score_pairs(
        self, text_state: ProxyTextState, video_state: ProxyVideoState, text_index: Tensor, video_index: Tensor
    ) -> Tensor:
        """Exact scores of given pairs; the proxy term folds only the named videos (no grid per text group)."""
        if not use_fast(self.generator, self._method()):
            return super().score_pairs(text_state, video_state, text_index, video_index)
        text_index, video_index = check_pairs(text_index, video_index, len(text_state), len(video_state))
        t = text_state.emb[text_index.to(text_state.emb.device)]
        v = video_state.emb[video_index.to(video_state.emb.device)]
        regular = (t * v).sum(-1).float().cpu()
        if self.gamma_value == 0.0:
            return regular
        proxy = proxy_pair_scores(
            self.generator,
            text_state.emb,
            video_state.emb,
            video_state.proxies,
            text_index,
            video_index,
            method=self._method(),
        )
        return regular + self.gamma_value * proxy.float().cpu()

    def rerank_state(self, video_state: ProxyVideoState) -> ProxyVideoState | ProxyRerankState:
        """On the factorised path: every round's folded keys and values per video, built once at index time."""
        if not use_fast(self.generator, self._method()):
            return video_state
        return proxy_rerank_state(self.generator, video_state.emb, video_state.proxies)

    @torch.no_grad()
    def score_rerank(self, text_state: ProxyTextState, rerank_state: ProxyVideoState | ProxyRerankState) -> Tensor:
        if not isinstance(rerank_state, ProxyRerankState):
            return super().score_rerank(text_state, rerank_state)
        return proxy_rerank_scores(self.generator, text_state.emb, rerank_state, self.gamma_value)

    @torch.no_grad()
    def reference_pair_scores(self, text: TextFeatures, video: VideoFeatures) -> Tensor:
        """Spec §4.5 for each aligned pair, one at a time: cos(t, v) + γ·cos(t^p, v) with t^p from
        :meth:`ProxyGenerator.forward` on that one pair (no factorisation)."""
        dtype = weights_dtype(self.generator)
        out = []
        for p in range(text.eot.shape[0]):
            t = F.normalize(text.eot[p].to(dtype), dim=-1, eps=_EPS)
            frames, mask = F.normalize(video.frames[p].to(dtype), dim=-1, eps=_EPS), video.frame_mask[p].to(dtype)
            v = F.normalize((frames * mask[:, None]).sum(0) / mask.sum().clamp_min(1.0), dim=-1, eps=_EPS)
            proxy = self.generator(t[None], video.proxies[p : p + 1].to(dtype))[0, 0]
            out.append(t @ v + self.gamma_value * F.cosine_similarity(proxy, v, dim=0, eps=_EPS))
        return torch.stack(out).float() if out else torch.zeros(0)

    # ------------------------------------------------------------------ γ, chosen on validation
    @torch.no_grad()
    def score_components(
        self,
        text_state: ProxyTextState,
        video_state: ProxyVideoState,
        text_chunk: int | None = None,
        video_chunk: int | None = None,
        settings: list[dict[str, Any]] | None = None,
    ) -> dict[str, Tensor]:
        """S^r = cos(t_i, v_j) and S^p = cos(t^p_ij, v_j), each computed once: every γ is S^r + γ·S^p."""
        regular = (text_state.emb @ video_state.emb.t()).float()
        step = int(text_chunk or max(1, len(text_state)))
        parts = [
            proxy_scores(
                self.generator,
                text_state.emb[a : a + step],
                video_state.emb,
                video_state.proxies,
                method=self._method(),
                video_chunk=video_chunk,
            ).float()
            for a in range(0, len(text_state), step)
        ]
        proxy = torch.cat(parts, dim=0) if parts else torch.zeros_like(regular)
        return {"regular": regular, "proxy": proxy}

    def combine_scores(self, components: dict[str, Tensor], setting: dict[str, Any]) -> Tensor:
        gamma = _gamma_of(setting)
        if gamma == 0.0:
            return components["regular"]
        return components["regular"] + gamma * components["proxy"]

    def inference_candidates(self) -> list[dict[str, Any]]:
        if not self.options.select_gamma:
            return []
        return [{"gamma": g} for g in self.options.gamma_grid()]

    def inference_setting(self) -> dict[str, Any]:
        return {"gamma": self.gamma_value}

    def set_inference_setting(self, setting: dict[str, Any]) -> None:
        self.gamma.fill_(_gamma_of(setting))

    def baseline_settings(self) -> dict[str, dict[str, Any]]:
        return {"gamma=0": {"gamma": 0.0}}

    # ------------------------------------------------------------------ optimizer groups (spec §4.4)
    def param_rules(self, lr: float, backbone_lr: float) -> list[ParamRule]:
        opts = self.options
        proxy_lr = opts.proxy_lr if opts.proxy_lr > 0 else opts.proxy_lr_coef * lr
        if opts.lr_groups == "intended":
            return [ParamRule("head.generator.", "proxy", lr=proxy_lr)]
        # The released code's groups, exactly (spec §4.4): [top-decay, top-nodecay, clip-decay, proxy-decay,
        # clip-nodecay, proxy-nodecay], its no-decay test a substring match on "bias" (its "LayerNorm.weight" never
        # matches HF / TP names, so LayerNorm weights, embeddings and θ decay), the logit scale no-decay. Its
        # scheduler rewrites only groups 0-3 with the CLIP schedule: the proxy weights run at the CLIP peak lr and
        # schedule, and the no-decay groups keep their initial lr (CLIP's, the proxy module's) for the whole run.
        return [
            ParamRule(
                "head.generator.",
                "proxy-constant",
                lr=proxy_lr,
                schedule="constant",
                decay=False,
                contains=RELEASE_NO_DECAY,
            ),
            ParamRule("head.generator.", "proxy", lr=backbone_lr, decay=True),
            ParamRule("head.logit_scale", "logit-scale-constant", lr=backbone_lr, schedule="constant", decay=False),
            ParamRule(
                "backbone.",
                "backbone-constant",
                lr=backbone_lr,
                schedule="constant",
                decay=False,
                contains=RELEASE_NO_DECAY,
            ),
            ParamRule("backbone.", "backbone", lr=backbone_lr, decay=True),
        ]

    # ------------------------------------------------------------------ training
    def loss(self, text: TextFeatures, video: VideoFeatures, shard: RowShard | None = None) -> dict[str, Tensor]:
        """text_proxy_loss on the B×B batch (spec §4.3): S^r, S^p over all B×B pairs (each video with its own
        proxy t^p_ij) and S^pos_ik = cos(t^p_ii, v_k).

        Under DDP (``shard``: this rank's rows of the gathered batch) the generator runs on this rank's texts × every
        video only, and the rows of the three matrices are all-gathered in one collective
        (:mod:`tvr.train.distributed`)."""
        ts, vs = self.encode_texts(text), self.encode_videos(video)
        if len(ts) != len(vs):
            raise ValueError(f"TV-ProxyNet loss needs aligned pairs, got {len(ts)} texts and {len(vs)} videos")
        shard = shard or RowShard.whole(len(ts))
        t, v = shard.local(ts).emb, vs.emb
        proxy = F.normalize(self.generator(t, vs.proxies), dim=-1, eps=_EPS)  # [own texts, B, D]
        rows = torch.stack(
            [t @ v.t(), torch.einsum("ijd,jd->ij", proxy, v), shard.positives(proxy) @ v.t()], dim=1
        )  # S^r, S^p, S^pos rows; S^pos's from t^p_ii
        sim_r, sim_p, sim_pos = shard.gather(rows).unbind(dim=1)
        opts = self.options
        loss = text_proxy_loss(sim_r, sim_p, sim_pos, self.logit_scale, alpha=opts.alpha, beta=opts.beta)
        if opts.loss_scale == "release":
            loss = 2.0 * loss  # the released code sums the two directions of each term instead of averaging them
        scale = self.logit_scale.exp().detach()
        with torch.no_grad():
            parts = {
                name: symmetric_infonce(scale * sim)
                for name, sim in (("regular", sim_r), ("proxy", sim_p), ("positive", sim_pos))
            }
        return {"loss": loss, **parts, "logit_scale": scale}


def _gamma_of(setting: dict[str, Any]) -> float:
    value = setting.get("gamma") if isinstance(setting, dict) else None
    if (
        set(setting or {}) != {"gamma"}
        or isinstance(value, bool)
        or not isinstance(value, (int, float))
        or not math.isfinite(value)
        or value < 0
    ):
        raise ValueError(f"TV-ProxyNet inference setting {setting!r}: expected {{'gamma': a number >= 0}}")
    return float(value)
