"""Labelled query sets: real paintings ground truth, real CLICIDE/GaRoFou names, COIL-100 protocol."""

import csv
import io
import os
from collections import defaultdict
from pathlib import Path

import pytest
from PIL import Image

from museum_search.core.errors import LabelError
from museum_search.core.evaluation._querysets import LAYOUTS, LabelledQuery, QuerySet, load_queryset
from museum_search.core.index._labels import COIL100_REGEX, WALL_REASON, label_collection, read_csv_table

_buf = io.BytesIO()
Image.new("RGB", (8, 8), (40, 80, 120)).save(_buf, "JPEG")
TINY_JPEG = _buf.getvalue()


def write_images(root: Path, relpaths) -> None:
    for rel in relpaths:
        p = root / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(TINY_JPEG)


def layout_names(shared_data: Path, name: str) -> list[str]:
    return (shared_data / "layouts" / name).read_text().split()


# --------------------------------------------------------------------------- paintings (csv)


def _ground_truth(path: Path) -> dict[str, set[str]]:
    truth = defaultdict(set)
    with open(path, newline="", encoding="utf-8") as f:
        for row in csv.DictReader(f):
            truth[row["query"]]
            if row["instance"]:
                truth[row["query"]].add(row["instance"])
    return dict(truth)


@pytest.mark.data
@pytest.mark.parametrize("name", ["qsd1_w1", "qsd1_w3", "qsd2_w3"])
def test_paintings_query_sets(shared_data, name):
    folder = shared_data / "paintings" / "queries" / name
    truth = _ground_truth(folder / "ground_truth.csv")
    catalogue = label_collection(shared_data / "paintings" / "references")

    qs = load_queryset(folder)
    assert qs.layout == "csv"
    assert qs.root == os.path.abspath(folder)
    assert len(qs.queries) == 30 == len(truth)
    assert qs.ignored == []
    for q in qs.queries:
        assert os.path.isabs(q.path) and os.path.isfile(q.path)
        assert q.relevant == frozenset(truth[Path(q.path).name])
        assert q.grades == {i: 1 for i in q.relevant}
    assert qs.n_open_set == sum(1 for v in truth.values() if not v)
    assert qs.n_multi == sum(1 for v in truth.values() if len(v) > 1)
    assert qs.n_instances == len(set().union(*truth.values()))
    # every painting of the ground truth is in the catalogue: restricting changes nothing
    assert qs.instances <= set(catalogue.instances)
    assert qs.restricted_to(catalogue.instances).queries == qs.queries


@pytest.mark.data
def test_qsd2_w3_has_nine_queries_with_two_paintings(shared_data):
    folder = shared_data / "paintings" / "queries" / "qsd2_w3"
    with open(folder / "ground_truth.csv", newline="", encoding="utf-8") as f:
        rows = list(csv.DictReader(f))
    assert len(rows) == 39
    qs = load_queryset(folder / "ground_truth.csv")  # the csv file itself works too
    assert qs.layout == "csv"
    two = sorted(Path(q.path).name for q in qs.queries if len(q.relevant) == 2)
    assert two == ["00002.jpg", "00005.jpg", "00006.jpg", "00007.jpg", "00008.jpg",
                   "00011.jpg", "00012.jpg", "00019.jpg", "00029.jpg"]
    assert max(len(q.relevant) for q in qs.queries) == 2
    by_name = {Path(q.path).name: q for q in qs.queries}
    assert by_name["00029.jpg"].relevant == {"bbdd_00182", "bbdd_00252"}
    assert qs.n_open_set == 0
    assert qs.summary() == "CSV ground truth: 30 queries over 37 instances (9 with several relevant instances)"


