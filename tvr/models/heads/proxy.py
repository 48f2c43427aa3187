"""TV-ProxyNet head (spec §4): a text proxy t^p_ij for every (text, video) pair, on the CLIP-ViP backbone.

For a unit-norm text t_i and the M projected proxy tokens X̃_j ∈ R^{M×D} of video j (``VideoFeatures.proxies``):

* **Direction leader** (k = ``layers`` rounds, spec §4.2): the query starts as t_i and the memory is X̃_j; each round
  is the released code's post-LN-style decoder layer

      x = LN1(x);  m = LN2(X̃_j);  x = x + Drop(MHA(x, m, m));  x = LN3(x);  x = x + Drop(W2·Drop(ReLU(W1 x)));
      x = LN4(x)

  (nn.MultiheadAttention semantics: in/out projections with bias, ``heads`` heads, scale 1/√(D/heads), dropout on
  the attention weights). A final LayerNorm gives the leader l_ij.
* **Director** d_ij = δ·t_i − η·l_ij, d̂_ij = d_ij/‖d_ij‖.
* **Dash**, from S_ijm = cos(t_i, X̃_jm) over all M proxies: ``theta`` D_s = exp(θ·mean_m S_ijm) (a scalar,
  θ ~ U(0, 1) learnable) or ``linear`` d_s = exp(W S_ij + b) ∈ R^D (nn.Linear(M → D)).
* **Proxy** t^p_ij = t_i + D_s·d̂_ij (theta) or t_i + d_s ⊙ d̂_ij (linear).

Score: s_ij = cos(t_i, v_j) + γ·cos(t^p_ij, v_j) (v_j = the CLIP-ViP video feature). The pair (i, j) is always
scored with its own proxy t^p_ij, never with the positive proxy t^p_ii. γ is an inference setting chosen on the
validation split; γ = 0 is the CLIP-ViP baseline and is always reported beside it.

Test-time scoring (:func:`proxy_pairwise_scores`) is exact and factorised. In eval mode (no dropout) the only
per-pair work that cannot be hoisted is the FFN of every round; everything else is per text or per video:

* round 1's query LN1(t_i) and its projection are per text;
* LN2(X̃_j), the keys and the values are per video; the output projection folds into the values
  (u_jm = W_o v_jm + b_o, valid because the attention weights of each head sum to 1);
* the query projection of every round folds into per-video keys: (W_q x + b_q)·k = x·(W_qᵀ k) + b_q·k, so a pair's
  attention costs O(heads·M·D) instead of a D × D product;
* the FFNs run as two GEMMs on [P, D] blocks of P pairs (P bounded), and LN / director / dash / cosine are
  elementwise on the block (the theta dash needs l·v, l·t and ‖l‖ only, never t^p itself).

So a pair costs 2·D·ffn_dim multiply-adds per round plus O(D) elementwise work, and memory is bounded by the
block, never N_t × N_v × D. ``scorer: block`` runs :meth:`ProxyGenerator.forward` on 128 × 128 blocks instead (the
released code's way, spec §4.5); both agree to float rounding (``tests/test_proxy_head.py``).
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from tvr.config import bounded, choice
from tvr.losses import symmetric_infonce, text_proxy_loss
from tvr.models.heads.base import ParamRule, RetrievalHead
from tvr.models.heads.common import check_frames, check_pairs, mean_pooled_video
from tvr.models.heads.registry import register_head
from tvr.types import Sliceable, TextFeatures, VideoFeatures

DASHES = ("theta", "linear")
#: intended = the proxy module on its own peak lr (``proxy_lr``) and the run's schedule; reference = the released
#: code's optimizer-group bug (spec §4.4), for parity runs
LR_GROUPS = ("intended", "reference")
#: auto = the factorised scorer where it is exact (no active dropout), else the block path; fast = factorised only
#: (an error in training mode with dropout); block = ProxyGenerator.forward on blocks (reference-style)
SCORERS = ("auto", "fast", "block")
#: pairs per block of the factorised scorer ([P, D] and [P, ffn_dim] temporaries): big enough for efficient FFN
#: GEMMs, small enough to stay in cache
PAIR_BLOCK = 2048
#: the same on an accelerator, where small blocks would leave the device idle between kernel launches
PAIR_BLOCK_ACCELERATOR = 32768
#: texts per block on the factorised grid path (the block holds PAIR_BLOCK // this many videos)
GRID_TEXTS = 32
#: videos whose per-video state (keys, values: 2·layers·heads·M·D floats each) is built at once
VIDEO_FOLD_CHUNK = 256
#: the reference-style block path's block (spec §4.5: gathered 2 × 64 texts × videos)
REFERENCE_BLOCK = 128
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
    #: for both, fixing the released DiDeMo/ActivityNet configs' shape error)
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
    #: intended (proxy module on proxy_lr with the run's schedule) | reference (the released code's group bug:
    #: proxy weights at the backbone's peak lr and schedule, every no-decay parameter at a constant lr; spec §4.4)
    lr_groups: str = choice("intended", *LR_GROUPS)
    #: auto | fast | block: the test-time pairwise scorer (auto = factorised wherever it is exact)
    scorer: str = choice("auto", *SCORERS)

    def validate(self) -> None:
        if self.delta == 0.0 and self.eta == 0.0:
            raise ValueError("delta = 0 and eta = 0: the director δ·t − η·l would be zero; set either to non-zero")
        if not (math.isfinite(self.delta) and math.isfinite(self.eta)):
            raise ValueError(f"delta = {self.delta!r}, eta = {self.eta!r}: expected finite numbers")
        if self.gamma_max / self.gamma_step > 1000:
            raise ValueError(f"gamma_step = {self.gamma_step!r}: more than 1000 γ candidates up to gamma_max "
                             f"{self.gamma_max!r}; use a coarser step")

    def gamma_grid(self) -> list[float]:
        """0, step, 2·step, … up to gamma_max (inclusive, up to rounding)."""
        count = int(math.floor(self.gamma_max / self.gamma_step + 1e-9))
        return [round(k * self.gamma_step, 10) for k in range(count + 1)]


# --------------------------------------------------------------------------------------------- the generator


class ProxyDecoderLayer(nn.Module):
    """One direction-leader round: the released code's post-LN-style decoder layer (see the module docstring)."""

    def __init__(self, dim: int, heads: int, ffn_dim: int, dropout: float) -> None:
        super().__init__()
        if dim % heads:
            raise ValueError(f"head.options.heads = {heads}: must divide the feature dimension {dim}")
        self.dim, self.heads = dim, heads
        self.norm1 = nn.LayerNorm(dim)  # query
        self.norm2 = nn.LayerNorm(dim)  # memory (the video proxies)
        self.q_proj = nn.Linear(dim, dim)
        self.k_proj = nn.Linear(dim, dim)
        self.v_proj = nn.Linear(dim, dim)
        self.out_proj = nn.Linear(dim, dim)
        self.norm3 = nn.LayerNorm(dim)  # after attention
        self.linear1 = nn.Linear(dim, ffn_dim)
        self.linear2 = nn.Linear(ffn_dim, dim)
        self.norm4 = nn.LayerNorm(dim)  # after the FFN
        self.dropout = nn.Dropout(dropout)
        self.reset_attention()

    @torch.no_grad()
    def reset_attention(self) -> None:
        """nn.MultiheadAttention's initialisation (the released code's module): Xavier-uniform over the packed
        [3D, D] in-projection, zero in/out biases; the out projection keeps nn.Linear's default weight."""
        bound = math.sqrt(6.0 / (self.dim + 3 * self.dim))
        for proj in (self.q_proj, self.k_proj, self.v_proj):
            proj.weight.uniform_(-bound, bound)
            proj.bias.zero_()
        self.out_proj.bias.zero_()

    def forward(self, x: Tensor, memory: Tensor) -> Tensor:
        """x [N_t, N_v, D] (one query per pair), memory [N_v, M, D] → [N_t, N_v, D]."""
        n_t, n_v, dim = x.shape
        h, e = self.heads, dim // self.heads
        x = self.norm1(x)
        m = self.norm2(memory)
        q = self.q_proj(x).view(n_t, n_v, h, e)
        k = self.k_proj(m).view(n_v, -1, h, e)
        v = self.v_proj(m).view(n_v, -1, h, e)
        weights = torch.einsum("tvhe,vmhe->tvhm", q, k).mul(1.0 / math.sqrt(e)).softmax(dim=-1)
        attended = torch.einsum("tvhm,vmhe->tvhe", self.dropout(weights), v).reshape(n_t, n_v, dim)
        x = self.norm3(x + self.dropout(self.out_proj(attended)))
        x = x + self.dropout(self.linear2(self.dropout(F.relu(self.linear1(x)))))
        return self.norm4(x)


