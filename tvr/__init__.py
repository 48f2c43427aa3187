"""tvr: text-video retrieval on one shared CLIP / CLIP-ViP backbone (CLIP4Clip, GARE, TV-ProxyNet, GraviAlign)."""

__version__ = "0.1.0"
