"""ψ folded into the matrices the factorised GARE scorer needs (spec §3.3a), and its per-owner/per-pair algebra.

In eval mode ψ is linear between its three LayerNorms and its softmax, and LN(x) = g ⊙ Cx/σ(x) + b with C the
centring map and σ(x)² = ‖Cx‖²/D + eps. :func:`psi_algebra` folds ψ's weights once (cached per ψ and parameter
version) so that, for the side that owns the context (a video's frames, or a text's words),

    logits_f = (q M_q)·ℓ_f / (σ1 √D) + ℓ_f·u_β       ℓ_f = LN1(C_f)
    σ2² = aᵀ G2 a / D + eps2,   σ3² = (aᵀ G3 a / σ2² + 2 a·e3 / σ2 + ‖Cc‖²) / D + eps3
    ψ(q, C) = ρ Σ_f a_f w_f + ε e + d                  ρ = 1/(σ2 σ3), ε = 1/σ3

with per-owner Gram matrices (:func:`owner_state`) and O(F) work per pair (:func:`psi_pair`). Every step is an
exact identity; each LayerNorm's own eps enters where it belongs.
"""

from __future__ import annotations

import math
import weakref
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from tvr.methods.gare.psi import Psi

__all__ = [
    "Algebra",
    "Owner",
    "PsiPair",
    "Workspace",
    "buffer",
    "clear_cache",
    "covered_psi",
    "owner_state",
    "psi_algebra",
    "psi_pair",
]


@dataclass
class Algebra:
    """ψ's weights folded into the matrices the factorised scorer needs (all in row-vector convention)."""

    dim: int
    eps1: float
    eps2: float
    eps3: float
    g1: Tensor  # LN1 affine
    b1: Tensor
    mq: Tensor  # [D, D] M_q = C diag(g1) W_qᵀ W_k: numerator_f = (q M_q)·ℓ_f / σ1 (+ const over f)
    u_beta: Tensor  # [D] (W_q b1 + b_q)ᵀ W_k / √D: logit bias ℓ_f·u_β (+ const over f)
    #: [D, 3D + 4]: ℓ → [C ô | C z | w | C z·C c, w·e, w·d, ℓ·u_β], one GEMM per chunk of context items
    proj: Tensor
    proj_bias: Tensor  # [3D + 4]
    cc: Tensor  # C c, c = (I + W_1) b2 + b_1 (the constant part of LN3's input)
    e: Tensor  # W_μ diag(g3) C c
    d: Tensor  # W_μ b3 + b_μ
    nc: float  # ‖C c‖²
    ee: float
    ed: float
    dd: float
    #: matrices a scorer derives from the fold once and reuses (keyed by the scorer), dropped with the fold
    derived: dict[str, Tensor] = field(default_factory=dict, repr=False, compare=False)


_CACHE: weakref.WeakKeyDictionary[nn.Module, tuple[tuple, Algebra]] = weakref.WeakKeyDictionary()


def clear_cache() -> None:
    """Forget the folded ψ matrices (they are cached per ψ module and parameter version)."""
    _CACHE.clear()


def covered_psi(psi: nn.Module) -> str | None:
    """None when ψ has the structure the factorisation assumes, else why not."""
    if not isinstance(psi, Psi):
        return f"psi is a {type(psi).__name__}, not tvr.methods.gare.psi.Psi"
    if type(psi).forward is not Psi.forward or type(psi).attention_weights is not Psi.attention_weights:
        return f"{type(psi).__name__} overrides Psi.forward/attention_weights"
    for name in ("ln_in", "ln_attn", "ln_out"):
        ln = getattr(psi, name)
        if not isinstance(ln, nn.LayerNorm) or tuple(ln.normalized_shape) != (psi.dim,):
            return f"psi.{name} is not a LayerNorm over the last dimension"
    for name in ("q_proj", "k_proj", "v_proj", "out_proj", "linear", "delta_proj"):
        lin = getattr(psi, name)
        if not isinstance(lin, nn.Linear) or lin.in_features != psi.dim or lin.out_features != psi.dim:
            return f"psi.{name} is not a {psi.dim}→{psi.dim} Linear"
    return None


def psi_algebra(psi: Psi, dtype: torch.dtype, device: torch.device) -> Algebra:
    key = (dtype, device, tuple((p.data_ptr(), p._version) for p in psi.parameters()))
    hit = _CACHE.get(psi)
    if hit is not None and hit[0] == key:
        return hit[1]
    alg = _fold(psi, dtype, device)
    _CACHE[psi] = (key, alg)
    return alg


