"""GraviAlign (spec §5): Gaussian embeddings scored by semantic gravitation × geometric overlap.

The method's folder: the head and its options (:mod:`.head`), S_align and the losses (:mod:`.losses`, pure tensor
functions), the fast test-time kernel (:mod:`.scoring`) and its ``tvr analyze`` figures (:mod:`.figures`, loaded by
the analysis layer only).
"""

from tvr.methods.gravialign.head import (
    MODES,
    GaussianEmbedding,
    GraviAlignHead,
    GraviAlignOptions,
    GraviState,
    pooled_video,
    soft_clamp,
)

__all__ = [
    "MODES",
    "GaussianEmbedding",
    "GraviAlignHead",
    "GraviAlignOptions",
    "GraviState",
    "pooled_video",
    "soft_clamp",
]
