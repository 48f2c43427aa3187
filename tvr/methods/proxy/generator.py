"""TV-ProxyNet's text proxy generator (spec §4.2): direction leader → director → dash → t^p_ij.

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

``ProxyGenerator.forward`` computes t^p for every pair of a block, the reference-style path; the exact
factorised scorer is :mod:`tvr.methods.proxy.scoring`.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

DASHES = ("theta", "linear")
_EPS = 1e-12


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
        for name, value in (
            ("dim", dim),
            ("layers", layers),
            ("heads", heads),
            ("ffn_dim", ffn_dim),
            ("num_proxies", num_proxies),
        ):
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
