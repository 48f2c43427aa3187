"""CLIP4Clip (spec §1): mean-pooled or text-conditioned frame pooling on CLIP features, symmetric InfoNCE.

The method's folder: the head and its options (:mod:`.head`); no figures of its own beyond the shared ones.
"""

from tvr.methods.clip4clip.head import (
    Clip4ClipHead,
    Clip4ClipOptions,
    Clip4ClipTextState,
    Clip4ClipVideoState,
    text_softmax_scores,
)

__all__ = ["Clip4ClipHead", "Clip4ClipOptions", "Clip4ClipTextState", "Clip4ClipVideoState", "text_softmax_scores"]
