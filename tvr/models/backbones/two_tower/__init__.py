"""The two-tower backbone (docs/methods/two_tower.md): a sentence-transformers text model and an ImageNet image
model (EfficientNet-Lite), joined by a bridge (learned projections or ConSE) that also derives per-video proxies for
heads that read them; the text model's own tokenizer; the image model's resolution and normalisation with
CLIP4Clip's sampling. Its modules: :mod:`tvr.models.backbones.two_tower.modeling`,
:mod:`tvr.models.backbones.two_tower.bridge`.

Its settings: ``config.py``; what tvr needs to know of it (registered as ``two_tower``): ``backbone.py``."""
