"""GARE (spec §3): a gap-aware increment Δ per (text, video) pair and its three regularisers.

The method's folder: the options and ψ (:mod:`.psi`), the factorised exact scorers (:mod:`.algebra`,
:mod:`.scoring`), the head (:mod:`.head`), its losses (:mod:`.losses`, pure tensor functions) and its ``tvr analyze``
figures (:mod:`.figures`, loaded by the analysis layer only).
"""

from tvr.methods.gare.head import GareHead
from tvr.methods.gare.psi import GareOptions, Psi, gare_block

__all__ = ["GareHead", "GareOptions", "Psi", "gare_block"]