@torch.no_grad()
def _fold(psi: Psi, dtype: torch.dtype, device: torch.device) -> Algebra:
    # fold in the compute dtype: four D×D products (float64 folding was measured to change nothing at 1e-7)
    wd = dtype
    dim = psi.dim

    def ln(m: nn.LayerNorm) -> tuple[Tensor, Tensor, float]:
        g = m.weight if m.weight is not None else torch.ones(dim)
        b = m.bias if m.bias is not None else torch.zeros(dim)
        return g.detach().to(device, wd), b.detach().to(device, wd), float(m.eps)

    def lin(m: nn.Linear) -> tuple[Tensor, Tensor]:
        b = m.bias if m.bias is not None else torch.zeros(m.out_features)
        return m.weight.detach().to(device, wd), b.detach().to(device, wd)

    def centre(m: Tensor) -> Tensor:  # M C: remove each row's mean (C is the centring map, symmetric)
        return m - m.mean(dim=-1, keepdim=True)

    g1, b1, eps1 = ln(psi.ln_in)
    g2, b2, eps2 = ln(psi.ln_attn)
    g3, b3, eps3 = ln(psi.ln_out)
    wq, bq = lin(psi.q_proj)
    wk, bk = lin(psi.k_proj)
    wv, bv = lin(psi.v_proj)
    wo, bo = lin(psi.out_proj)
    w1, c1 = lin(psi.linear)
    wm, bm = lin(psi.delta_proj)
    root = math.sqrt(dim)

    # logit numerator (W_q LN1(q) + b_q)·(W_k ℓ + b_k) = (C q)ᵀ diag(g1) W_qᵀ W_k ℓ / σ1 + b̂_q·W_k ℓ + (const in f)
    mq = g1.unsqueeze(1) * (wq.T @ wk)
    mq = mq - mq.mean(dim=0, keepdim=True)  # C on the left
    u_beta = wk.T @ (wq @ b1 + bq) / root
    # values: ô = W_o (W_v ℓ + b_v) + b_o ; C ô ; z = (I + W_1) diag(g2) C ô ; w = W_μ diag(g3) C z
    a_o = centre(wv.T @ wo.T)
    c_o = centre(bv @ wo.T + bo)
    i_w1 = torch.eye(dim, dtype=wd, device=device) + w1
    a_z = centre((a_o * g2) @ i_w1.T)
    c_z = centre((c_o * g2) @ i_w1.T)
    a_w = (a_z * g3) @ wm.T
    c_w = (c_z * g3) @ wm.T
    cc = centre(b2 @ i_w1.T + c1)
    e = (cc * g3) @ wm.T
    d = b3 @ wm.T + bm

    def out(x: Tensor) -> Tensor:
        return x.to(dtype).contiguous()

    return Algebra(
        dim=dim,
        eps1=eps1,
        eps2=eps2,
        eps3=eps3,
        g1=out(g1),
        b1=out(b1),
        mq=out(mq),
        u_beta=out(u_beta),
        proj=out(
            torch.cat(
                [a_o, a_z, a_w, (a_z @ cc)[:, None], (a_w @ e)[:, None], (a_w @ d)[:, None], u_beta[:, None]], dim=1
            )
        ),
        proj_bias=out(
            torch.cat(
                [
                    c_o,
                    c_z,
                    c_w,
                    (c_z @ cc).view(1),
                    (c_w @ e).view(1),
                    (c_w @ d).view(1),
                    torch.zeros(1, dtype=wd, device=device),
                ]
            )
        ),
        cc=out(cc),
        e=out(e),
        d=out(d),
        nc=float(cc @ cc),
        ee=float(e @ e),
        ed=float(e @ d),
        dd=float(d @ d),
    )


class Workspace:
    """Named scratch buffers reused across chunks: large fresh allocations are page-faulted on first touch,
    which costs as much as the arithmetic on them. ``None`` in place of a workspace allocates normally."""

    def __init__(self) -> None:
        self._bufs: dict[str, Tensor] = {}

    def get(self, name: str, shape: tuple[int, ...], like: Tensor) -> Tensor:
        numel = math.prod(shape)
        buf = self._bufs.get(name)
        if buf is None or buf.numel() < numel or buf.dtype != like.dtype or buf.device != like.device:
            buf = torch.empty(numel, dtype=like.dtype, device=like.device)
            self._bufs[name] = buf
        return buf[:numel].view(shape)