def test_csv_open_set_grades_and_mismatches(tmp_path):
    write_images(tmp_path, ["q1.jpg", "q2.jpg", "q3.jpg", "q4.jpg", "extra.jpg", "sub/q5.png"])
    (tmp_path / "ground_truth.csv").write_text(
        "\ufeffQuery,Instance,Grade\n"
        "q1.jpg,mona,3\n"
        "q1.jpg,guernica,1\n"
        "q2.jpg,,\n"          # open-set: object not in the collection
        "q3.jpg,mona,\n"      # default grade 1
        "q4.jpg,mona,0\n"     # grade 0: not relevant -> open-set
        "sub/q5.png,guernica,2.0\n"
        "gone.jpg,mona,1\n",  # no such image
        encoding="utf-8",
    )
    qs = load_queryset(tmp_path)
    assert qs.layout == "csv"
    got = {os.path.relpath(q.path, tmp_path): (q.relevant, q.grades) for q in qs.queries}
    assert got == {
        "q1.jpg": ({"mona", "guernica"}, {"mona": 3, "guernica": 1}),
        "q2.jpg": (frozenset(), {}),
        "q3.jpg": ({"mona"}, {"mona": 1}),
        "q4.jpg": (frozenset(), {}),
        os.path.join("sub", "q5.png"): ({"guernica"}, {"guernica": 2}),
    }
    assert qs.n_open_set == 2
    assert qs.n_instances == 2
    assert dict(qs.ignored) == {
        "extra.jpg": "not listed in ground_truth.csv",
        "gone.jpg": "listed in ground_truth.csv but no such image",
    }
    assert "2 open-set" in qs.summary()


@pytest.mark.parametrize(
    "content, message",
    [
        ("query,instance,relevance\nq1.jpg,mona,5\n", "line 2: relevance '5' is not a whole number from 0 to 3"),
        ("query,instance,grade\nq1.jpg,mona,high\n", "line 2: grade 'high'"),
        ("query,instance,grade\nq1.jpg,mona,1.5\n", "line 2: grade '1.5'"),
        ("image,painting\nq1.jpg,mona\n", "has no 'instance' column"),
        ("file,instance\n", "No query in"),
        ("", "is empty"),
    ],
)
def test_csv_errors(tmp_path, content, message):
    write_images(tmp_path, ["q1.jpg"])
    (tmp_path / "ground_truth.csv").write_text(content)
    with pytest.raises(LabelError, match=message):
        load_queryset(tmp_path)


# --------------------------------------------------------------------------- GaRoFou


@pytest.mark.data
def test_garofou_queries_on_disk(shared_data, tmp_path):
    train = layout_names(shared_data, "garofou_TRAIN_I_files.txt")
    test = layout_names(shared_data, "garofou_TEST_I_files.txt")
    write_images(tmp_path, [f"TRAIN_I/{n}" for n in train] + [f"TEST_I/{n}" for n in test])
    refs = label_collection(tmp_path)

    for path in (tmp_path, tmp_path / "TEST_I"):
        qs = load_queryset(path)
        assert qs.layout == "garofou"
        assert qs.root == os.path.abspath(tmp_path / "TEST_I")
        assert len(qs.queries) == 184
        assert qs.n_instances == 166
        assert qs.n_open_set == 0 and qs.ignored == []
        assert all(os.path.isfile(q.path) for q in qs.queries)
    first = os.path.abspath(tmp_path / "TEST_I" / "A_001_00.jpg")
    assert qs.queries[0] == LabelledQuery(first, frozenset({"A_001"}), {"A_001": 1})
    # every query object has references (paper: 184 queries over 166 instances, all evaluated)
    assert qs.instances <= set(refs.instances)
    assert qs.restricted_to(refs.instances).n_open_set == 0
    assert qs.summary() == "GaRoFou layout: 184 queries over 166 instances"


@pytest.mark.data
def test_garofou_names_without_images(shared_data):
    test = layout_names(shared_data, "garofou_TEST_I_files.txt")
    qs = load_queryset("/nonexistent/garofou", files=[f"TEST_I/{n}" for n in test] + ["TRAIN_I/A_001_01.jpg"])
    assert qs.layout == "garofou"
    assert (len(qs.queries), qs.n_instances) == (184, 166)
    assert qs.root == os.path.abspath("/nonexistent/garofou/TEST_I")


