"""GraviAlign head (spec §5, summary seed 004): Gaussian embeddings scored by semantic gravitation × geometric overlap.

No code was ever released; this is our implementation of the summary, with the choices it leaves open stated in
docs/methods/gravialign.md. Per modality a pooled feature f (text: the projected EOT before L2 normalisation; video:
the masked mean of the frame slots, i.e. the projected first proxy on the CLIP-ViP tower, which has one slot) goes
through an uncertainty head with its own parameters:

    μ = norm(LN(W_μ f + b_μ))        W_μ = I, b_μ = 0 at init
    log σ² = clamp(W_σ f + b_σ)      W_σ ~ N(0, 0.02²), b_σ = log σ₀² (−4) at init, clamp [−10, 5] (hard or soft)

Training: L = InfoNCE(exp(logit_scale)·cos) + α·L_SGI; the InfoNCE runs on normalised f (default) or on μ. L_SGI is
the paper's −mean of S_align (``losses.sgi_align``) over the positive pairs (``sgi_objective: positive``) or the
contrastive L_SGI-NCE over every pair of the batch (``contrastive``, ``losses.sgi_align_nce``).

Inference modes (an inference setting chosen on the validation split, stored in buffers so it travels with the
checkpoint): ``cos_f`` (the CLIP-ViP score, indexable), ``cos_mu`` (indexable), ``s_align`` (S_align of every pair,
``scoring.s_align_scores``) and ``mixed`` = cos_f + w·(S_align − mean)/std with the mean and std of
S_align over all in-batch pairs, kept as running statistics during training (like BatchNorm's), so at test time the
score of a pair does not depend on the gallery. ``indexable`` follows the current mode.
"""

from __future__ import annotations

import dataclasses
import logging
import math
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from tvr.config import bounded, choice
from tvr.losses import symmetric_infonce
from tvr.methods.gravialign.losses import (
    SGI_A_DISTANCES,
    SGI_QUALITIES,
    SgiParams,
    sgi_align,
    sgi_align_pairwise,
    sgi_align_terms,
    sgi_nce_scale,
)
from tvr.methods.gravialign.scoring import s_align_scores
from tvr.models.heads.base import ParamRule, RetrievalHead
from tvr.models.heads.common import check_pairs
from tvr.models.heads.registry import register_head
from tvr.types import Sliceable, TextFeatures, VideoFeatures
from tvr.utils.distributed import RowShard

#: inference modes; the first two are dot products of per-item embeddings (indexable)
MODES = ("cos_f", "cos_mu", "s_align", "mixed")
INDEXABLE_MODES = ("cos_f", "cos_mu")
#: every non-empty subset of the three score terms (the ablation presets drop one)
TERM_SETS = ("ABC", "AB", "AC", "BC", "A", "B", "C")
#: L_SGI: the paper's −mean S_align over the positives | the contrastive L_SGI-NCE over every pair of the batch
SGI_OBJECTIVES = ("positive", "contrastive")
#: how log σ² is kept in [logvar_min, logvar_max]: a hard clamp (no gradient outside) | a soft one (softplus pair)
LOGVAR_CLAMP_MODES = ("hard", "soft")
#: pairs scored at once by :meth:`GraviAlignHead.score_pairs` (each holds a few D-vectors)
PAIR_CHUNK = 8192
_EPS = 1e-12
#: the collapse watch reads the loss every this many training steps (one device sync each) and warns after this
#: many collapsed readings in a row
COLLAPSE_CHECK_EVERY = 10
COLLAPSE_READINGS = 3

logger = logging.getLogger(__name__)


