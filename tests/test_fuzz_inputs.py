"""Property-based fuzzing of what a user hands the program (issue 33, item 6): image files, catalogue
and ground-truth CSVs, a run's ``--settings`` JSON and ``import``'s arrays. Each input gets a
correct answer or the program's own error (a :class:`MuseumSearchError`, said in one line by the
views), never another exception, and within the deadline (no hang).

Bounded for CI: ``MUSEUM_SEARCH_FUZZ_SCALE`` (default 1) multiplies every target's examples, and
Hypothesis is derandomized unless it is set, so CI sees the same inputs every run;
``bench/bench_fuzz.py`` runs the same targets longer, with fresh random inputs, and reports the
inputs per target (``MUSEUM_SEARCH_FUZZ_LOG``: a file each target appends its count and time to)."""

from __future__ import annotations

import json
import math
import os
import time
from pathlib import Path

import cv2
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from museum_search.core.answer import QueryPipeline, QuerySettings, Verdict, descriptor_query
from museum_search.core.errors import MuseumSearchError
from museum_search.core.evaluation import evaluate, load_queryset, read_run, run_document, run_spec
from museum_search.core.evaluation._export import QuerySetSource, settings_dict, settings_from_dict
from museum_search.core.images import decode_image, encoded_image_size
from museum_search.core.index import Index, label_collection, read_csv_table
from museum_search.core.jobs import descriptor_queryset, import_index
from museum_search.core.jobs._importing import load_descriptors, read_items
from museum_search.core.progress import drive

#: Pillow warns about the damaged EXIF it is fed here; the property is what the program answers
pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")
SCALE = float(os.environ.get("MUSEUM_SEARCH_FUZZ_SCALE", "1"))
LOG = os.environ.get("MUSEUM_SEARCH_FUZZ_LOG")


def fuzz(examples: int):
    """Hypothesis settings of a target: ``examples`` x SCALE inputs, 5 s each at most (a hang or a
    pathological slowness fails), derandomized in CI."""
    return settings(max_examples=max(1, int(examples * SCALE)), deadline=5000, derandomize=SCALE == 1,
                    database=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture,
                                                          HealthCheck.data_too_large])


class _Count:
    """Counts a target's inputs and, with MUSEUM_SEARCH_FUZZ_LOG, appends the count and the time."""

    def __init__(self, name: str) -> None:
        self.name, self.n, self.accepted, self.t0 = name, 0, 0, time.perf_counter()

    def __call__(self) -> None:
        self.n += 1

    def ok(self) -> None:
        """The input was accepted (answered), not refused."""
        self.accepted += 1

    def run(self, call):
        """``call()`` on one input: its result, or None when the program refused the input with
        its own error (:class:`MuseumSearchError`); any other exception fails the property."""
        self()
        try:
            got = call()
        except MuseumSearchError:
            return None
        self.ok()
        return got

    def close(self) -> None:
        if LOG:
            with open(LOG, "a", encoding="utf-8") as f:
                f.write(json.dumps({"target": self.name, "inputs": self.n, "accepted": self.accepted,
                                    "seconds": round(time.perf_counter() - self.t0, 2)}) + "\n")


@pytest.fixture()
def count(request):
    c = _Count(request.node.name)
    yield c
    c.close()


# ---- image decoders ---------------------------------------------------------------------------------

_RNG = np.random.default_rng(7)
_PIXELS = cv2.GaussianBlur(_RNG.integers(0, 256, (24, 36, 3), dtype=np.uint8), (5, 5), 0)
SEEDS = [cv2.imencode(ext, _PIXELS, params)[1].tobytes() for ext, params in (
    (".jpg", [cv2.IMWRITE_JPEG_QUALITY, 80]), (".jpg", [cv2.IMWRITE_JPEG_PROGRESSIVE, 1]), (".png", []),
    (".webp", [cv2.IMWRITE_WEBP_QUALITY, 80]), (".bmp", []), (".tiff", []))]