# --------------------------------------------------------------------------- CLICIDE


@pytest.mark.data
def test_clicide_queries_open_set_after_restriction(shared_data, tmp_path):
    names = layout_names(shared_data, "clicide_reference_files.txt")
    # queries in test/ follow the reference naming; 2 show objects with no reference, 1 is a wall
    queries = ["10A-9.JPG", "10B-9.JPG", "11C-9.JPG", "12O-9.JPG", "3wall-9.JPG", "99Z-0.JPG", "98Y-1.JPG"]
    write_images(tmp_path, names[:20] + [f"test/{q}" for q in queries])  # references on disk: see test_labels
    refs = label_collection(tmp_path, files=names)
    assert (refs.rule, len(refs.references), refs.n_instances) == ("clicide", 3245, 464)

    for path in (tmp_path, tmp_path / "test"):
        qs = load_queryset(path)
        assert qs.layout == "clicide"
        assert qs.root == os.path.abspath(tmp_path / "test")
        assert len(qs.queries) == 6
        assert qs.ignored == [("3wall-9.JPG", WALL_REASON)]
        assert qs.n_open_set == 0
    restricted = qs.restricted_to(set(refs.instances))
    assert len(restricted.queries) == 6
    assert restricted.n_open_set == 2
    assert {Path(q.path).name for q in restricted.queries if q.is_open_set} == {"99Z-0.JPG", "98Y-1.JPG"}
    assert restricted.n_instances == 4
    assert qs.n_open_set == 0  # the original is unchanged
    assert "2 open-set" in restricted.summary()


# --------------------------------------------------------------------------- folder, regex


def test_folder_layout_on_disk(tmp_path):
    write_images(tmp_path, ["mona/a.jpg", "mona/b.jpg", "guernica/c.jpg", ".trash/x.jpg"])
    qs = load_queryset(tmp_path)
    assert qs.layout == "folder"
    assert [(Path(q.path).name, set(q.relevant)) for q in qs.queries] == [
        ("c.jpg", {"guernica"}), ("a.jpg", {"mona"}), ("b.jpg", {"mona"})
    ]
    assert qs.summary() == "Folder-per-instance layout: 3 queries over 2 instances"


@pytest.mark.data
def test_coil100_query_protocol_with_regex(shared_data):
    coil = shared_data / "coil100"
    names = sorted(p.name for p in coil.iterdir() if p.name.endswith(("__10.jpg", "__130.jpg", "__250.jpg")))
    qs = load_queryset(coil, regex=COIL100_REGEX, files=names)
    assert qs.layout == "regex"
    assert len(qs.queries) == 299  # data README: angles 10, 130 and 250
    assert qs.n_instances == 100
    assert all(os.path.isfile(q.path) for q in qs.queries)


def test_regex_layout_ignores_non_matching():
    qs = load_queryset("/q", layout="regex", regex=r"^(?P<instance>\w+?)_\d+\.jpg$", files=["cup_1.jpg", "x.png"])
    assert [set(q.relevant) for q in qs.queries] == [{"cup"}]
    assert qs.ignored == [("x.png", "does not match the regular expression '^(?P<instance>\\\\w+?)_\\\\d+\\\\.jpg$'")]
    with pytest.raises(LabelError, match="Invalid regular expression"):
        load_queryset("/q", layout="regex", regex="(", files=["cup_1.jpg"])


def test_undetectable_missing_and_unknown(tmp_path):
    write_images(tmp_path / "loose", ["IMG_1.jpg", "IMG_2.jpg"])
    with pytest.raises(LabelError, match="Could not recognise the query set layout"):
        load_queryset(tmp_path / "loose")
    (tmp_path / "empty").mkdir()
    with pytest.raises(LabelError, match="No query images found"):
        load_queryset(tmp_path / "empty", layout="folder")
    with pytest.raises(LabelError, match="Query set not found"):
        load_queryset(tmp_path / "nope")
    with pytest.raises(LabelError, match="not found"):
        load_queryset(tmp_path / "loose", layout="csv")
    with pytest.raises(LabelError, match="Unknown query set layout"):
        load_queryset(tmp_path / "loose", layout="trec")
    assert LAYOUTS[0] == "auto"