@dataclasses.dataclass
class GraviAlignOptions:
    """GraviAlign (spec §5), ``head.options`` of ``head.name: gravialign``. Defaults: spec §5.2 ★."""

    #: gravitational constant G of term A
    G: float = bounded(1.0, ge=0.0)
    #: SGI temperature T (A scales with G/T)
    T: float = bounded(1.0, gt=0.0)
    #: quality sensitivity λ in m = exp(−λ·H̃/(1 + H̃))
    lam: float = bounded(1.0, ge=0.0)
    #: weight α of L_SGI in L = InfoNCE + α·L_SGI
    alpha: float = bounded(0.1, ge=0.0)
    #: q, Σ log s and the entropy proxy as per-dimension means, d = √(q/D + ε) (fix of spec §5.2 item 2);
    #: false = the summary's sums over D
    per_dim_mean: bool = True
    #: H̃ in the quality: softplus(H) | clamp = max(0, H) (both keep m in (0, 1]) | literal = H (pole at H = −1)
    quality: str = choice("softplus", *SGI_QUALITIES)
    #: the score terms used in S_align (loss and s_align/mixed inference): ABC, or a subset for the ablations
    terms: str = choice("ABC", *TERM_SETS)
    #: ε in d = √(q + ε) (0 = the literal d = √q, infinite A at δ = 0); unused with a_distance: expected
    eps: float = bounded(1e-6, ge=0.0)
    #: term A's distance: centre = the summary's d = √(q + ε) between the means | expected = the expected whitened
    #: distance of two samples, d = √(q + D) (√(q/D + 1) per dimension: A ≤ G/T, nothing to tune; ours)
    a_distance: str = choice("centre", *SGI_A_DISTANCES)
    #: L_SGI: positive = the paper's −mean S_align over the positive pairs | contrastive = L_SGI-NCE, a symmetric
    #: InfoNCE over the batch's S_align matrix (ours: no trivial maximiser, see the docs)
    sgi_objective: str = choice("positive", *SGI_OBJECTIVES)
    #: temperature τ of the contrastive objective: logits κ·S_align/τ, κ = D with per_dim_mean (the log-kernel's own
    #: units), 1 with sums; τ = 1 leaves the temperature to the learned variances
    sgi_tau: float = bounded(1.0, gt=0.0)
    #: clamp log σ² to [logvar_min, logvar_max] (fix of spec §5.2 item 3); false = unbounded (the literal formula)
    logvar_clamp: bool = True
    #: hard = clamp (an entry outside the range gets no gradient) | soft = lo + softplus(x − lo) − softplus(x − hi):
    #: inside (lo, hi), ≈ x well inside, gradient everywhere (ours)
    logvar_clamp_mode: str = choice("hard", *LOGVAR_CLAMP_MODES)
    logvar_min: float = -10.0
    logvar_max: float = 5.0
    #: b_σ at init = log σ₀² (σ₀² = e⁻⁴, small against squared distances on the unit sphere)
    logvar_init: float = -4.0
    #: std of W_σ at init (W_μ starts at the identity, b_μ at 0)
    logvar_weight_std: float = bounded(0.02, ge=0.0)
    #: features of the InfoNCE: f = normalised backbone features (the CLIP-ViP head) | mu = the Gaussian means |
    #: both = the mean of the two InfoNCE losses (ours: L_SGI alone has no negatives, see the docs)
    infonce_on: str = choice("f", "f", "mu", "both")
    #: the mode scored until validation picks one (and the only one when select_modes is empty)
    inference_mode: str = choice("cos_f", *MODES)
    #: w of the mixed mode until validation picks one
    mixed_weight: float = bounded(0.1, ge=0.0)
    #: modes validation chooses among, comma-separated ("" = keep inference_mode); mixed tries every mixed_weights
    select_modes: str = "cos_f,cos_mu,s_align,mixed"
    #: w candidates of the mixed mode on validation (one or more numbers >= 0)
    mixed_weights: tuple[float, ...] = (0.03, 0.1, 0.3, 1.0)
    #: momentum of the running mean / variance of in-batch S_align that standardises it in the mixed mode
    stats_momentum: float = bounded(0.01, gt=0.0, le=1.0)
    #: two-stage scoring of the pairwise modes shortlists by cos(μ) | cos(f), then reranks exactly (μ's top-10 holds
    #: the exact S_align top-1 far more often, docs/methods/gravialign.md)
    shortlist: str = choice("mu", "mu", "f")
    #: let L_SGI's gradient reach the backbone features f (the summary's shared features); false = L_SGI trains the
    #: uncertainty heads only (ours: the positive-only objective cannot then collapse the backbone, see the docs)
    sgi_to_backbone: bool = True
    #: peak lr of the two uncertainty heads (0 = train.lr; the summary gives none)
    module_lr: float = bounded(0.0, ge=0.0)

    def validate(self) -> None:
        if self.logvar_clamp and not self.logvar_min < self.logvar_max:
            raise ValueError(f"logvar_min = {self.logvar_min}: must be below logvar_max = {self.logvar_max}")
        if self.logvar_clamp and not self.logvar_min <= self.logvar_init <= self.logvar_max:
            raise ValueError(
                f"logvar_init = {self.logvar_init}: must lie in [logvar_min, logvar_max] = "
                f"[{self.logvar_min}, {self.logvar_max}]"
            )
        parse_modes(self.select_modes)
        weights = list(self.mixed_weights)
        if not weights or any(
            isinstance(w, bool) or not isinstance(w, (int, float)) or not (0.0 <= w < math.inf) for w in weights
        ):
            raise ValueError(f"mixed_weights = {weights}: expected one or more numbers >= 0")