@st.composite
def image_bytes(draw) -> bytes:
    """A small image file of each format, damaged: bytes flipped, cut short, spliced, repeated,
    its header's numbers (width, height, lengths) set to extremes; or bytes of no format."""
    if draw(st.integers(0, 9)) == 0:
        return draw(st.binary(max_size=256))
    data = bytearray(draw(st.sampled_from(SEEDS)))
    for _ in range(draw(st.integers(0, 4))):
        kind = draw(st.sampled_from(["flip", "cut", "splice", "extreme", "repeat"]))
        at = draw(st.integers(0, max(0, len(data) - 1)))
        if kind == "flip" and data:
            data[at] ^= 1 << draw(st.integers(0, 7))
        elif kind == "cut":
            del data[at:]
        elif kind == "splice":
            data[at:at] = draw(st.binary(min_size=1, max_size=32))
        elif kind == "extreme" and at + 4 <= len(data):
            data[at:at + 4] = draw(st.sampled_from([b"\xff\xff\xff\xff", b"\x00\x00\x00\x00", b"\x7f\xff\xff\xff",
                                                    b"\x00\x01\x00\x01", b"\xff\xff\x00\x00"]))
        elif kind == "repeat" and data:
            data[at:at] = data[at:at + draw(st.integers(1, 64))] * draw(st.integers(1, 50))
    return bytes(data)


@fuzz(1200)
@given(data=image_bytes(), max_side=st.one_of(st.none(), st.integers(1, 64)))
def test_fuzz_image_decoder(count, data, max_side):
    count()
    try:
        img = decode_image(data, "fuzz.img", max_side)
    except MuseumSearchError:
        return
    count.ok()
    assert isinstance(img, np.ndarray) and img.dtype == np.uint8 and img.ndim == 3 and img.shape[2] == 3
    assert min(img.shape[:2]) >= 1 and img.flags.c_contiguous
    if max_side is not None:
        assert max(img.shape[:2]) <= max_side


@fuzz(800)
@given(data=image_bytes())
def test_fuzz_image_size_from_the_header(count, data):
    count()
    try:
        w, h = encoded_image_size(data, "fuzz.img")
    except MuseumSearchError:
        return
    count.ok()
    assert isinstance(w, int) and isinstance(h, int) and w >= 1 and h >= 1


# ---- catalogue and ground-truth CSVs ----------------------------------------------------------------

_CELLS = st.one_of(
    st.sampled_from(["a.jpg", "b.jpg", "c.jpg", "sub/d.jpg", "../a.jpg", "/etc/passwd", "A.JPG", "a.jpg ", "",
                     "obj1", "obj2", "héllo", "x,y", '"q"', "\x00", "\n", "a.jpg\r"]),
    st.text(max_size=12))
_HEADERS = st.sampled_from([["file", "instance"], ["path", "label", "title"], ["filename", "instance", "artist"],
                            ["file"], ["instance", "file"], ["query", "instance", "grade"], ["x", "y"], []])


@st.composite
def csv_bytes(draw, header) -> bytes:
    """A CSV: a header, rows of odd cells, with a delimiter, quoting, a BOM and line ends drawn;
    sometimes raw bytes (not UTF-8)."""
    if draw(st.integers(0, 9)) == 0:
        return draw(st.binary(max_size=200))
    delim = draw(st.sampled_from([",", ";", "\t"]))
    if draw(st.booleans()):  # mostly sound: the usual header, a photo and an object per row, odd cells among them
        row = st.tuples(st.sampled_from(["a.jpg", "b.jpg", "c.jpg", "sub/d.jpg", "e.jpg"]), _CELLS, _CELLS)
        rows = [["file", "instance", "title"]] + [list(r) for r in draw(st.lists(row, min_size=1, max_size=8))]
    else:
        rows = [draw(header)] + draw(st.lists(st.lists(_CELLS, max_size=5), max_size=8))

    def cell(c: str) -> str:
        return f'"{c.replace(chr(34), chr(34) * 2)}"' if draw(st.booleans()) else c

    text = draw(st.sampled_from(["\n", "\r\n"])).join(delim.join(cell(c) for c in r) for r in rows)
    return (b"\xef\xbb\xbf" if draw(st.booleans()) else b"") + text.encode("utf-8", "surrogatepass")


