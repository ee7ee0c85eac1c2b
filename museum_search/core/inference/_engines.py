"""Inference engines: ONNX Runtime (the default wherever it is installed) and PyTorch eager.

The ONNX engine runs each backbone + head exported once from the torch model
(:meth:`museum_search.core.inference._backbones.Extractor.forward`: the multi-scale input, the pooling and the L2
normalisation are in the graph; height, width and batch are dynamic). An export is kept in
the user cache (``<cache>/onnx/``), named by a key of the backbone's meta (weights id, head,
size, scales, GeM p) and the opset, with a sidecar ``.json`` holding that meta and the SHA-256
of the ``.onnx`` file. It is checked on every load: a file whose checksum or meta does not match
is exported again, never trusted. Folders of ready exports (a frozen build bundles them, see
``packaging/``) are searched first: ``$MUSEUM_SEARCH_ONNX_DIR`` and ``resources/onnx``.

Where the ONNX path cannot be built (onnxruntime not installed, an operator the exporter lacks,
R-MAC, whose regions depend on the feature map's size and would be frozen into the graph), the
torch engine is used and the log says so, once per backbone and reason.

torch, onnx and onnxruntime are imported inside the functions that use them: lazy, for start-up
time only (a query on an exported network never loads torch).

**The engine is a setting, not a process-wide switch.** Whoever builds an extractor says which engine
(``build_extractor(..., engine=)``, ``extractor_for_meta(..., engine=)``), and the views pass the
user's choice through the frozen settings of what they start: ``QuerySettings.engine`` for a query
pipeline (the CLI's ``query``/``evaluate``/``serve``, the app's Search and Evaluation tabs, the kiosk),
the ``engine`` and ``matcher`` arguments of the build and update jobs (``index``/``update``, the
Collection tab). None or ``"auto"`` means :func:`default` (``$MUSEUM_SEARCH_ENGINE``, else ONNX
Runtime where it is installed, else torch); :func:`resolve` turns a choice into an engine name.

**What stays process-wide, and why.** None of these is a choice: each is a cache of something costly
that gives the same result whoever asks (so sharing it changes no answer), a registry of fixed
names, or a limit that only works when shared. Caches whose entries depend on the engine are keyed
by it.

* inference: ``_backbones.REGISTRY`` (backbone name → constructor: fixed); ``_backbones._CACHE``
  (torch extractors by configuration and weights file: loading a network takes seconds);
  ``_sessions`` here (ONNX Runtime extractors by :class:`museum_search.core.inference._backbones.BackboneMeta`; ``_CACHE`` and
  ``_sessions`` are one per engine, so the engine is part of their key) and ``_said`` (a fallback to
  torch is logged once per backbone and reason).
* verification: ``_xfeat._sessions`` (XFeat's ONNX session by its meta); ``_spatial._MEMORY`` (the
  references' local features read from disk, per index, dropped with it) with ``_WARNED`` and
  ``_DISK_FAILED`` (say a problem once); ``_spatial._detectors`` (one SIFT/ORB detector per thread:
  OpenCV's are not thread-safe) and ``_spatial._POOL`` (the matching threads).
* answer: ``_rerank._GRAPH_CACHE`` and ``_DBA_CACHE`` (ICFRR graphs and the DBA gallery per index,
  dropped with it: costly to build, a function of the index and the parameters in their key).
* index: ``_exact._views`` (faiss's zero-copy view of a float16 descriptor file's memory map,
  made once per map, dropped with it) and ``_exact._pool_instance`` (the scoring threads).
* registries of fixed names: ``evaluation._metrics.METRICS`` (the metrics by key) and
  ``conditions.CONDITIONS`` (the synthetic photo conditions by name).
* leaves: ``images._BUDGET`` (the decode memory budget: a limit on the whole process's decoding
  only works if every decoder shares it) and ``images._opencv_tiff_quirks`` (measured once);
  ``progress._shared`` (:func:`.progress.wait`'s calls in flight by key, so a job started again
  joins the same load; an extractor's key names its engine); ``capture._logged`` (camera problems
  said once); ``memory._libc`` (the C library, loaded once).
"""

from __future__ import annotations