def parse_modes(text: str) -> list[str]:
    """``select_modes`` as a list: comma-separated names of :data:`MODES`, each at most once ("" = none)."""
    if not isinstance(text, str):
        raise ValueError(f"select_modes = {text!r}: expected a comma-separated string of {list(MODES)}")
    names = [m.strip() for m in text.split(",") if m.strip()]
    bad = [m for m in names if m not in MODES]
    if bad or len(set(names)) != len(names):
        raise ValueError(f"select_modes = {text!r}: expected distinct names among {list(MODES)}, comma-separated")
    return names


@dataclasses.dataclass
class GraviState(Sliceable):
    """Per-item state. f: [N, D] normalised backbone feature; mu: [N, D] unit-norm mean; logvar: [N, D] clamped."""

    f: Tensor
    mu: Tensor
    logvar: Tensor


class GaussianEmbedding(nn.Module):
    """One modality's uncertainty head: μ = norm(LN(W_μ f + b_μ)), raw log σ² = W_σ f + b_σ (clamped by the head)."""

    def __init__(self, dim: int, logvar_init: float, logvar_weight_std: float) -> None:
        super().__init__()
        self.mu_fc = nn.Linear(dim, dim)
        self.mu_norm = nn.LayerNorm(dim)
        self.logvar_fc = nn.Linear(dim, dim)
        with torch.no_grad():
            # μ starts at norm(LN(f)): the Gaussian means begin where the backbone's features are
            self.mu_fc.weight.copy_(torch.eye(dim))
            self.mu_fc.bias.zero_()
            self.logvar_fc.weight.normal_(0.0, logvar_weight_std)
            self.logvar_fc.bias.fill_(logvar_init)

    def forward(self, f: Tensor) -> tuple[Tensor, Tensor]:
        mu = F.normalize(self.mu_norm(self.mu_fc(f)).float(), dim=-1, eps=_EPS)
        return mu, self.logvar_fc(f).float()


def soft_clamp(x: Tensor, low: float, high: float) -> Tensor:
    """low + softplus(x − low) − softplus(x − high): inside (low, high), increasing, within
    softplus(low − x) + softplus(x − high) of x (0.0025 at the default init −4 in [−10, 5]), and with the gradient
    σ(x − low) − σ(x − high) > 0 everywhere, so an entry outside the range still learns (the hard clamp's gradient
    there is 0). Above the midpoint it is evaluated as the identical high + softplus(low − x) − softplus(high − x),
    whose gradient does not cancel to 0 in floating point far above the range."""
    below = low + F.softplus(x - low) - F.softplus(x - high)
    above = high + F.softplus(low - x) - F.softplus(high - x)
    return torch.where(x <= 0.5 * (low + high), below, above)


def pooled_video(video: VideoFeatures) -> Tensor:
    """f_v: the masked mean of the (unnormalised) frame slots, [N, D]. On the CLIP-ViP tower there is one slot, the
    projected first proxy, so this is that feature itself; on the CLIP4Clip backbone it is the mean of the frame
    features after the temporal module. A video without a real frame gets the zero vector."""
    frames = video.frames.float()
    if frames.ndim != 3 or tuple(video.frame_mask.shape) != tuple(frames.shape[:2]):
        raise ValueError(
            f"video features: expected frames [N, F, D] and frame_mask [N, F], got "
            f"{tuple(frames.shape)} and {tuple(video.frame_mask.shape)}"
        )
    mask = video.frame_mask.to(frames.dtype).unsqueeze(-1)
    return (frames * mask).sum(dim=1) / mask.sum(dim=1).clamp_min(1.0)


