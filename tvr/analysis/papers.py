"""The papers whose figures ``tvr analyze`` reproduces, named as a reader can look them up (authors and title), for
the figures' titles: "as Fig. 3 of <paper>"."""

from __future__ import annotations

#: GARE, the version with the relaxed information bottleneck (its figure numbers: 2, 3, 4, 6, 7)
GARE_PAPER = (
    'Xiao et al., "Rebalancing Contrastive Alignment with Bottlenecked Semantic Increments in Text-Video Retrieval"'
)
#: TV-ProxyNet
TEXT_PROXY_PAPER = (
    'Xiao et al., "Text Proxy: Decomposing Retrieval from a 1-to-N Relationship into N 1-to-1 Relationships for '
    'Text-Video Retrieval"'
)


def as_in(figures: str, paper: str) -> str:
    """``as Fig. 3 of Xiao et al., "…"``: where a figure's measurement comes from."""
    return f"as {figures} of {paper}"