import atexit
import hashlib
import importlib.util
import json
import logging
import lzma
import os
import secrets
import threading
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from museum_search.core import paths
from museum_search.core.errors import MuseumSearchError, WeightsUnavailableError, reraise_interrupt
from museum_search.core.inference._backbones import (
    REGISTRY,
    BackboneConfig,
    BackboneMeta,
    DescriptorExtractor,
    NoNetwork,
    build_torch_extractor,
    check_config,
    meta_for,
)

log = logging.getLogger(__name__)

ENGINES = ("onnx", "torch")
OPSET = 17
#: Bump when the exported graph changes for the same meta (older exports are then re-exported).
EXPORT_FORMAT = 1

_lock = threading.Lock()
_sessions: dict[BackboneMeta, "OnnxExtractor"] = {}
_said: set[tuple[str, str]] = set()


class ExportMeta(Protocol):
    """What names an export: a :class:`museum_search.core.inference._backbones.BackboneMeta`, or :class:`museum_search.core.verification._xfeat.XFeatMeta`."""

    @property
    def name(self) -> str: ...

    @property
    def head(self) -> str: ...

    def to_dict(self) -> dict[str, Any]: ...


def onnx_available() -> bool:
    return importlib.util.find_spec("onnxruntime") is not None


def torch_available() -> bool:
    return importlib.util.find_spec("torch") is not None


def default() -> str:
    """``$MUSEUM_SEARCH_ENGINE``, else ``onnx`` when onnxruntime is installed, else ``torch``."""
    env = os.environ.get("MUSEUM_SEARCH_ENGINE", "").strip().lower()
    if env in ENGINES:
        return env
    return "onnx" if onnx_available() else "torch"


def resolve(name: str | None) -> str:
    """The engine a choice names: None or ``"auto"``, :func:`default`; else ``name``, checked."""
    if name is None or name == "auto":
        return default()
    if name not in ENGINES:
        raise MuseumSearchError(f"unknown inference engine {name!r}; choose one of {', '.join(ENGINES)}")
    return name


def _say_once(backbone: str, reason: str) -> None:
    if (backbone, reason) not in _said:
        _said.add((backbone, reason))
        log.warning("ONNX Runtime cannot run %s (%s); using torch instead", backbone, reason)


# ---- the ONNX engine -----------------------------------------------------------------------


class OnnxExtractor(DescriptorExtractor):
    """The ONNX Runtime engine (CPU provider, or a GPU provider when one is installed)."""

    engine = "onnx"

    def __init__(self, meta: BackboneMeta, model_bytes: bytes, path: Path):
        super().__init__(meta)
        import onnxruntime as ort

        so = ort.SessionOptions()
        so.intra_op_num_threads = max(1, os.cpu_count() or 1)
        so.log_severity_level = 3
        # no busy-waiting between runs and parallel sections: a photo query describes its photo while
        # a thread computes the photo's SIFT features, and spinning threads took that thread's core
        # (and the search's after it): the paintings' verified query p50 70.6 ms against 83.3 ms
        # spinning (the photo's SIFT at 640 px), the forward pass alone within noise, indexing the 287
        # paintings 1.5 s against 1.6-1.7 s
        so.add_session_config_entry("session.intra_op.allow_spinning", "0")
        # input sizes vary from photo to photo: ORT's memory pattern is planned per input shape, so a
        # new shape would pay for a new plan (the first query of each aspect ratio)
        so.enable_mem_pattern = False
        preferred = ("CUDAExecutionProvider", "ROCMExecutionProvider", "CoreMLExecutionProvider",
                     "DmlExecutionProvider")
        available = ort.get_available_providers()
        providers = [p for p in preferred if p in available] + ["CPUExecutionProvider"]
        self.session = ort.InferenceSession(model_bytes, so, providers=providers)
        self.path = path
        self._lock = threading.Lock()  # one run at a time: the session uses every core already

    def _run(self, batch: np.ndarray) -> np.ndarray:
        with self._lock:
            return self.session.run(None, {"x": np.ascontiguousarray(batch, np.float32)})[0]


def export_key(meta: ExportMeta) -> str:
    """The name of the export of ``meta`` (stable across processes and machines)."""
    text = json.dumps({"meta": meta.to_dict(), "opset": OPSET, "format": EXPORT_FORMAT}, sort_keys=True)
    return f"{meta.name}-{meta.head}-{hashlib.sha256(text.encode()).hexdigest()[:16]}"