class ProxyGenerator(nn.Module):
    """Text proxy generator (spec §4.2): direction leader → director → dash → t^p_ij = t_i + dash·d̂_ij.

    ``forward(text [N_t, D], proxies [N_v, M, D]) -> [N_t, N_v, D]``; ``text`` is unit-norm in the head.
    """

    def __init__(
        self,
        dim: int,
        *,
        layers: int = 2,
        heads: int = 1,
        ffn_dim: int = 512,
        dash: str = "theta",
        num_proxies: int = 4,
        delta: float = 1.0,
        eta: float = 1.0,
        dropout: float = 0.1,
    ) -> None:
        super().__init__()
        if dash not in DASHES:
            raise ValueError(f"head.options.dash = {dash!r}: expected one of {list(DASHES)}")
        for name, value in (("dim", dim), ("layers", layers), ("heads", heads), ("ffn_dim", ffn_dim),
                            ("num_proxies", num_proxies)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"ProxyGenerator: {name} = {value!r}, expected a positive integer")
        self.dim, self.dash, self.num_proxies = dim, dash, num_proxies
        self.delta, self.eta = float(delta), float(eta)
        self.layers = nn.ModuleList(ProxyDecoderLayer(dim, heads, ffn_dim, dropout) for _ in range(layers))
        self.final_norm = nn.LayerNorm(dim)
        if dash == "theta":
            # the released code's torch.rand(1): a learnable scalar θ ~ U(0, 1)
            self.theta = nn.Parameter(torch.rand(()))
        else:
            # nn.Linear's default init, as released (W ∈ R^{D×M}, bias on)
            self.dash_proj = nn.Linear(num_proxies, dim)

    @property
    def dropout_active(self) -> bool:
        return self.training and any(layer.dropout.p > 0 for layer in self.layers)

    def check_inputs(self, text: Tensor, proxies: Tensor) -> None:
        if text.ndim != 2 or text.shape[1] != self.dim:
            raise ValueError(f"ProxyGenerator: text must be [N_t, {self.dim}], got {tuple(text.shape)}")
        if proxies.ndim != 3 or proxies.shape[2] != self.dim:
            raise ValueError(f"ProxyGenerator: proxies must be [N_v, M, {self.dim}], got {tuple(proxies.shape)}")
        if proxies.shape[1] != self.num_proxies:
            raise ValueError(
                f"ProxyGenerator: the videos carry M = {proxies.shape[1]} proxies but head.options.num_proxies = "
                f"{self.num_proxies}; set it to model.clipvip.num_proxies"
            )

    def dash_similarities(self, text: Tensor, proxies: Tensor) -> Tensor:
        """S_ijm = cos(t_i, X̃_jm): [N_t, N_v, M]."""
        return torch.einsum("td,vmd->tvm", F.normalize(text, dim=-1, eps=_EPS), F.normalize(proxies, dim=-1, eps=_EPS))

    def leader(self, text: Tensor, proxies: Tensor) -> Tensor:
        """The direction leader l_ij after ``layers`` rounds and the final LayerNorm: [N_t, N_v, D]."""
        x = text[:, None, :].expand(text.shape[0], proxies.shape[0], self.dim)
        for layer in self.layers:
            x = layer(x, proxies)
        return self.final_norm(x)

    def forward(self, text: Tensor, proxies: Tensor) -> Tensor:
        """t^p_ij for every text i and video j: [N_t, N_v, D]."""
        self.check_inputs(text, proxies)
        leader = self.leader(text, proxies)
        direction = F.normalize(self.delta * text[:, None, :] - self.eta * leader, dim=-1, eps=_EPS)
        sims = self.dash_similarities(text, proxies)
        if self.dash == "theta":
            dash = torch.exp(self.theta * sims.mean(dim=-1)).unsqueeze(-1)
        else:
            dash = torch.exp(self.dash_proj(sims))
        return text[:, None, :] + dash * direction


