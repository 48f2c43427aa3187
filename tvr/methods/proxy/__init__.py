"""TV-ProxyNet (spec §4): a text proxy per (text, video) pair from the video's proxies, γ-blended with the query.

The method's folder: the proxy generator (:mod:`.generator`), the exact scorers (:mod:`.scoring`), the head and its
options (:mod:`.head`), its loss (:mod:`.losses`, pure tensor functions) and its ``tvr analyze`` figures
(:mod:`.figures`, loaded by the analysis layer only).
"""

from tvr.methods.proxy.generator import ProxyGenerator
from tvr.methods.proxy.head import ProxyHead, ProxyOptions, ProxyTextState, ProxyVideoState
from tvr.methods.proxy.scoring import ProxyRerankState, proxy_pair_scores, proxy_pairwise_scores, proxy_scores

__all__ = [
    "ProxyGenerator",
    "ProxyHead",
    "ProxyOptions",
    "ProxyRerankState",
    "ProxyTextState",
    "ProxyVideoState",
    "proxy_pair_scores",
    "proxy_pairwise_scores",
    "proxy_scores",
]