def test_queryset_counts_and_restriction_keep_grades():
    qs = QuerySet(
        "csv",
        "/q",
        [
            LabelledQuery("/q/1.jpg", frozenset({"a", "b"}), {"a": 3, "b": 1}),
            LabelledQuery("/q/2.jpg", frozenset({"c"}), {"c": 1}),
            LabelledQuery("/q/3.jpg", frozenset(), {}),
        ],
        [],
    )
    assert (qs.n_open_set, qs.n_instances, qs.n_multi) == (1, 3, 1)
    r = qs.restricted_to({"a", "z"})
    assert [(set(q.relevant), q.grades) for q in r.queries] == [({"a"}, {"a": 3}), (set(), {}), (set(), {})]
    assert r.n_open_set == 2
    assert len({q for q in qs.queries}) == 3  # hashable


# --------------------------------------------------------------------------- bad inputs survive


def test_ground_truth_keeps_quoted_multiline_cells(tmp_path):
    write_images(tmp_path, ["q1.jpg", "q2.jpg", "q3.jpg"])
    (tmp_path / "ground_truth.csv").write_bytes(
        (
            "\ufeffquery;instance;note\r\n"
            'q1.jpg;mona;"seen from the left;\r\nq2.jpg;guernica;glare"\r\n'  # a note, not a row
            "q2.jpg;;reflection\u2028on the glass\r\n"  # U+2028 (pasted from a word processor) is no row end
            'q3.jpg;mona;"two\nlines"\r\n'
            "q3.jpg;scream;\r\n"
        ).encode("utf-8")
    )
    qs = load_queryset(tmp_path)
    assert qs.ignored == []
    got = {Path(q.path).name: set(q.relevant) for q in qs.queries}
    assert got == {"q1.jpg": {"mona"}, "q2.jpg": set(), "q3.jpg": {"mona", "scream"}}
    header, rows, _ = read_csv_table(tmp_path / "ground_truth.csv")
    assert header == ["query", "instance", "note"]
    assert [r["note"] for r in rows] == [
        "seen from the left;\nq2.jpg;guernica;glare", "reflection\u2028on the glass", "two\nlines", ""]


def test_ground_truth_errors_give_the_physical_line(tmp_path):
    write_images(tmp_path, ["q1.jpg", "q2.jpg"])
    (tmp_path / "ground_truth.csv").write_text(
        'query,instance,grade,note\nq1.jpg,mona,1,"a\nlong\nnote"\nq2.jpg,mona,9,\n', encoding="utf-8")
    with pytest.raises(LabelError, match="line 5: grade '9'"):
        load_queryset(tmp_path)


@pytest.mark.data
def test_paintings_ground_truth_with_multiline_notes(shared_data, tmp_path):
    src = shared_data / "paintings" / "queries" / "qsd2_w3"
    with open(src / "ground_truth.csv", newline="", encoding="utf-8") as f:
        rows = list(csv.DictReader(f))
    dst = tmp_path / "qsd2_w3"
    dst.mkdir()
    for name in {r["query"] for r in rows}:
        (dst / name).symlink_to(src / name)  # the real photos, through links
    with open(dst / "ground_truth.csv", "w", newline="", encoding="utf-8") as f:
        w = csv.writer(f)
        w.writerow(["query", "instance", "note"])
        for r in rows:
            # a quoted note on two lines; an unquoted one with a U+2028 line separator
            w.writerow([r["query"], r["instance"], f"checked by hand,\nrow of {r['query']}"])
            w.writerow([r["query"], r["instance"], "glare\u2028on the varnish"])
    qs = load_queryset(dst)
    assert qs.ignored == []
    assert {Path(q.path).name: q.relevant for q in qs.queries} == {
        Path(q.path).name: q.relevant for q in load_queryset(src).queries}
    assert qs.n_multi == 9