# --------------------------------------------------------------------------------------------- factorised scoring


@dataclasses.dataclass
class _VideoFold(Sliceable):
    video: Tensor  # [N_v, D]
    video_sq: Tensor  # [N_v] ‖v_j‖²
    proxies: Tensor  # [N_v, M, D] normalised (the dash's S)
    keys: Tensor  # [N_v, layers, h·M, D]
    key_bias: Tensor  # [N_v, layers, h·M]
    values: Tensor  # [N_v, layers, h·M, D]


def _fold_videos(gen: ProxyGenerator, video: Tensor, proxies: Tensor) -> _VideoFold:
    keys, key_bias, values = [], [], []
    for layer in gen.layers:
        n_v, m_count, dim = proxies.shape
        h, e = layer.heads, dim // layer.heads
        mem = F.layer_norm(proxies, (dim,), layer.norm2.weight, layer.norm2.bias, layer.norm2.eps)
        k = layer.k_proj(mem).view(n_v, m_count, h, e)
        v = layer.v_proj(mem).view(n_v, m_count, h, e)
        scale = 1.0 / math.sqrt(e)
        wq = layer.q_proj.weight.view(h, e, dim)
        keys.append(torch.einsum("nmhe,hed->nhmd", k, wq).reshape(n_v, h * m_count, dim) * scale)
        key_bias.append(torch.einsum("nmhe,he->nhm", k, layer.q_proj.bias.view(h, e)).reshape(n_v, -1) * scale)
        wo = layer.out_proj.weight.view(dim, h, e)
        folded = torch.einsum("nmhe,dhe->nhmd", v, wo) + layer.out_proj.bias / h
        values.append(folded.reshape(n_v, h * m_count, dim))
    return _VideoFold(
        video=video,
        video_sq=video.square().sum(-1),
        proxies=F.normalize(proxies, dim=-1, eps=_EPS),
        keys=torch.stack(keys, dim=1),
        key_bias=torch.stack(key_bias, dim=1),
        values=torch.stack(values, dim=1),
    )


