"""The CLIP backbone (spec §1.1): per-frame CLIP image features, aggregated by ``model.temporal``; CLIP's BPE
tokenizer; CLIP4Clip's 1-fps sampling with short-side resize and CLIP's normalisation. ``model.clip`` names the
weights (``tiny`` = a randomly initialised one sized by ``model.tiny``). The module:
:mod:`tvr.models.backbones.clip.modeling`.

Its settings: ``config.py``; what tvr needs to know of it (registered as ``clip``): ``backbone.py``."""