def test_query_files_with_bad_names_and_broken_links_are_ignored(tmp_path):
    from museum_search.core.index._labels import (
        BROKEN_LINK_REASON,
        LOOPING_LINK_REASON,
        NON_UTF8_FILE_REASON,
    )

    write_images(tmp_path, ["mona/a.jpg", "guernica/c.jpg"])
    try:
        with open(os.path.join(os.fsencode(tmp_path / "mona"), b"b\xe9.jpg"), "wb") as f:
            f.write(TINY_JPEG)
    except OSError as exc:
        pytest.skip(f"this file system refuses non-UTF-8 names: {exc}")
    (tmp_path / "mona" / "link.jpg").symlink_to(tmp_path / "mona" / "a.jpg")
    (tmp_path / "mona" / "gone.jpg").symlink_to(tmp_path / "mona" / "deleted.jpg")
    (tmp_path / "guernica" / "x.jpg").symlink_to("y.jpg")
    (tmp_path / "guernica" / "y.jpg").symlink_to("x.jpg")
    qs = load_queryset(tmp_path)
    assert qs.layout == "folder"
    assert [os.path.relpath(q.path, tmp_path) for q in qs.queries] == [
        os.path.join("guernica", "c.jpg"), os.path.join("mona", "a.jpg"), os.path.join("mona", "link.jpg")]
    assert qs.ignored == [
        ("guernica/x.jpg", LOOPING_LINK_REASON),
        ("guernica/y.jpg", LOOPING_LINK_REASON),
        ("mona/b\\xe9.jpg", NON_UTF8_FILE_REASON),
        ("mona/gone.jpg", BROKEN_LINK_REASON),
    ]
    assert all(os.path.isfile(q.path) for q in qs.queries)
    # a ground truth that lists a broken link reports it once, with the real reason
    (tmp_path / "ground_truth.csv").write_text(
        "query,instance\nmona/a.jpg,mona\nmona/link.jpg,mona\nmona/gone.jpg,mona\nguernica/c.jpg,guernica\n"
        "guernica/x.jpg,guernica\nguernica/y.jpg,guernica\n", encoding="utf-8")
    qs = load_queryset(tmp_path)
    assert qs.layout == "csv" and len(qs.queries) == 3
    assert dict(qs.ignored) == {"guernica/x.jpg": LOOPING_LINK_REASON, "guernica/y.jpg": LOOPING_LINK_REASON,
                                "mona/b\\xe9.jpg": NON_UTF8_FILE_REASON, "mona/gone.jpg": BROKEN_LINK_REASON}
    # only unusable files: the error says why
    (tmp_path / "only").mkdir()
    (tmp_path / "only" / "gone.jpg").symlink_to(tmp_path / "nowhere.jpg")
    with pytest.raises(LabelError, match=r"No query images found .*gone\.jpg: broken symbolic link"):
        load_queryset(tmp_path / "only", layout="folder")


def test_unknown_instances_are_not_open_set():
    qs = QuerySet(
        "csv",
        "/q",
        [
            LabelledQuery("/q/1.jpg", frozenset({"mona", "guernica"}), {"mona": 1, "guernica": 1}),
            LabelledQuery("/q/2.jpg", frozenset({"monna"}), {"monna": 1}),  # a typo
            LabelledQuery("/q/3.jpg", frozenset(), {}),  # open set by design
            LabelledQuery("/q/4.jpg", frozenset({"scream", "guernica"}), {"scream": 1, "guernica": 1}),
        ],
        [],
    )
    index_instances = {"mona", "scream", "nighthawks"}
    assert qs.unknown_instances(index_instances) == ["guernica", "monna"]
    assert qs.n_unknown_queries(index_instances) == 3
    assert qs.n_open_set == 1