def buffer(ws: Workspace | None, name: str, shape: tuple[int, ...], like: Tensor) -> Tensor | None:
    return ws.get(name, shape, like) if ws is not None else None


@dataclass
class Owner:
    """Per-item ψ state of the side that owns the context (video j for frames, text i for words)."""

    ell: Tensor  # [n, F, D] LN1 of every context item
    w: Tensor  # [n, F, D] w_f: Δ = ρ Σ_f a_f w_f + ε e + d (rows may be strided)
    beta: Tensor  # [n, F] logit bias ℓ_f·u_β, −inf on masked keys
    grams: Tensor  # [n, 3F + 3, F]: rows G2, G3, W Wᵀ, then e3ᵀ, (w·e)ᵀ, (w·d)ᵀ


def owner_state(alg: Algebra, ctx: Tensor, key_mask: Tensor | None, ws: Workspace | None = None) -> Owner:
    n, f, dim = ctx.shape
    ell = F.layer_norm(ctx, (dim,), alg.g1, alg.b1, alg.eps1)
    ell2 = ell.view(n * f, dim)
    width = alg.proj.shape[1]
    proj = torch.addmm(alg.proj_bias, ell2, alg.proj, out=buffer(ws, "proj", (n * f, width), ctx))
    p3 = proj.view(n, f, width)
    co, cz, w = p3[..., :dim], p3[..., dim : 2 * dim], p3[..., 2 * dim : 3 * dim]
    lin = p3[..., 3 * dim :].transpose(1, 2)  # [n, 4, F]: (Cz·Cc), (w·e), (w·d), β
    beta = lin[:, 3]
    if key_mask is not None:
        beta = beta.masked_fill(~key_mask, float("-inf"))
    grams = torch.cat(
        [
            torch.bmm(co, co.transpose(1, 2)),
            torch.bmm(cz, cz.transpose(1, 2)),
            torch.bmm(w, w.transpose(1, 2)),
            lin[:, :3],
        ],
        dim=1,
    )
    return Owner(ell, w, beta, grams)


@dataclass
class PsiPair:
    """Per-pair ψ quantities: attention weights and the scalars that define Δ_ij (all O(F) or O(1) per pair)."""

    a: Tensor  # attention weights [B, F, B']
    rows: Tensor  # grams-times-a [B, K, B'] (extra rows beyond the Δ ones are the caller's)
    rho: Tensor  # 1/(σ2 σ3)
    eps: Tensor  # 1/σ3
    n_dpsi: Tensor  # ‖ψ output‖²


def psi_pair(alg: Algebra, logits: Tensor, grams: Tensor, ws: Workspace | None = None) -> PsiPair:
    """From the attention logits [B, F, B'] and the owner's stacked Grams [B, K, F] to ρ, ε and ‖Δψ‖²."""
    b, f, b2 = logits.shape
    dim = alg.dim
    a = torch.softmax(logits, dim=1, out=buffer(ws, "a", logits.shape, logits))
    rows = torch.bmm(grams, a, out=buffer(ws, "rows", (b, grams.shape[1], b2), logits))
    prod = rows[:, : 3 * f].unflatten(1, (3, f))
    prod = torch.mul(prod, a.unsqueeze(1), out=prod if ws is not None else None)
    q2, q3, qww = prod.sum(2).unbind(1)
    ae3, awe, awd = rows[:, 3 * f], rows[:, 3 * f + 1], rows[:, 3 * f + 2]
    inv2 = (q2 / dim + alg.eps2).rsqrt_()
    inv3 = ((q3 * inv2 * inv2 + 2.0 * ae3 * inv2 + alg.nc) / dim + alg.eps3).rsqrt_()
    rho = inv2 * inv3
    # ‖Δψ‖² = ρ² aᵀWWᵀa + 2ρε a·(w·e) + 2ρ a·(w·d) + ε²‖e‖² + 2ε e·d + ‖d‖²
    n_dpsi = rho * (rho * qww + 2.0 * inv3 * awe + 2.0 * awd) + inv3 * (inv3 * alg.ee + 2.0 * alg.ed) + alg.dd
    return PsiPair(a, rows, rho, inv3, n_dpsi)