@register_head("gravialign")
class GraviAlignHead(RetrievalHead):
    """GraviAlign (spec §5). ``indexable`` follows the stored inference mode (cos_f / cos_mu: yes)."""

    Options = GraviAlignOptions
    analysis_figures = ".figures"
    # From scratch at lr 1e-3 the spec's α = 0.1, ε = 1e-6 collapse every feature onto one point (the positive-only
    # L_SGI's trivial maximiser); α = 0.01 (the low end of the spec's sweep) with A bounded by 10·G/T trains the
    # InfoNCE as fast as the CLIP4Clip head while L_SGI still reaches the backbone (docs/methods/gravialign.md)
    demo_options = {"alpha": 0.01, "eps": 1e-2}
    # sgi_align_pairwise tiles a block itself with bounded working memory: whole-gallery blocks keep its thread
    # stripes busy (the base class's default 256 × 256 blocks suit heads whose score_block does not tile)
    default_text_chunk = 1024
    default_video_chunk = 1 << 30

    def build(self) -> None:
        o, dim = self.options, self.dim
        self.gauss_text = GaussianEmbedding(dim, o.logvar_init, o.logvar_weight_std)
        self.gauss_video = GaussianEmbedding(dim, o.logvar_init, o.logvar_weight_std)
        # the inference setting and the S_align statistics are buffers: saved with (and restored from) checkpoints
        self.register_buffer("mode_index", torch.tensor(MODES.index(o.inference_mode)))
        # float64: the chosen w is reported as given (0.7, not 0.699999988)
        self.register_buffer("mixed_w", torch.tensor(float(o.mixed_weight), dtype=torch.float64))
        self.register_buffer("s_align_mean", torch.tensor(0.0))
        self.register_buffer("s_align_var", torch.tensor(1.0))
        self.register_buffer("s_align_batches", torch.tensor(0))
        # one full S_align matrix kept between score_components and the score of the same states (see score)
        self._s_cache: tuple[Any, Any, Tensor] | None = None
        # (mode, w) read from the buffers once, not at every block (on a GPU each read is a device sync); a loaded
        # state dict or a new setting clears it
        self._setting: tuple[str, float] | None = None
        self.register_load_state_dict_post_hook(lambda module, _keys: setattr(module, "_setting", None))
        self._train_steps = 0
        self._collapsed_readings = 0
        self.collapse_warned = False

    def _current(self) -> tuple[str, float]:
        if self._setting is None:
            self._setting = (MODES[int(self.mode_index)], float(self.mixed_w))
        return self._setting

    @property
    def indexable(self) -> bool:  # type: ignore[override]
        return self.mode in INDEXABLE_MODES

    @property
    def mode(self) -> str:
        """The inference mode scored now (one of :data:`MODES`)."""
        return self._current()[0]

    def extra_repr(self) -> str:
        return f"mode={self.mode!r}, terms={self.options.terms!r}, per_dim_mean={self.options.per_dim_mean}"

    @property
    def sgi(self) -> SgiParams:
        """The S_align settings of this head's options (one object for ``losses.sgi_align*`` and
        ``scoring.s_align_scores``)."""
        return SgiParams(**{f.name: getattr(self.options, f.name) for f in dataclasses.fields(SgiParams)})

    def sgi_kwargs(self) -> dict[str, Any]:
        """:attr:`sgi` as keyword arguments (a caller that changes one of them, e.g. ``terms``)."""
        return dataclasses.asdict(self.sgi)

    def param_rules(self, lr: float, backbone_lr: float) -> list[ParamRule]:
        if self.options.module_lr > 0:
            return [ParamRule("head.gauss_", "gauss", lr=self.options.module_lr)]
        return []

    # ------------------------------------------------------------------ states
    def _gaussian(self, module: GaussianEmbedding, f: Tensor) -> tuple[Tensor, Tensor]:
        mu, logvar = module(f)
        o = self.options
        if o.logvar_clamp:
            if o.logvar_clamp_mode == "soft":
                logvar = soft_clamp(logvar, o.logvar_min, o.logvar_max)
            else:
                logvar = logvar.clamp(o.logvar_min, o.logvar_max)
        return mu, logvar

    def _state(self, module: GaussianEmbedding, f: Tensor) -> GraviState:
        mu, logvar = self._gaussian(module, f)
        return GraviState(F.normalize(f.float(), dim=-1, eps=_EPS), mu, logvar)

    def encode_texts(self, text: TextFeatures) -> GraviState:
        # f_t is the raw projected EOT, before CLIP's L2 normalisation (spec §5.1 ★)
        return self._state(self.gauss_text, text.eot.float())

    def encode_videos(self, video: VideoFeatures) -> GraviState:
        return self._state(self.gauss_video, pooled_video(video))

    # ------------------------------------------------------------------ scoring
    def s_align_block(self, text_state: GraviState, video_state: GraviState) -> Tensor:
        """S_align of every pair of a block: [n_t, n_v] (the fast test-time kernel, on the process's scoring pool)."""
        return s_align_scores(video_state.mu, video_state.logvar, text_state.mu, text_state.logvar, params=self.sgi)

    def standardise(self, s_align: Tensor) -> Tensor:
        """(S_align − running mean) / running std: the training batches' statistics, fixed at test time."""
        return (s_align - self.s_align_mean) / torch.sqrt(self.s_align_var.clamp_min(_EPS))

    def _combine(
        self, mode: str, w: float, cos_f: Tensor | None, cos_mu: Tensor | None, s_align: Tensor | None
    ) -> Tensor:
        if mode == "cos_f":
            return cos_f
        if mode == "cos_mu":
            return cos_mu
        if mode == "s_align":
            return s_align
        return cos_f + w * self.standardise(s_align)

    def score_block(self, text_state: GraviState, video_state: GraviState) -> Tensor:
        mode = self.mode
        if mode == "cos_f":
            return text_state.f @ video_state.f.T
        if mode == "cos_mu":
            return text_state.mu @ video_state.mu.T
        s_align = self.s_align_block(text_state, video_state)
        if mode == "s_align":
            return s_align
        return self._combine(mode, self._current()[1], text_state.f @ video_state.f.T, None, s_align)

    @torch.no_grad()
    def score(
        self,
        text_state: GraviState,
        video_state: GraviState,
        text_chunk: int | None = None,
        video_chunk: int | None = None,
    ) -> Tensor:
        """As :meth:`RetrievalHead.score`; a pairwise mode reuses the S_align matrix that :meth:`score_components`
        just computed for these very states (evaluation computes the components, then the chosen score)."""
        cache, self._s_cache = self._s_cache, None
        if cache is not None and cache[0] is text_state and cache[1] is video_state and not self.indexable:
            cos_f = (text_state.f @ video_state.f.T).float() if self.mode == "mixed" else None
            return self._combine(self.mode, self._current()[1], cos_f, None, cache[2]).float()
        return super().score(text_state, video_state, text_chunk, video_chunk)

    @torch.no_grad()
    def score_pairs(
        self, text_state: GraviState, video_state: GraviState, text_index: Tensor, video_index: Tensor
    ) -> Tensor:
        """Exact scores of given pairs straight from ``sgi_align`` on the gathered pairs (no grids)."""
        if self.indexable:
            return super().score_pairs(text_state, video_state, text_index, video_index)
        text_index, video_index = check_pairs(text_index, video_index, len(text_state), len(video_state))
        out = torch.empty(text_index.shape[0], dtype=torch.float32)
        device = text_state.mu.device
        for a in range(0, text_index.shape[0], PAIR_CHUNK):
            ti, vi = text_index[a : a + PAIR_CHUNK].to(device), video_index[a : a + PAIR_CHUNK].to(device)
            ts, vs = text_state[ti], video_state[vi]
            s_align = sgi_align(vs.mu, vs.logvar, ts.mu, ts.logvar, params=self.sgi)
            cos_f = (ts.f * vs.f).sum(dim=-1) if self.mode == "mixed" else None
            out[a : a + PAIR_CHUNK] = self._combine(self.mode, self._current()[1], cos_f, None, s_align).float().cpu()
        return out

    def _shortlist_field(self) -> str:
        if self.mode == "cos_mu" or (self.mode not in INDEXABLE_MODES and self.options.shortlist == "mu"):
            return "mu"
        return "f"

    def shortlist_texts(self, text_state: GraviState) -> Tensor:
        """cos_f / cos_mu: the exact embeddings; pairwise modes: normalised f (or μ, ``shortlist: mu``)."""
        return getattr(text_state, self._shortlist_field())

    def shortlist_videos(self, video_state: GraviState) -> Tensor:
        return getattr(video_state, self._shortlist_field())

    # ------------------------------------------------------------------ inference settings
    def inference_candidates(self) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = []
        for mode in parse_modes(self.options.select_modes):
            if mode == "mixed":
                weights = list(dict.fromkeys(float(w) for w in self.options.mixed_weights))
                out.extend({"mode": "mixed", "w": w} for w in weights)
            else:
                out.append({"mode": mode})
        return out

    def inference_setting(self) -> dict[str, Any]:
        if self.mode == "mixed":
            return {"mode": "mixed", "w": self._current()[1]}
        return {"mode": self.mode}

    def set_inference_setting(self, setting: dict[str, Any]) -> None:
        mode = setting.get("mode") if isinstance(setting, dict) else None
        if mode not in MODES:
            raise ValueError(f"GraviAlign inference setting {setting!r}: 'mode' must be one of {list(MODES)}")
        extra = set(setting) - {"mode", "w"}
        if extra:
            raise ValueError(f"GraviAlign inference setting {setting!r}: unknown key(s) {sorted(extra)}")
        if mode == "mixed":
            w = setting.get("w", self._current()[1])
            if isinstance(w, bool) or not isinstance(w, (int, float)) or not w >= 0:
                raise ValueError(f"GraviAlign inference setting {setting!r}: 'w' must be a number >= 0")
            self.mixed_w.fill_(float(w))
        self.mode_index.fill_(MODES.index(mode))
        self._setting = None

    def baseline_settings(self) -> dict[str, dict[str, Any]]:
        return {"cos_f": {"mode": "cos_f"}}

    @torch.no_grad()
    def score_components(
        self,
        text_state: GraviState,
        video_state: GraviState,
        text_chunk: int | None = None,
        video_chunk: int | None = None,
        settings: list[dict[str, Any]] | None = None,
    ) -> dict[str, Tensor]:
        """cos_f, cos_mu and (when one of ``settings`` needs it) S_align, each [N_t, N_v], so every setting is
        combined without rescoring. ``settings`` None: every candidate and the current setting; at test time the
        evaluator names only the baseline rows (cos_f), so no S_align pass is spent for a stored cos_f / cos_mu
        mode (a pairwise mode's own score is computed once, by :meth:`score`)."""
        out = {"cos_f": (text_state.f @ video_state.f.T).float(), "cos_mu": (text_state.mu @ video_state.mu.T).float()}
        if settings is None:
            settings = [*self.inference_candidates(), self.inference_setting()]
        wanted = {setting["mode"] for setting in settings}
        if wanted & {"s_align", "mixed"}:
            step = text_chunk or len(text_state) or 1
            parts = [
                self.s_align_block(text_state[a : a + step], video_state).float()
                for a in range(0, len(text_state), step)
            ]
            out["s_align"] = torch.cat(parts, dim=0) if parts else out["cos_f"].new_zeros(0, len(video_state))
            self._s_cache = (text_state, video_state, out["s_align"])
        return out

    def combine_scores(self, components: dict[str, Tensor], setting: dict[str, Any]) -> Tensor:
        mode = setting["mode"]
        if mode in ("s_align", "mixed") and "s_align" not in components:
            raise ValueError(f"GraviAlign: the {mode} score needs the 's_align' component")
        return self._combine(
            mode,
            float(setting.get("w", self._current()[1])),
            components.get("cos_f"),
            components.get("cos_mu"),
            components.get("s_align"),
        )

    @torch.no_grad()
    def reference_pair_scores(self, text: TextFeatures, video: VideoFeatures) -> Tensor:
        """Spec §5 for each aligned pair, one at a time, in the stored mode: cos(f_t, f_v), cos(μ_t, μ_v), S_align
        from ``losses.sgi_align`` on that one pair, or cos_f + w·(S_align − mean)/std."""
        mode, w = self._current()
        out = []
        for p in range(text.eot.shape[0]):
            f_t = text.eot[p : p + 1].float()
            f_v = pooled_video(video[p : p + 1])
            mu_t, logvar_t = self._gaussian(self.gauss_text, f_t)
            mu_v, logvar_v = self._gaussian(self.gauss_video, f_v)
            cos_f = F.cosine_similarity(f_t, f_v, eps=_EPS)[0]
            s_align = sgi_align(mu_v, logvar_v, mu_t, logvar_t, params=self.sgi)[0]
            scores = {
                "cos_f": cos_f,
                "cos_mu": (mu_t * mu_v).sum(),
                "s_align": s_align,
                "mixed": cos_f + w * (s_align - self.s_align_mean) / self.s_align_var.clamp_min(_EPS).sqrt(),
            }
            out.append(scores[mode])
        return torch.stack(out).float() if out else torch.zeros(0)

    # ------------------------------------------------------------------ training
    @torch.no_grad()
    def _update_statistics(self, s_align: Tensor) -> None:
        """Running mean / variance of S_align over all B×B in-batch pairs (BatchNorm-style momentum)."""
        mean = s_align.mean()
        var = s_align.var() if s_align.numel() > 1 else torch.zeros_like(mean)
        if not (torch.isfinite(mean) and torch.isfinite(var)):
            return
        if int(self.s_align_batches) == 0:
            self.s_align_mean.copy_(mean)
            self.s_align_var.copy_(var)
        else:
            m = self.options.stats_momentum
            self.s_align_mean.lerp_(mean.to(self.s_align_mean.dtype), m)
            self.s_align_var.lerp_(var.to(self.s_align_var.dtype), m)
        self.s_align_batches.add_(1)

    def _watch_collapse(self, infonce: Tensor, mu_t: Tensor, mu_v: Tensor) -> None:
        """Warn once when the positive-only L_SGI has collapsed the features (docs/methods/gravialign.md, "A fourth
        problem"): the InfoNCE at ln B — every similarity equal — while the unit means μ of the batch have (almost)
        no spread, 1 − ‖mean μ‖² < 0.01 for texts and videos, at :data:`COLLAPSE_READINGS` readings in a row."""
        self._train_steps += 1
        batch = mu_t.shape[0]
        if self.options.sgi_objective != "positive":
            return  # the contrastive objective has no such maximiser
        if self.collapse_warned or batch < 2 or self._train_steps % COLLAPSE_CHECK_EVERY:
            return
        spread = max(float(1.0 - mu.float().mean(dim=0).square().sum()) for mu in (mu_t, mu_v))
        collapsed = float(infonce) > 0.98 * math.log(batch) and spread < 0.01
        self._collapsed_readings = self._collapsed_readings + 1 if collapsed else 0
        if self._collapsed_readings >= COLLAPSE_READINGS:
            self.collapse_warned = True
            logger.warning(
                "GraviAlign: the features have collapsed (InfoNCE %.3f ≈ ln %d = %.3f, spread of the means %.2g): the "
                "positive-only L_SGI is maximised by giving every item the same mean. Lower head.options.alpha and "
                "raise head.options.eps (e.g. alpha=0.01, eps=1e-2), set head.options.sgi_to_backbone=false, or use "
                "the contrastive objective head.options.sgi_objective=contrastive (docs/methods/gravialign.md)",
                float(infonce),
                batch,
                math.log(batch),
                spread,
            )

    def loss(self, text: TextFeatures, video: VideoFeatures, shard: RowShard | None = None) -> dict[str, Tensor]:
        """L = InfoNCE(exp(logit_scale)·cos) + α·L_SGI on B aligned pairs (spec §5.3), with L_SGI the paper's
        −mean_i S_align(v_i, t_i) (``sgi_objective: positive``) or L_SGI-NCE = ½[CE_rows + CE_cols] of κ·S/τ over the
        batch's B×B S_align matrix (``contrastive``; ``losses.sgi_align_nce``).

        In training mode the running statistics of S_align over all B×B pairs are updated (for ``mixed``); the
        logged ``term_*`` are means over the positive pairs.

        Under DDP (``shard``: this rank's rows of the gathered batch) the pairwise work — S_align and the cosines of
        this rank's texts against every video — is done for its own rows, the rows are all-gathered, and the
        positive pairs' sums are summed over ranks (:mod:`tvr.train.distributed`)."""
        o = self.options
        f_t, f_v = text.eot.float(), pooled_video(video)
        if f_t.shape[0] != f_v.shape[0]:
            raise ValueError(f"GraviAlign loss needs aligned pairs, got {f_t.shape[0]} texts and {f_v.shape[0]} videos")
        shard = shard or RowShard.whole(f_t.shape[0])
        n, own = shard.total, shard.rows
        mu_t, logvar_t = self._gaussian(self.gauss_text, f_t)
        mu_v, logvar_v = self._gaussian(self.gauss_video, f_v)
        if o.sgi_to_backbone:
            sgi_video, sgi_text = (mu_v, logvar_v), (mu_t, logvar_t)
        else:
            sgi_video = self._gaussian(self.gauss_video, f_v.detach())
            sgi_text = self._gaussian(self.gauss_text, f_t.detach())
        own_text = (sgi_text[0][own], sgi_text[1][own])
        own_pairs = (sgi_video[0][own], sgi_video[1][own], *own_text)  # this rank's aligned (video, text) pairs
        scale = self.logit_scale.exp()
        losses = []
        if o.infonce_on in ("f", "both"):
            cos_f = F.normalize(f_t[own], dim=-1, eps=_EPS) @ F.normalize(f_v, dim=-1, eps=_EPS).T
            losses.append(symmetric_infonce(scale * shard.gather(cos_f)))
        if o.infonce_on in ("mu", "both"):
            losses.append(symmetric_infonce(scale * shard.gather(mu_t[own] @ mu_v.T)))
        infonce = losses[0] if len(losses) == 1 else 0.5 * (losses[0] + losses[1])
        all_pairs = None
        if o.sgi_objective == "contrastive":
            # every pair of the (gathered) batch, chunked, with its own chunked backward (never B×B×D at once)
            all_pairs = shard.gather(sgi_align_pairwise(*sgi_video, *own_text, params=self.sgi))
            sgi = symmetric_infonce(sgi_nce_scale(tau=o.sgi_tau, per_dim_mean=o.per_dim_mean, dim=self.dim) * all_pairs)
            with torch.no_grad():
                parts = sgi_align_terms(*own_pairs, params=self.sgi)
        else:
            parts = sgi_align_terms(*own_pairs, params=self.sgi)
            sgi = -shard.sum(torch.stack(list(parts.values())).sum(dim=0).sum()) / n
        # α = 0 still keeps the uncertainty heads in the graph (zero gradients; DDP expects every parameter used)
        total = infonce + o.alpha * sgi
        if self.training:
            if all_pairs is None:
                # in the calling thread (workers=1): a training step starts no threads and leaves torch's settings
                rows = s_align_scores(mu_v, logvar_v, mu_t[own], logvar_t[own], workers=1, params=self.sgi)
                all_pairs = shard.gather(rows.detach())
            self._update_statistics(all_pairs.detach())
            self._watch_collapse(infonce.detach(), mu_t.detach(), mu_v.detach())
        out = {"loss": total, "infonce": infonce.detach(), "sgi": sgi.detach()}
        term_means = shard.sum(torch.stack([v.detach().sum() for v in parts.values()])) / n
        out.update({f"term_{k}": mean for k, mean in zip(parts, term_means, strict=True)})
        out["logvar_text"] = logvar_t.detach().mean()
        out["logvar_video"] = logvar_v.detach().mean()
        out["logit_scale"] = scale.detach()
        return out