def export_dirs() -> list[Path]:
    """Where exports are looked for, in order; the last one is where new exports are written."""
    dirs = []
    if os.environ.get("MUSEUM_SEARCH_ONNX_DIR"):
        dirs.append(Path(os.environ["MUSEUM_SEARCH_ONNX_DIR"]))
    dirs.append(paths.resource("onnx"))
    dirs.append(paths.cache_dir() / "onnx")
    return dirs


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def export_file(folder: Path, meta: ExportMeta) -> Path:
    """The file of ``meta``'s export in ``folder``: ``<key>.onnx``, or ``<key>.onnx.xz`` (compressed with xz,
    as the frozen build bundles them) when only that one is there."""
    plain = folder / f"{export_key(meta)}.onnx"
    packed = plain.with_name(plain.name + ".xz")
    return packed if packed.is_file() and not plain.is_file() else plain


def read_export(folder: Path, meta: ExportMeta) -> bytes | None:
    """The model bytes of ``meta``'s export in ``folder`` if it is there and intact, else None.
    The sidecar's SHA-256 is that of the ``.onnx`` bytes, also for an ``.onnx.xz`` file."""
    onnx_file, side = export_file(folder, meta), folder / f"{export_key(meta)}.json"
    try:
        info = json.loads(side.read_text(encoding="utf-8"))
        data = onnx_file.read_bytes()
        if onnx_file.suffix == ".xz":
            data = lzma.decompress(data)
    except FileNotFoundError:
        return None
    except (OSError, ValueError, lzma.LZMAError) as exc:
        log.warning("the ONNX export %s cannot be read (%s); exporting it again", onnx_file, exc)
        return None
    if not isinstance(info, dict) or info.get("sha256") != _sha256(data) or info.get("meta") != meta.to_dict():
        log.warning("the ONNX export %s is damaged or does not match its description; exporting it again",
                    onnx_file)
        return None
    return data