@dataclasses.dataclass
class _TextFold(Sliceable):
    text: Tensor  # [N_t, D]
    text_sq: Tensor  # [N_t] ‖t_i‖²
    text_unit: Tensor  # [N_t, D]
    query: Tensor  # [N_t, D] LN1 of round 1 applied to t_i (round 1's query and residual are per text)


def _fold_texts(gen: ProxyGenerator, text: Tensor) -> _TextFold:
    norm1 = gen.layers[0].norm1
    return _TextFold(
        text=text,
        text_sq=text.square().sum(-1),
        text_unit=F.normalize(text, dim=-1, eps=_EPS),
        query=F.layer_norm(text, (gen.dim,), norm1.weight, norm1.bias, norm1.eps),
    )


@dataclasses.dataclass
class _FfnFold:
    """LN3's bias with b2 added and b1' = b1 − W1 b2: then z = y' + W2 ReLU(W1 y' + b1') with y' = LN3(x) + b2
    equals LN3(x) + FFN(LN3(x)), saving the separate "+ b2" pass over the block."""

    norm3_bias: Tensor
    bias1: Tensor
    w1_t: Tensor
    w2_t: Tensor


def _fold_ffn(gen: ProxyGenerator) -> list[_FfnFold]:
    out = []
    for layer in gen.layers:
        b2 = layer.linear2.bias
        out.append(_FfnFold(layer.norm3.bias + b2, layer.linear1.bias - layer.linear1.weight @ b2,
                            layer.linear1.weight.t(), layer.linear2.weight.t()))
    return out


