"""TV-ProxyNet's exact test-time scorers (spec §4.5): cos(t^p_ij, v_j) for all pairs, given pairs, and the
combined score s_ij = cos(t_i, v_j) + γ·cos(t^p_ij, v_j).

Scoring is exact and factorised. In eval mode (no dropout) the only per-pair work that cannot be hoisted is the FFN
of every round; everything else is per text or per video:

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

import torch
import torch.nn.functional as F
from torch import Tensor

from tvr.methods.proxy.generator import ProxyDecoderLayer, ProxyGenerator
from tvr.models.heads.common import check_pairs
from tvr.types import Sliceable

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
        out.append(
            _FfnFold(
                layer.norm3.bias + b2,
                layer.linear1.bias - layer.linear1.weight @ b2,
                layer.linear1.weight.t(),
                layer.linear2.weight.t(),
            )
        )
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
        tv = video @ tf.text.t()  # [B, n]
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
        raise ValueError(
            f"video must be [N_v, {gen.dim}] with one row per proxies row, got {tuple(video.shape)} "
            f"and proxies {tuple(proxies.shape)}"
        )


def weights_dtype(gen: ProxyGenerator) -> torch.dtype:
    return gen.final_norm.weight.dtype


def _pair_block(like: Tensor) -> int:
    return PAIR_BLOCK if like.device.type == "cpu" else PAIR_BLOCK_ACCELERATOR


def use_fast(gen: ProxyGenerator, method: str) -> bool:
    if method not in SCORERS:
        raise ValueError(f"proxy scorer method {method!r}: expected one of {list(SCORERS)}")
    if method == "block":
        return False
    if gen.dropout_active:
        if method == "fast":
            raise RuntimeError(
                "the factorised proxy scorer is exact only without dropout: call generator.eval() "
                "(or use method='block' / head.options.scorer=block in training mode)"
            )
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
    dtype = weights_dtype(generator)
    text, video, proxies = text.to(dtype), video.to(dtype), proxies.to(dtype)
    out = torch.empty(n_t, n_v, dtype=dtype, device=text.device)
    if not use_fast(generator, method):
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
    dtype = weights_dtype(generator)
    out = torch.empty(text_index.shape[0], dtype=dtype, device=text.device)
    if text_index.numel() == 0:
        return out
    text, video, proxies = text.to(dtype), video.to(dtype), proxies.to(dtype)
    if not use_fast(generator, method):
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
    parts = [
        proxy_scores(generator, text[a : a + step], video, proxies, method=method, video_chunk=video_chunk)
        for a in range(0, n_t, step)
    ]
    proxy = torch.cat(parts, dim=0) if parts else regular.new_zeros(0, video.shape[0])
    return regular + float(gamma) * proxy.to(regular.dtype)


@dataclasses.dataclass
class ProxyRerankState(_VideoFold):
    """What a search index stores per video for the exact score: the unit-norm video feature and every round's
    folded keys and values (the per-video part of the proxy term, ≈ layers·3·M·D² multiply-adds), built once."""


@torch.no_grad()
def proxy_rerank_state(generator: ProxyGenerator, video: Tensor, proxies: Tensor) -> ProxyRerankState:
    """Fold videos ([N_v, D] unit-norm features and [N_v, M, D] proxies) for :func:`proxy_rerank_scores`."""
    dtype = weights_dtype(generator)
    fold = _fold_videos(generator, video.to(dtype), proxies.to(dtype))
    return ProxyRerankState(**{f.name: getattr(fold, f.name) for f in dataclasses.fields(fold)})


@torch.no_grad()
def proxy_rerank_scores(generator: ProxyGenerator, text: Tensor, state: ProxyRerankState, gamma: float) -> Tensor:
    """s_ij = cos(t_i, v_j) + γ·cos(t^p_ij, v_j) of every text against every folded video: [N_t, N_v] float32."""
    dtype = weights_dtype(generator)
    text = text.to(dtype)
    state = state.to(text.device, dtype)
    regular = text @ state.video.t()
    if gamma == 0.0:
        return regular.float()
    ffns, tf = _fold_ffn(generator), _fold_texts(generator, text)
    step = max(1, _pair_block(text) // max(1, len(text)))
    proxy = torch.cat(
        [_proxy_cos_block(generator, ffns, tf, state[b : b + step], grid=True).t() for b in range(0, len(state), step)],
        dim=1,
    )
    return (regular + gamma * proxy).float()