@pytest.fixture(scope="module")
def photo_folder(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("fuzz-photos")
    (root / "sub").mkdir()
    for name in ("a.jpg", "b.jpg", "c.jpg", "sub/d.jpg"):
        (root / name).write_bytes(SEEDS[0])
    return root


@fuzz(500)
@given(data=csv_bytes(_HEADERS))
def test_fuzz_catalogue(count, photo_folder, data):
    cat = photo_folder / "catalogue.csv"
    cat.write_bytes(data)
    lab = count.run(lambda: (read_csv_table(cat), label_collection(photo_folder, rule="catalogue", catalogue=cat))[1])
    if lab is None:
        return
    files = {"a.jpg", "b.jpg", "c.jpg", "sub/d.jpg"}
    assert {r.path for r in lab.references} <= files  # only the collection's own photos
    assert all(r.instance.strip() for r in lab.references)


@fuzz(400)
@given(data=csv_bytes(_HEADERS))
def test_fuzz_ground_truth(count, photo_folder, data):
    (photo_folder / "ground_truth.csv").write_bytes(data)
    qs = count.run(lambda: load_queryset(photo_folder, layout="csv"))
    if qs is None:
        return
    assert all(Path(q.path).is_file() and Path(q.path).resolve().is_relative_to(photo_folder.resolve())
               for q in qs.queries)


@fuzz(400)
@given(data=csv_bytes(st.sampled_from([["path", "instance"], ["file", "label", "title"], ["path"], []])))
def test_fuzz_import_items(count, photo_folder, data):
    (photo_folder / "items.csv").write_bytes(data)
    read = count.run(lambda: read_items(photo_folder / "items.csv"))
    if read is None:
        return
    _, got, missing = read
    assert len(set(it.path for it in got)) == len(got) and set(missing) <= {it.path for it in got}


# ---- import arrays ------------------------------------------------------------------------------------

_DTYPES = st.one_of(hnp.floating_dtypes(), hnp.integer_dtypes(), hnp.boolean_dtypes(), hnp.complex_number_dtypes(),
                    st.just(np.dtype(object)), st.just(np.dtype([("a", "<f4"), ("b", "<i4")])),
                    st.just(np.dtype("<U3")))


@st.composite
def npy_bytes(draw) -> bytes:
    """A .npy file of any dtype and 0-3 dimensions (NaN, infinities, zero rows included), saved as
    numpy does (object arrays pickled), its header or data then sometimes damaged."""
    import io

    if draw(st.booleans()):  # mostly sound: rows of numbers (NaN, infinities, zero rows among them)
        dtype = draw(st.sampled_from([np.dtype("<f4"), np.dtype("<f8"), np.dtype("<f2"), np.dtype(">f4"),
                                      np.dtype("<i8"), np.dtype("u1")]))
        shape = draw(hnp.array_shapes(min_dims=2, max_dims=2, min_side=0, max_side=6))
    else:
        dtype = draw(_DTYPES)
        shape = draw(hnp.array_shapes(min_dims=0, max_dims=3, min_side=0, max_side=6))
    if dtype == np.dtype(object):
        arr = np.empty(shape, dtype=object)
    else:
        arr = draw(hnp.arrays(dtype, shape))
    buf = io.BytesIO()
    np.save(buf, arr, allow_pickle=True)
    data = bytearray(buf.getvalue())
    if draw(st.booleans()):
        at = draw(st.integers(0, len(data) - 1))
        data[at:at + 4] = draw(st.binary(min_size=0, max_size=4))
    return bytes(data)


@fuzz(800)
@given(data=npy_bytes(), dim=st.one_of(st.none(), st.integers(1, 6)))
def test_fuzz_import_array(count, tmp_path, data, dim):
    count()
    f = tmp_path / "d.npy"
    f.write_bytes(data)
    try:
        rows = load_descriptors(f, dim, "descriptors")
    except MuseumSearchError:
        return
    count.ok()
    assert rows.dtype == np.float32 and rows.ndim == 2 and len(rows) >= 1 and rows.shape[1] >= 1
    assert dim is None or rows.shape[1] == dim
    assert np.isfinite(rows).all() and np.allclose(np.linalg.norm(rows, axis=1), 1, atol=1e-3)


# ---- a run's --settings JSON ---------------------------------------------------------------------------


@pytest.fixture(scope="module")
def run_doc(tmp_path_factory):
    """A small imported index (24 references of 6 objects), its descriptor queries, and a run of
    them exported as ``evaluate --json`` writes it."""
    root = tmp_path_factory.mktemp("fuzz-run")
    rng = np.random.default_rng(5)
    centres = rng.normal(size=(6, 16))
    desc = np.concatenate([c + 0.3 * rng.normal(size=(4, 16)) for c in centres]).astype(np.float32)
    (root / "items.csv").write_text("path,instance\n" + "".join(f"p{i}.jpg,obj{i // 4}\n" for i in range(24)))
    report = drive(import_index(desc, root / "items.csv", root / "index"))
    index = report.index
    q = (centres + 0.3 * rng.normal(size=(6, 16))).astype(np.float32)
    q /= np.linalg.norm(q, axis=1, keepdims=True)  # as load_descriptors gives them
    np.save(root / "q.npy", q)
    (root / "gt.csv").write_text("query,instance\n" + "".join(f"{i},obj{i}\n" for i in range(5)) + "5,\n")
    qs = descriptor_queryset(root / "q.npy", root / "gt.csv", index)
    pipe = QueryPipeline.for_descriptors(index, QuerySettings(rerank="icfrr"))
    rep = drive(evaluate(index, qs, pipeline=pipe))
    source = QuerySetSource(str(root / "gt.csv"), "descriptors", descriptors=str(root / "q.npy"))
    spec = run_spec(rep, index, source, qs)
    return index, run_document(rep, index, spec), q


_JSON = st.recursive(st.one_of(st.none(), st.booleans(), st.integers(-10**12, 10**12), st.floats(),
                               st.text(max_size=8)),
                     lambda inner: st.one_of(st.lists(inner, max_size=3), st.dictionaries(st.text(max_size=6), inner,
                                                                                          max_size=3)),
                     max_leaves=6)


def _paths(node, prefix=()):
    """Every path (a tuple of keys and indices) into a JSON value."""
    yield prefix
    if isinstance(node, dict):
        for k, v in node.items():
            yield from _paths(v, (*prefix, k))
    elif isinstance(node, list):
        for i, v in enumerate(node):
            yield from _paths(v, (*prefix, i))


@st.composite
def tampered(draw, doc, under=()):
    """``doc`` with 1-3 values under the path ``under`` replaced by any JSON value, or deleted."""
    doc = json.loads(json.dumps(doc))
    for _ in range(draw(st.integers(1, 3))):
        base = doc
        for key in under:
            base = base[key]
        path = draw(st.sampled_from(sorted(_paths(base), key=repr)[1:] or [()]))
        if not path:
            continue
        parent = base
        for key in path[:-1]:
            parent = parent[key]
        if draw(st.integers(0, 5)) == 0 and isinstance(parent, dict):
            del parent[path[-1]]
        else:
            parent[path[-1]] = draw(_JSON)
    return doc


def _answers_or_refuses(index, settings, q, count) -> None:
    """The settings answer a descriptor query, or are refused with the program's own error."""
    try:
        pipe = QueryPipeline.for_descriptors(index, settings)
        answers = pipe.answer([descriptor_query(q[0], "row 0")])
    except MuseumSearchError:
        return
    count.ok()
    assert len(answers) == 1 and len(answers[0].results) <= settings.k
    assert answers[0].confidence is None or 0.0 <= answers[0].confidence <= 1.0


@fuzz(600)
@given(data=st.data())
def test_fuzz_settings_json(count, run_doc, data):
    """The ``settings`` part of a run, tampered: refused naming what is wrong, or run as it says."""
    count()
    index, doc, q = run_doc
    base = settings_dict(QuerySettings(verdict=Verdict(min_inliers=9, min_cosine=0.7)))
    d = data.draw(tampered(base))
    try:
        settings = settings_from_dict(d)
    except MuseumSearchError:
        return
    _answers_or_refuses(index, settings, q, count)


@fuzz(400)
@given(data=st.data())
def test_fuzz_run_json(count, run_doc, tmp_path, data):
    """A whole exported run, tampered anywhere (its run section most often), read as ``evaluate
    --settings`` reads it."""
    count()
    index, doc, q = run_doc
    under = data.draw(st.sampled_from([("run",), ("run", "settings"), ()]))
    bad = data.draw(tampered(doc, under))
    f = tmp_path / "run.json"
    f.write_text(json.dumps(bad, allow_nan=True))
    try:
        spec, _ = read_run(f)
        settings = spec.settings_for(index)
    except MuseumSearchError:
        return
    _answers_or_refuses(index, settings, q, count)
    assert isinstance(spec.batch_size, int) and not (isinstance(spec.batch_size, float) and math.isnan(spec.batch_size))


def test_fuzz_targets_see_what_they_should(run_doc, photo_folder):
    """The seeds are sound: every image seed decodes, the run's own JSON reads back, a good
    catalogue labels every photo (so the properties above are not vacuous)."""
    for data in SEEDS:
        assert decode_image(data, "seed").shape == (24, 36, 3)
    index, doc, q = run_doc
    assert settings_from_dict(doc["run"]["settings"]).rerank == ("icfrr",)
    (photo_folder / "good.csv").write_text("file,instance\na.jpg,x\nb.jpg,y\nc.jpg,x\nsub/d.jpg,z\n")
    lab = label_collection(photo_folder, rule="catalogue", catalogue=photo_folder / "good.csv")
    assert len(lab.references) == 4
    assert isinstance(Index.load(index.path), Index)


def test_what_the_fuzzer_found(tmp_path, run_doc):
    """Its findings, kept as plain tests: a .npy header that numpy's parser chokes on (a TokenError
    traceback from ``import``), a run whose format version is null (a TypeError traceback from
    ``evaluate --settings``), and a 3.5 KB PNG whose image-data chunk claims 4 GB (2 to 8 s of
    OpenCV's time to refuse it)."""
    import io

    png = bytearray(SEEDS[2])
    at = png.index(b"IDAT") - 4
    png[at:at + 4] = b"\xff\xff\xff\xff"
    with pytest.raises(MuseumSearchError, match="'IDAT' chunk claims 4,294,967,295 bytes"):
        decode_image(bytes(png), "claims.png")

    buf = io.BytesIO()
    np.save(buf, np.float16(1.0))
    data = buf.getvalue()
    head_end = data.index(b"\n") + 1
    f = tmp_path / "d.npy"
    f.write_bytes(data[:head_end - 1] + b"{" + data[head_end:])
    with pytest.raises(MuseumSearchError, match="header cannot be read"):
        load_descriptors(f, None, "descriptors")
    _, doc, _ = run_doc
    bad = json.loads(json.dumps(doc))
    bad["run"]["version"] = None
    (tmp_path / "run.json").write_text(json.dumps(bad))
    with pytest.raises(MuseumSearchError, match="format version is damaged"):
        read_run(tmp_path / "run.json")
