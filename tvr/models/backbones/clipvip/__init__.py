"""CLIP-ViP (spec §4.1, docs/methods/clipvip.md): CLIP's weights with a video tower that pools the clip itself (one
video feature, plus M proxy tokens with ``model.clipvip.proxy_projection``); CLIP's tokenizer and normalisation;
CLIP-ViP's linspace sampling with square resize. The module: :mod:`tvr.models.backbones.clipvip.modeling`.

Its settings: ``config.py``; what tvr needs to know of it (registered as ``clipvip``): ``backbone.py``."""
