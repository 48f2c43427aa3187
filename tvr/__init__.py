"""tvr: text-video retrieval on one shared CLIP backbone (CLIP4Clip, GARE)."""

__version__ = "0.1.0"