def _attend(logits: Tensor, heads: int, residual: Tensor, values: Tensor, in_place: bool) -> Tensor:
    """residual + Σ_h Σ_m softmax_m(logits)_hm · values_hm: logits [B, n, h·M], values [B, h·M, D]. ``in_place``
    accumulates into ``residual`` (a block-sized tensor the caller owns), saving a copy of the block."""
    b, n, hm = logits.shape
    weights = logits.reshape(b, n, heads, hm // heads).softmax(dim=-1).reshape(b, n, hm)
    if in_place:
        return residual.baddbmm_(weights, values)
    return torch.baddbmm(residual, weights, values)


def _ffn_round(x: Tensor, layer: ProxyDecoderLayer, ffn: _FfnFold) -> Tensor:
    """LN4(y + FFN(y)), y = LN3(x), on a [P, D] block (no dropout: eval only)."""
    dim = x.shape[-1]
    y = F.layer_norm(x, (dim,), layer.norm3.weight, ffn.norm3_bias, layer.norm3.eps)
    hidden = torch.addmm(ffn.bias1, y, ffn.w1_t).relu_()
    z = y.addmm_(hidden, ffn.w2_t)  # y is ours: accumulate in place rather than copy the block
    return F.layer_norm(z, (dim,), layer.norm4.weight, layer.norm4.bias, layer.norm4.eps)


def _proxy_cos_block(gen: ProxyGenerator, ffns: list[_FfnFold], tf: _TextFold, vf: _VideoFold, grid: bool) -> Tensor:
    """cos(t^p_ij, v_j) on one block, laid out [B, n] with one video per row b.

    ``grid``: every text of ``tf`` (n of them) with every video of ``vf`` (B); otherwise pair p = (tf[p], vf[p])
    (B = P, n = 1)."""
    b_count, dim = len(vf), gen.dim
    if grid:
        n = len(tf)
        t3, tsq, query = tf.text[None], tf.text_sq[None], tf.query[None]  # [1, n, ·]
    else:
        n = 1
        t3, tsq, query = tf.text[:, None], tf.text_sq[:, None], tf.query[:, None]  # [P, 1, ·]
    x = None
    for index, (layer, ffn) in enumerate(zip(gen.layers, ffns, strict=True)):
        keys, key_bias, values = vf.keys[:, index], vf.key_bias[:, index], vf.values[:, index]
        if index == 0:
            if grid:  # round 1's query is per text: one GEMM for the whole block
                logits = (keys.reshape(-1, dim) @ tf.query.t()).view(b_count, -1, n).transpose(1, 2)
                logits = logits + key_bias[:, None, :]
            else:
                logits = torch.baddbmm(key_bias[:, None, :], query, keys.transpose(1, 2))
            x = _attend(logits, layer.heads, query, values, in_place=False)  # query is per text: broadcast
        else:
            x = F.layer_norm(x, (dim,), layer.norm1.weight, layer.norm1.bias, layer.norm1.eps).view(b_count, n, dim)
            logits = torch.baddbmm(key_bias[:, None, :], x, keys.transpose(1, 2))
            x = _attend(logits, layer.heads, x, values, in_place=True)
        x = _ffn_round(x.view(-1, dim), layer, ffn)
    norm = gen.final_norm
    leader = F.layer_norm(x, (dim,), norm.weight, norm.bias, norm.eps).view(b_count, n, dim)

    video = vf.video
    if grid:
        tv = (video @ tf.text.t())  # [B, n]
        sims = (vf.proxies.reshape(-1, dim) @ tf.text_unit.t()).view(b_count, -1, n).transpose(1, 2)  # [B, n, M]
    else:
        tv = (video * tf.text).sum(-1, keepdim=True)
        sims = torch.bmm(tf.text_unit[:, None], vf.proxies.transpose(1, 2))
    delta, eta = gen.delta, gen.eta
    if gen.dash == "theta":
        # only three reductions of the leader are needed: l·v, l·t and ‖l‖²
        lv = torch.bmm(leader, video[:, :, None]).squeeze(-1)
        lt = (leader * t3).sum(-1)
        ll = torch.linalg.vector_norm(leader, dim=-1).square()
        dv = delta * tv - eta * lv
        dt = delta * tsq - eta * lt
        dd = (delta * delta) * tsq - (2.0 * delta * eta) * lt + (eta * eta) * ll
        scale = torch.exp(gen.theta * sims.mean(dim=-1)) / dd.clamp_min(0.0).sqrt().clamp_min(_EPS)
        numerator = tv + scale * dv
        proxy_sq = tsq + 2.0 * scale * dt + scale.square() * dd
    else:
        direction = leader.mul_(-eta).add_(t3, alpha=delta)  # d = δt − ηl, in place of the leader
        d_norm = torch.linalg.vector_norm(direction, dim=-1).clamp_min(_EPS)
        dash = torch.addmm(gen.dash_proj.bias, sims.reshape(-1, sims.shape[-1]), gen.dash_proj.weight.t())
        step = dash.exp_().view(b_count, n, dim).mul_(direction)  # d_s ⊙ d
        sv = torch.bmm(step, video[:, :, None]).squeeze(-1)
        st = (step * t3).sum(-1)
        ss = torch.linalg.vector_norm(step, dim=-1).square()
        numerator = tv + sv / d_norm
        proxy_sq = tsq + 2.0 * st / d_norm + ss / d_norm.square()
    denominator = proxy_sq.clamp_min(0.0).sqrt().clamp_min(_EPS) * vf.video_sq.sqrt().clamp_min(_EPS)[:, None]
    return numerator / denominator


def _check_scoring_inputs(gen: ProxyGenerator, text: Tensor, video: Tensor, proxies: Tensor) -> None:
    gen.check_inputs(text, proxies)
    if video.ndim != 2 or video.shape != (proxies.shape[0], gen.dim):
        raise ValueError(f"video must be [N_v, {gen.dim}] with one row per proxies row, got {tuple(video.shape)} "
                         f"and proxies {tuple(proxies.shape)}")


def _weights_dtype(gen: ProxyGenerator) -> torch.dtype:
    return gen.final_norm.weight.dtype


def _pair_block(like: Tensor) -> int:
    return PAIR_BLOCK if like.device.type == "cpu" else PAIR_BLOCK_ACCELERATOR


def _use_fast(gen: ProxyGenerator, method: str) -> bool:
    if method not in SCORERS:
        raise ValueError(f"proxy scorer method {method!r}: expected one of {list(SCORERS)}")
    if method == "block":
        return False
    if gen.dropout_active:
        if method == "fast":
            raise RuntimeError("the factorised proxy scorer is exact only without dropout: call generator.eval() "
                               "(or use method='block' / head.options.scorer=block in training mode)")
        return False  # training mode with dropout: the block path runs the generator itself
    return True


@torch.no_grad()
def proxy_scores(
    generator: ProxyGenerator,
    text: Tensor,
    video: Tensor,
    proxies: Tensor,
    *,
    method: str = "auto",
    video_chunk: int | None = None,
) -> Tensor:
    """S^p_ij = cos(t^p_ij, v_j) for every text i and video j: [N_t, N_v] (float of the generator's dtype).

    ``method``: auto (factorised wherever it is exact), fast (factorised; refuses active dropout), block
    (:meth:`ProxyGenerator.forward` on 128 × 128 blocks, the reference's way). ``video_chunk`` bounds how many
    videos' folded state is held at once (default VIDEO_FOLD_CHUNK)."""
    _check_scoring_inputs(generator, text, video, proxies)
    n_t, n_v = text.shape[0], video.shape[0]
    dtype = _weights_dtype(generator)
    text, video, proxies = text.to(dtype), video.to(dtype), proxies.to(dtype)
    out = torch.empty(n_t, n_v, dtype=dtype, device=text.device)
    if not _use_fast(generator, method):
        step = REFERENCE_BLOCK
        for a in range(0, n_t, step):
            for b in range(0, n_v, step):
                tp = generator(text[a : a + step], proxies[b : b + step])
                v = F.normalize(video[b : b + step], dim=-1, eps=_EPS)
                out[a : a + step, b : b + step] = torch.einsum("tvd,vd->tv", F.normalize(tp, dim=-1, eps=_EPS), v)
        return out
    ffns = _fold_ffn(generator)
    tf = _fold_texts(generator, text)
    texts_per_block = max(1, min(GRID_TEXTS, n_t))
    videos_per_block = max(1, _pair_block(text) // texts_per_block)
    fold_chunk = max(videos_per_block, int(video_chunk or VIDEO_FOLD_CHUNK))
    for c in range(0, n_v, fold_chunk):
        vf = _fold_videos(generator, video[c : c + fold_chunk], proxies[c : c + fold_chunk])
        for b in range(0, len(vf), videos_per_block):
            vb = vf[b : b + videos_per_block]
            for a in range(0, n_t, texts_per_block):
                block = _proxy_cos_block(generator, ffns, tf[a : a + texts_per_block], vb, grid=True)
                out[a : a + texts_per_block, c + b : c + b + len(vb)] = block.t()
    return out


@torch.no_grad()
def proxy_pair_scores(
    generator: ProxyGenerator,
    text: Tensor,
    video: Tensor,
    proxies: Tensor,
    text_index: Tensor,
    video_index: Tensor,
    *,
    method: str = "auto",
) -> Tensor:
    """cos(t^p_ij, v_j) of the pairs (text_index[p], video_index[p]) only: [P] (for two-stage reranking).

    Each named video's state is folded once; pairs then run in blocks of at most PAIR_BLOCK // 2 with their
    video's state gathered."""
    _check_scoring_inputs(generator, text, video, proxies)
    text_index, video_index = check_pairs(text_index, video_index, text.shape[0], video.shape[0])
    dtype = _weights_dtype(generator)
    out = torch.empty(text_index.shape[0], dtype=dtype, device=text.device)
    if text_index.numel() == 0:
        return out
    text, video, proxies = text.to(dtype), video.to(dtype), proxies.to(dtype)
    if not _use_fast(generator, method):
        # the generator itself, one text at a time against the videos its pairs name
        for i in torch.unique(text_index).tolist():
            sel = (text_index == i).nonzero().squeeze(1)
            vi = video_index[sel].to(text.device)
            for b in range(0, vi.numel(), REFERENCE_BLOCK):
                part = vi[b : b + REFERENCE_BLOCK]
                tp = F.normalize(generator(text[i : i + 1], proxies[part])[0], dim=-1, eps=_EPS)
                v = F.normalize(video[part], dim=-1, eps=_EPS)
                out[sel[b : b + REFERENCE_BLOCK].to(text.device)] = (tp * v).sum(-1)
        return out
    ffns = _fold_ffn(generator)
    videos, inverse = torch.unique(video_index, return_inverse=True)
    device = text.device
    step = max(1, _pair_block(text) // 2)
    # fold the named videos chunk by chunk; pairs are sorted by video so each chunk serves a contiguous run
    order = torch.argsort(inverse, stable=True)
    sorted_inv = inverse[order]
    for c in range(0, videos.numel(), VIDEO_FOLD_CHUNK):
        chunk = videos[c : c + VIDEO_FOLD_CHUNK].to(device)
        vf = _fold_videos(generator, video[chunk], proxies[chunk])
        lo = int(torch.searchsorted(sorted_inv, torch.tensor(c)))
        hi = int(torch.searchsorted(sorted_inv, torch.tensor(c + chunk.numel())))
        for p in range(lo, hi, step):
            sel = order[p : min(hi, p + step)]
            tf = _fold_texts(generator, text[text_index[sel].to(device)])
            vb = vf[(inverse[sel] - c).to(device)]
            out[sel.to(device)] = _proxy_cos_block(generator, ffns, tf, vb, grid=False)[:, 0]
    return out


@torch.no_grad()
def proxy_pairwise_scores(
    generator: ProxyGenerator,
    text: Tensor,
    video: Tensor,
    proxies: Tensor,
    gamma: float,
    *,
    method: str = "auto",
    text_chunk: int | None = None,
    video_chunk: int | None = None,
) -> Tensor:
    """s_ij = cos(t_i, v_j) + γ·cos(t^p_ij, v_j) for every text i and video j: [N_t, N_v], exact (spec §4.5).

    ``text`` [N_t, D] and ``video`` [N_v, D] are unit-norm; ``proxies`` [N_v, M, D]. Scored in blocks (memory
    bounded by the block, never N_t × N_v × D); each pair uses its own proxy t^p_ij, so a pair's score does not
    depend on the other texts or videos. γ = 0 skips the generator: the CLIP-ViP baseline score.
    ``text_chunk`` / ``video_chunk`` bound the texts per call of the proxy scorer and the videos whose state is
    folded at once; ``method`` as in :func:`proxy_scores`."""
    _check_scoring_inputs(generator, text, video, proxies)
    regular = text @ video.t()  # = cos(t_i, v_j) for the unit-norm inputs (bit-equal to the baseline head)
    if float(gamma) == 0.0:
        return regular
    n_t = text.shape[0]
    step = int(text_chunk or max(1, n_t))
    parts = [proxy_scores(generator, text[a : a + step], video, proxies, method=method, video_chunk=video_chunk)
             for a in range(0, n_t, step)]
    proxy = torch.cat(parts, dim=0) if parts else regular.new_zeros(0, video.shape[0])
    return regular + float(gamma) * proxy.to(regular.dtype)


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
    indexable = False
    requires = frozenset({"proxies"})
    default_text_chunk = 1 << 30  # the factorised scorer tiles internally

    def build(self) -> None:
        opts, dim = self.options, self.dim
        if dim % opts.heads:
            raise ValueError(f"head.options.heads = {opts.heads}: must divide the feature dimension {dim}")
        self.generator = ProxyGenerator(
            dim, layers=opts.layers, heads=opts.heads, ffn_dim=opts.ffn_dim, dash=opts.dash,
            num_proxies=opts.num_proxies, delta=opts.delta, eta=opts.eta, dropout=opts.dropout,
        )
        # γ travels with the checkpoint; float64 so the stored value is exactly the chosen candidate
        self.register_buffer("gamma", torch.tensor(float(opts.gamma), dtype=torch.float64))

    def extra_repr(self) -> str:
        o = self.options
        return (f"dash={o.dash!r}, layers={o.layers}, M={o.num_proxies}, delta={o.delta}, eta={o.eta}, "
                f"gamma={self.gamma_value}")

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
                "and model.clipvip.proxy_projection=true"
            )
        frames, mask = video.frames.float(), video.frame_mask.float()
        check_frames(frames, mask)
        # CLIP-ViP gives one slot (the projected first proxy); several frames are mean-pooled as clip4clip does
        return ProxyVideoState(mean_pooled_video(frames, mask), video.proxies.float())

    # ------------------------------------------------------------------ scoring
    def _method(self) -> str:
        return self.options.scorer

    def score_block(self, text_state: ProxyTextState, video_state: ProxyVideoState) -> Tensor:
        return proxy_pairwise_scores(self.generator, text_state.emb, video_state.emb, video_state.proxies,
                                     self.gamma_value, method=self._method())

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
        return proxy_pairwise_scores(self.generator, text_state.emb, video_state.emb, video_state.proxies,
                                     self.gamma_value, method=self._method(), text_chunk=text_chunk,
                                     video_chunk=video_chunk).float()

    @torch.no_grad()
    def score_pairs(
        self, text_state: ProxyTextState, video_state: ProxyVideoState, text_index: Tensor, video_index: Tensor
    ) -> Tensor:
        """Exact scores of given pairs; the proxy term folds only the named videos (no grid per text group)."""
        if not _use_fast(self.generator, self._method()):
            return super().score_pairs(text_state, video_state, text_index, video_index)
        text_index, video_index = check_pairs(text_index, video_index, len(text_state), len(video_state))
        t = text_state.emb[text_index.to(text_state.emb.device)]
        v = video_state.emb[video_index.to(video_state.emb.device)]
        regular = (t * v).sum(-1).float().cpu()
        if self.gamma_value == 0.0:
            return regular
        proxy = proxy_pair_scores(self.generator, text_state.emb, video_state.emb, video_state.proxies, text_index,
                                  video_index, method=self._method())
        return regular + self.gamma_value * proxy.float().cpu()

    @torch.no_grad()
    def reference_pair_scores(self, text: TextFeatures, video: VideoFeatures) -> Tensor:
        """Spec §4.5 for each aligned pair, one at a time: cos(t, v) + γ·cos(t^p, v) with t^p from
        :meth:`ProxyGenerator.forward` on that one pair (no factorisation)."""
        dtype = _weights_dtype(self.generator)
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
    ) -> dict[str, Tensor]:
        """S^r = cos(t_i, v_j) and S^p = cos(t^p_ij, v_j), each computed once: every γ is S^r + γ·S^p."""
        regular = (text_state.emb @ video_state.emb.t()).float()
        step = int(text_chunk or max(1, len(text_state)))
        parts = [proxy_scores(self.generator, text_state.emb[a : a + step], video_state.emb, video_state.proxies,
                              method=self._method(), video_chunk=video_chunk).float()
                 for a in range(0, len(text_state), step)]
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
        # the released code's groups: its scheduler rewrites only the first four groups with the CLIP schedule,
        # so the proxy weights (decay group) run at the CLIP peak lr and schedule, and every no-decay group (the
        # proxy module's and CLIP's, logit scale included) keeps its initial lr for the whole run
        return [
            ParamRule("head.generator.", "proxy", lr=backbone_lr, applies_to="decay"),
            ParamRule("head.generator.", "proxy-constant", lr=proxy_lr, schedule="constant", applies_to="nodecay"),
            ParamRule("head.logit_scale", "logit-scale-constant", lr=backbone_lr, schedule="constant"),
            ParamRule("backbone.", "backbone-constant", lr=backbone_lr, schedule="constant", applies_to="nodecay"),
        ]

    # ------------------------------------------------------------------ training
    def loss(self, text: TextFeatures, video: VideoFeatures) -> dict[str, Tensor]:
        """text_proxy_loss on the B×B batch (spec §4.3): S^r, S^p over all B×B pairs (each video with its own
        proxy t^p_ij) and S^pos_ik = cos(t^p_ii, v_k)."""
        ts, vs = self.encode_texts(text), self.encode_videos(video)
        if len(ts) != len(vs):
            raise ValueError(f"TV-ProxyNet loss needs aligned pairs, got {len(ts)} texts and {len(vs)} videos")
        t, v = ts.emb, vs.emb
        sim_r = t @ v.t()
        proxy = F.normalize(self.generator(t, vs.proxies), dim=-1, eps=_EPS)  # [B, B, D]
        sim_p = torch.einsum("ijd,jd->ij", proxy, v)
        positive = proxy.diagonal(dim1=0, dim2=1).t()  # t^p_ii: [B, D]
        sim_pos = positive @ v.t()
        opts = self.options
        loss = text_proxy_loss(sim_r, sim_p, sim_pos, self.logit_scale, alpha=opts.alpha, beta=opts.beta)
        scale = self.logit_scale.exp().detach()
        with torch.no_grad():
            parts = {name: symmetric_infonce(scale * sim) for name, sim in
                     (("regular", sim_r), ("proxy", sim_p), ("positive", sim_pos))}
        return {"loss": loss, **parts, "logit_scale": scale}


def _gamma_of(setting: dict[str, Any]) -> float:
    value = setting.get("gamma") if isinstance(setting, dict) else None
    if set(setting or {}) != {"gamma"} or isinstance(value, bool) or not isinstance(value, (int, float)) \
            or not math.isfinite(value) or value < 0:
        raise ValueError(f"TV-ProxyNet inference setting {setting!r}: expected {{'gamma': a number >= 0}}")
    return float(value)
