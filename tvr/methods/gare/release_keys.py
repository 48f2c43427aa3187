"""GARE's ψ in the authors' released checkpoint (``best.pth``, spec §3), as ``tvr import-checkpoint`` maps it onto
:class:`~tvr.methods.gare.psi.Psi` (``head.psi.*``); the CLIP and temporal weights around it are the CLIP4Clip layout
that :mod:`tvr.models.import_checkpoint` reads for every method.

The released model holds ψ twice (``agent.psi`` and its alias ``psi``), so both prefixes appear with equal tensors.
ψ's keys: ``layers.0.layer_norm1`` (the LayerNorm shared by query and context), ``layers.0.cross_attn.{q,k,v,out}``
projections, ``layers.0.layer_norm2``, ``layers.0.linear1``, ``layers.0.layer_norm3``, ``mean_proj``;
``log_std_proj``, ``layers.0.linear2`` and ``layers.0.mlp.*`` exist but are never used by the released model (spec
§3.2), nor is the top-level ``weight_fc``: these are reported as *ignored*, not as unexpected.
"""

from __future__ import annotations

import re

from tvr.models.import_checkpoint import ReleaseKeys

#: prefixes under which a GARE release stores ψ (``GARE.agent.psi`` and its alias ``GARE.psi``)
PSI_PREFIXES = ("agent.psi.", "psi.")
#: ψ source key (after the prefix) → tvr ``head.psi.`` key
PSI_MAP = {
    "layers.0.layer_norm1.weight": "ln_in.weight",
    "layers.0.layer_norm1.bias": "ln_in.bias",
    "layers.0.cross_attn.q_proj.weight": "q_proj.weight",
    "layers.0.cross_attn.q_proj.bias": "q_proj.bias",
    "layers.0.cross_attn.k_proj.weight": "k_proj.weight",
    "layers.0.cross_attn.k_proj.bias": "k_proj.bias",
    "layers.0.cross_attn.v_proj.weight": "v_proj.weight",
    "layers.0.cross_attn.v_proj.bias": "v_proj.bias",
    "layers.0.cross_attn.out_proj.weight": "out_proj.weight",
    "layers.0.cross_attn.out_proj.bias": "out_proj.bias",
    "layers.0.layer_norm2.weight": "ln_attn.weight",
    "layers.0.layer_norm2.bias": "ln_attn.bias",
    "layers.0.linear1.weight": "linear.weight",
    "layers.0.linear1.bias": "linear.bias",
    "layers.0.layer_norm3.weight": "ln_out.weight",
    "layers.0.layer_norm3.bias": "ln_out.bias",
    "mean_proj.weight": "delta_proj.weight",
    "mean_proj.bias": "delta_proj.bias",
}

RELEASE_KEYS = ReleaseKeys(
    layout="gare",
    part="ψ",
    prefixes=PSI_PREFIXES,
    key_map=PSI_MAP,
    target="head.psi.",
    # source keys that exist in the releases but take no part in the released model's computation (spec §3.2)
    ignored=re.compile(r"^(weight_fc\.|(agent\.)?psi\.(log_std_proj\.|layers\.0\.linear2\.|layers\.0\.mlp\.))"),
    missing_hint="the config's head is gare but the checkpoint has no ψ (a CLIP4Clip release?)",
    unexpected_hint="the checkpoint has ψ (GARE) but the config's head is not gare",
)