def export_info(folder: Path, meta: ExportMeta) -> dict:
    """The sidecar of ``meta``'s export in ``folder`` (``{}`` if there is none or it cannot be read)."""
    try:
        info = json.loads((folder / f"{export_key(meta)}.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return info if isinstance(info, dict) else {}


def write_export(folder: Path, meta: ExportMeta, data: bytes, *, weights: str = "float32",
                 compress: bool = False) -> Path:
    """Write an export and its sidecar atomically (temporary files, then ``os.replace``).
    ``weights`` says how the weights are stored (``"float16"``: see :func:`half_weights`); ``compress``
    writes ``<key>.onnx.xz`` (xz, about 20 % smaller: the frozen build's bundled exports)."""
    key = export_key(meta)
    folder.mkdir(parents=True, exist_ok=True)
    out = folder / (f"{key}.onnx.xz" if compress else f"{key}.onnx")
    token = f"{os.getpid()}.{secrets.token_hex(4)}"
    side = {"meta": meta.to_dict(), "sha256": _sha256(data), "opset": OPSET, "format": EXPORT_FORMAT,
            "weights": weights}
    blob = lzma.compress(data, preset=9 | lzma.PRESET_EXTREME) if compress else data
    for name, payload in ((out.name, blob), (f"{key}.json", json.dumps(side, indent=1).encode())):
        tmp = folder / f".{name}.{token}.tmp"
        try:
            with open(tmp, "wb") as f:
                f.write(payload)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, folder / name)
        finally:
            tmp.unlink(missing_ok=True)
    return out


class ExportMismatch(MuseumSearchError):
    """The exported graph does not give the torch model's descriptors."""


def _same_padding_forward(self, x):
    """``efficientnet_lite_pytorch``'s TF "same" padding with the sizes as traced tensors (its own
    forward computes them in Python, which a trace would freeze at the export's input size)."""
    import torch
    import torch.nn.functional as F

    shape = torch._shape_as_tensor(x)
    pads = []
    for i, dim in ((1, -1), (0, -2)):  # width, then height (F.pad's order)
        size, k, s, d = shape[dim], self.weight.shape[dim], self.stride[i], self.dilation[i]
        total = torch.clamp((torch.div(size + s - 1, s, rounding_mode="floor") - 1) * s + (k - 1) * d + 1 - size,
                            min=0)
        before = torch.div(total, 2, rounding_mode="floor")
        pads += [before, total - before]
    return F.conv2d(F.pad(x, pads), self.weight, self.bias, self.stride, self.padding, self.dilation, self.groups)


class _traceable_padding:
    """While exporting: EfficientNet-Lite's dynamic "same" padding in traceable form."""

    def __enter__(self):
        try:
            from efficientnet_lite_pytorch import utils
        except ImportError:
            self.cls = None
            return self
        self.cls, self.original = utils.Conv2dDynamicSamePadding, utils.Conv2dDynamicSamePadding.forward
        self.cls.forward = _same_padding_forward
        return self

    def __exit__(self, *exc):
        if self.cls is not None:
            self.cls.forward = self.original
        return False


def check_export(ext: DescriptorExtractor, onnx_ext: DescriptorExtractor, seed: int = 0) -> float:
    """The smallest cosine between the two engines' descriptors of random inputs of sizes other than
    the export's (odd sides included); raises :class:`ExportMismatch` below 0.9999."""
    rng = np.random.default_rng(seed)
    if ext.meta.input_policy == "fixed":
        shapes = [(224, 224), (224, 224)]
    else:
        n = ext.meta.size
        shapes = [(n, n - 37), (n - 51, n)]
    worst = 1.0
    for h, w in shapes:
        x = [rng.standard_normal((3, h, w)).astype(np.float32) for _ in range(2)]
        a, b = ext.embed(x), onnx_ext.embed(x)
        worst = min(worst, float(np.min(np.sum(a * b, axis=1))))
    if worst < 0.9999:
        raise ExportMismatch(f"the exported graph's descriptors differ from torch's (cosine {worst:.4f}) on "
                             "inputs of other sizes")
    return worst


#: Weight tensors smaller than this stay float32 in :func:`half_weights` (biases, BN-folded scales: no gain).
HALF_MIN_ELEMENTS = 1024


def half_weights(data: bytes) -> bytes:
    """The export ``data`` with its large float32 weights stored as float16, each followed by a Cast
    back to float32: the file is half the size and the network still computes in float32 (ONNX
    Runtime folds the casts into float32 constants when it loads the model, so it runs as fast).
    Rounding the weights moves the descriptors by a cosine of at most 1.4e-5 (the 287 paintings); :func:`export` checks the
    result against torch like any export. Used for the frozen build's bundled exports (needs ``onnx``)."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    model = onnx.load_from_string(data)
    graph = model.graph
    names = {n for node in graph.node for n in (*node.input, *node.output)} | {i.name for i in graph.initializer}
    kept, halves, casts = [], [], []
    for init in graph.initializer:
        if init.data_type != TensorProto.FLOAT or int(np.prod(init.dims)) < HALF_MIN_ELEMENTS:
            kept.append(init)
            continue
        stored = f"{init.name}__float16"
        if stored in names:
            raise ValueError(f"half_weights: the graph already has a tensor named {stored}")
        halves.append(numpy_helper.from_array(numpy_helper.to_array(init).astype(np.float16), stored))
        casts.append(helper.make_node("Cast", [stored], [init.name], to=TensorProto.FLOAT,
                                      name=f"{init.name}__to_float32"))
    del graph.initializer[:]
    graph.initializer.extend(kept + halves)
    nodes = list(graph.node)
    del graph.node[:]
    graph.node.extend(casts + nodes)  # the casts first: the graph stays topologically sorted
    onnx.checker.check_model(model)
    return model.SerializeToString()


def export(config: BackboneConfig, *, download: bool = True, half: bool = False) -> tuple[BackboneMeta, bytes]:
    """Export the torch model of ``config`` to ONNX (dynamic batch, height and width), checked
    against torch on inputs of other sizes (:func:`check_export`). ``half``: weights stored as
    float16 (:func:`half_weights`), checked the same way."""
    import io
    import warnings

    import torch

    ext = build_torch_extractor(config, download=download)

    class _Forward(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.model = ext.model  # registered, so the weights are in the graph

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return ext.forward(x)

    h, w = (224, 224) if ext.meta.input_policy == "fixed" else (ext.meta.size, int(ext.meta.size * 0.75))
    x = torch.zeros(1, 3, h, w)
    buf = io.BytesIO()
    dynamic = {"x": {0: "batch"}, "descriptor": {0: "batch"}}
    if ext.meta.input_policy != "fixed":
        dynamic["x"].update({2: "height", 3: "width"})
    with warnings.catch_warnings(), torch.inference_mode(), _traceable_padding():
        warnings.simplefilter("ignore")  # the exporter's deprecation and tracer notes
        # ignore: torch's annotation of f omits the file-like objects its TorchScript exporter writes to
        torch.onnx.export(_Forward().eval(), (x,), buf,  # type: ignore[arg-type]
                          input_names=["x"], output_names=["descriptor"],
                          dynamic_axes=dynamic, opset_version=OPSET, dynamo=False)
    data = buf.getvalue()
    if half:
        data = half_weights(data)
    check_export(ext, OnnxExtractor(ext.meta, data, Path("<export>")))
    return ext.meta, data


_children: set = set()  # export processes running (ended at exit: an export is never left behind)
_children_lock = threading.Lock()


def _end_children() -> None:
    with _children_lock:
        for proc in list(_children):
            if proc.poll() is None:
                proc.kill()


atexit.register(_end_children)


def export_apart(config: BackboneConfig, *, download: bool = True) -> tuple[dict[str, Any], bytes]:
    """:func:`export` in a child process (``_export_child``): torch, the torch model and the trace
    (about 1 GB at the peak) never enter this process, whose peak memory stays that of its own
    work. Returns the exported model's meta (as :meth:`BackboneMeta.to_dict`) and its bytes; the
    child's errors come back as the same exceptions (:class:`ExportMismatch`,
    :class:`WeightsUnavailableError`, :class:`MuseumSearchError`, else RuntimeError). In a frozen
    build (no Python to start; its exports are bundled) the export runs in this process."""
    import subprocess
    import sys
    import tempfile

    if getattr(sys, "frozen", False):
        meta, data = export(config, download=download)
        return meta.to_dict(), data
    with tempfile.TemporaryDirectory(prefix="museum-search-export-") as tmp:
        out = Path(tmp) / "model.onnx"
        request = {"config": {**config.__dict__, "scales": list(config.scales)}, "download": download, "out": str(out)}
        proc = subprocess.Popen([sys.executable, "-m", "museum_search.core.inference._export_child"],
                                stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        with _children_lock:
            _children.add(proc)
        try:
            stdout, stderr = proc.communicate(json.dumps(request))
        finally:
            with _children_lock:
                _children.discard(proc)
        answer = next((json.loads(line) for line in reversed(stdout.splitlines()) if line.startswith("{")), None)
        if answer is None or proc.returncode != 0:
            tail = (stderr or "").strip().splitlines()[-1:] or [f"exit status {proc.returncode}"]
            raise RuntimeError(f"the export process failed: {tail[0][:300]}")
        if "error" in answer:
            kind = {"mismatch": ExportMismatch, "weights": WeightsUnavailableError,
                    "museum": MuseumSearchError}.get(answer["error"], RuntimeError)
            raise kind(answer["message"])
        return answer["meta"], out.read_bytes()


def onnx_extractor(config: BackboneConfig, *, download: bool = True) -> DescriptorExtractor:
    """The ONNX engine's extractor for ``config`` (exported on first use), or the torch engine's
    where the ONNX path cannot be built (see the module docstring)."""
    if not onnx_available():
        _say_once(config.name, "onnxruntime is not installed")
        return build_torch_extractor(config, download=download)
    if config.head == "rmac":
        _say_once(config.name, "R-MAC regions depend on the image size, which an exported graph would fix")
        return build_torch_extractor(config, download=download)
    meta = meta_for(REGISTRY[config.name], config)
    with _lock:
        if meta in _sessions:
            return _sessions[meta]
        data, where = None, None
        for folder in export_dirs():
            data = read_export(folder, meta)
            if data is not None:
                where = export_file(folder, meta)
                break
        if data is None:
            if not torch_available():
                raise MuseumSearchError(
                    f"no ONNX export of {meta.summary()} here and torch is not installed to make one; "
                    "install museum-search with torch once, or copy the export into "
                    f"{export_dirs()[-1]}")
            try:
                exported_meta, data = export_apart(config, download=download)
            except ExportMismatch as exc:
                _say_once(config.name, str(exc))
                return build_torch_extractor(config, download=download)
            except (WeightsUnavailableError, MuseumSearchError):
                raise
            except Exception as exc:
                reraise_interrupt(exc)
                _say_once(config.name, f"the export failed: {str(exc).splitlines()[0][:200]}")
                return build_torch_extractor(config, download=download)
            if exported_meta != meta.to_dict():
                raise MuseumSearchError(f"the exported model describes {exported_meta}, not {meta.to_dict()}")
            try:
                where = write_export(export_dirs()[-1], meta, data)
            except OSError as exc:
                log.warning("cannot keep the ONNX export in %s (%s); it is used from memory", export_dirs()[-1], exc)
                where = export_dirs()[-1] / f"{export_key(meta)}.onnx"
        assert where is not None  # set with data: where it was found, or where it is (or would be) kept
        try:
            ext = OnnxExtractor(meta, data, where)
        except Exception as exc:
            reraise_interrupt(exc)  # a Ctrl-C while ONNX Runtime loads is not a reason to use torch
            _say_once(config.name, f"ONNX Runtime cannot load the model: {str(exc).splitlines()[0][:200]}")
            return build_torch_extractor(config, download=download)
        _sessions[meta] = ext
        return ext


__all__ = ["ENGINES", "OnnxExtractor", "default", "export", "export_file", "export_info", "export_key",
           "half_weights", "onnx_available", "onnx_extractor", "read_export", "resolve", "write_export"]


# ---- the extractor of a backbone on the engine in use -----------------------------------------


def build_extractor(config: BackboneConfig | None = None, *, download: bool = True, cache: bool = True,
                    engine: str | None = None) -> DescriptorExtractor:
    """Build (or reuse) the extractor for ``config`` on ``engine`` (None or ``"auto"``: :func:`default`).
    Raises a clear error for bad settings. Where the ONNX engine cannot run this backbone, the
    torch engine is used (said once in the log)."""
    config = config or BackboneConfig()
    check_config(config)
    if resolve(engine) == "onnx":
        return onnx_extractor(config, download=download)
    return build_torch_extractor(config, download=download, cache=cache)


def first_use(config: BackboneConfig, engine: str | None = None) -> bool:
    """True when building ``config``'s extractor on ``engine`` exports the network first (the
    ONNX engine, no export of it here yet): a one-time step of up to a minute."""
    if resolve(engine) != "onnx" or not onnx_available() or config.head == "rmac" or config.name not in REGISTRY:
        return False
    try:
        meta = meta_for(REGISTRY[config.name], config)
    except Exception as exc:  # a weights file that cannot be read: the load says so
        reraise_interrupt(exc)
        return False
    if meta in _sessions:
        return False
    return all(read_export(folder, meta) is None for folder in export_dirs())


def loading_stage(config: BackboneConfig, engine: str | None = None) -> str:
    """What loading ``config``'s network is called while it runs (``Progress.stage``, the app's
    status): said to happen once when it first exports the network (:func:`first_use`)."""
    if first_use(config, engine):
        return f"preparing {config.name} for this computer (only the first time; up to a minute)"
    return f"loading {config.name}"


def extractor_for_meta(meta: BackboneMeta, weights: str | None = None,
                       engine: str | None = None) -> DescriptorExtractor:
    """The extractor that produces descriptors compatible with an index built with ``meta``, on
    ``engine`` (None or ``"auto"``: :func:`default`; :class:`NoNetwork` for imported descriptors: a
    photo is refused with :data:`IMPORTED_PHOTO`)."""
    if meta.imported:
        return NoNetwork(meta)
    ext = build_extractor(meta.config(weights), engine=engine)
    if ext.meta != meta:
        raise MuseumSearchError(
            f"the weights available here ({ext.meta.weights_id}) differ from the ones the index was "
            f"built with ({meta.weights_id}); pass the same --weights FILE or rebuild the index"
        )
    return ext
