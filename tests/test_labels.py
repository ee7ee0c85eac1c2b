"""Labelling rules on real file names (CLICIDE, GaRoFou, COIL-100, the paintings catalogue)."""

import csv
import io
import os
import re
import statistics
from collections import Counter
from pathlib import Path

import pytest
from PIL import Image

from museum_search.core.errors import LabelError, MuseumSearchError
from museum_search.core.index._labels import (
    BROKEN_LINK_REASON,
    COIL100_REGEX,
    LOOPING_LINK_REASON,
    NON_UTF8_FILE_REASON,
    NON_UTF8_FOLDER_REASON,
    RULES,
    WALL_REASON,
    Reference,
    label_collection,
    labelling_summary,
)

_buf = io.BytesIO()
Image.new("RGB", (8, 8), (120, 80, 40)).save(_buf, "JPEG")
TINY_JPEG = _buf.getvalue()


def write_images(root: Path, relpaths) -> None:
    """Tiny 8x8 JPEGs at the given relative paths (same bytes for all: fast)."""
    for rel in relpaths:
        p = root / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(TINY_JPEG)


def layout_names(shared_data: Path, name: str) -> list[str]:
    return (shared_data / "layouts" / name).read_text().split()


def per_instance_stats(labelling):
    counts = sorted(Counter(r.instance for r in labelling.references).values())
    return statistics.median(counts), counts[0], counts[-1]


# --------------------------------------------------------------------------- CLICIDE


@pytest.mark.data
def test_clicide_on_disk_matches_paper_table(shared_data, tmp_path):
    names = layout_names(shared_data, "clicide_reference_files.txt")
    assert len(names) == 3452
    write_images(tmp_path, names)
    # queries in test/ are not references; a macOS ._ file is not a photo
    write_images(tmp_path, ["test/10A-7.JPG", "test/99Z-0.JPG", "._10A-0.JPG"])
    (tmp_path / "notes.txt").write_text("not an image")

    lab = label_collection(tmp_path)
    assert lab.rule == "clicide"
    assert len(lab.references) == 3245
    assert lab.n_instances == 464
    walls = [p for p, reason in lab.ignored if reason == WALL_REASON]
    assert len(walls) == 207
    assert all(re.fullmatch(r"\d+wall-\d+\.JPG", p) for p in walls)
    assert not any(r.path.startswith("test/") for r in lab.references)
    assert len(lab.ignored) == 207  # the ._ file is not an image file: not even listed
    # paper-004 table: median 6, min 1, max 22 images per instance
    assert per_instance_stats(lab) == (6, 1, 22)
    assert lab.references == sorted(lab.references, key=lambda r: r.path)
    first = lab.references[0]
    assert first == Reference("10A-0.JPG", "10A", {})
    assert labelling_summary(lab).startswith("CLICIDE layout: 3,245 references of 464 instances (207 wall images dropped")


@pytest.mark.data
def test_clicide_names_without_images(shared_data):
    names = layout_names(shared_data, "clicide_reference_files.txt")
    lab = label_collection("/nonexistent/clicide", rule="clicide", files=names)
    assert (len(lab.references), lab.n_instances, len(lab.ignored)) == (3245, 464, 207)
    assert labelling_summary(lab) == "CLICIDE layout: 3,245 references of 464 instances (207 wall images dropped)"
    # the same names read as "none" keep walls and give one instance per file
    lab = label_collection("/nonexistent/clicide", rule="none", files=names)
    assert len(lab.references) == lab.n_instances == 3452


def test_clicide_explicit_rule_reports_foreign_names():
    files = ["10A-0.JPG", "3wall-1.JPG", "IMG_0001.jpg", ".hidden-1.JPG", "test/10A-5.JPG"]
    lab = label_collection("/x", rule="clicide", files=files)
    assert [r.instance for r in lab.references] == ["10A"]
    assert dict(lab.ignored) == {
        "3wall-1.JPG": WALL_REASON,
        "IMG_0001.jpg": "name does not follow CLICIDE <label>-<k>.JPG",
        ".hidden-1.JPG": "hidden file (e.g. macOS ._ metadata), not a photo",
    }


# --------------------------------------------------------------------------- GaRoFou


@pytest.mark.data
def test_garofou_on_disk_matches_paper_table(shared_data, tmp_path):
    train = layout_names(shared_data, "garofou_TRAIN_I_files.txt")
    test = layout_names(shared_data, "garofou_TEST_I_files.txt")
    write_images(tmp_path, [f"TRAIN_I/{n}" for n in train] + [f"TEST_I/{n}" for n in test])

    lab = label_collection(tmp_path)
    assert lab.rule == "garofou"
    assert len(lab.references) == 1068
    assert lab.n_instances == 311
    assert lab.ignored == []
    assert all(r.path.startswith("TRAIN_I/") for r in lab.references)
    assert Reference("TRAIN_I/A_001_01.jpg", "A_001", {}) in lab.references
    assert per_instance_stats(lab) == (2, 1, 45)  # paper-004 table
    assert labelling_summary(lab) == "GaRoFou layout: 1,068 references of 311 instances"

    # pointing at TRAIN_I itself gives the same instances
    inner = label_collection(tmp_path / "TRAIN_I")
    assert inner.rule == "garofou"
    assert [r.instance for r in inner.references] == [r.instance for r in lab.references]


# --------------------------------------------------------------------------- catalogue


def _catalogue_rows(shared_data):
    with open(shared_data / "paintings" / "catalogue.csv", newline="", encoding="utf-8") as f:
        return list(csv.DictReader(f))


@pytest.mark.data
def test_paintings_catalogue_is_found_next_to_references(shared_data):
    rows = _catalogue_rows(shared_data)
    lab = label_collection(shared_data / "paintings" / "references")
    assert lab.rule == "catalogue"
    assert len(lab.references) == 287 == len(rows)
    assert lab.n_instances == 287
    assert lab.ignored == []
    by_path = {r.path: r for r in lab.references}
    for row in rows:
        ref = by_path[row["file"]]
        assert ref.instance == row["instance"] == Path(row["file"]).stem
        # empty cells are left out; stray spaces (e.g. "Guitarra vermella ") are stripped
        assert ref.metadata == {k: row[k].strip() for k in ("artist", "title") if row[k].strip()}
    assert by_path["bbdd_00003.jpg"].metadata == {"artist": "Edvard Munch", "title": "Youth"}
    assert by_path["bbdd_00015.jpg"].metadata["title"] == "Guitarra vermella"
    assert by_path["bbdd_00002.jpg"].metadata == {}
    with_artist = sum(1 for r in lab.references if "artist" in r.metadata)
    assert with_artist == sum(1 for row in rows if row["artist"]) > 200
    assert labelling_summary(lab) == "Catalogue: 287 references of 287 instances"


@pytest.mark.data
def test_paintings_root_skips_queries_folder(shared_data):
    lab = label_collection(shared_data / "paintings")  # catalogue.csv at root, photos in references/
    assert lab.rule == "catalogue"
    assert len(lab.references) == 287
    assert all(r.path.startswith("references/bbdd_") for r in lab.references)
    assert lab.ignored == []


def test_catalogue_on_disk_reports_unlisted_and_missing(tmp_path):
    write_images(tmp_path / "photos", ["a.jpg", "b.JPG", "sub/c.png", "stray.jpg", "blank.jpg"])
    (tmp_path / "photos" / "catalog.csv").write_text(
        "Path;Instance;Title\n"
        "a.jpg;mona;La Joconde\n"
        "b.JPG;mona;\n"
        "sub/c.png;guernica;Guernica\n"
        "gone.jpg;ghost;Lost\n"
        "blank.jpg;;\n",
        encoding="utf-8",
    )
    lab = label_collection(tmp_path / "photos")
    assert lab.rule == "catalogue"
    assert [(r.path, r.instance, r.metadata) for r in lab.references] == [
        ("a.jpg", "mona", {"Title": "La Joconde"}),
        ("b.JPG", "mona", {}),
        ("sub/c.png", "guernica", {"Title": "Guernica"}),
    ]
    assert dict(lab.ignored) == {
        "blank.jpg": "no instance in catalog.csv",
        "gone.jpg": "listed in catalog.csv but no such image in the collection",
        "stray.jpg": "not in catalog.csv",
    }
    assert labelling_summary(lab).startswith("Catalogue: 3 references of 2 instances (")
    # labelling a subset of the files does not report the others as missing
    lab = label_collection(tmp_path / "photos", files=["sub/c.png"])
    assert [r.instance for r in lab.references] == ["guernica"]
    assert lab.ignored == [("gone.jpg", "listed in catalog.csv but no such image in the collection")]


def test_explicit_catalogue_and_errors(tmp_path):
    write_images(tmp_path / "refs", ["x.jpg", "y.jpg"])
    cat = tmp_path / "labels.csv"
    cat.write_text("filename,instance\nx.jpg,1\ny.jpg,2\n")
    lab = label_collection(tmp_path / "refs", catalogue=cat)
    assert lab.rule == "catalogue" and lab.n_instances == 2

    cat.write_text("filename,artist\nx.jpg,A\n")
    with pytest.raises(LabelError, match="has no 'instance' column"):
        label_collection(tmp_path / "refs", rule="catalogue", catalogue=cat)
    cat.write_text("filename,instance\nx.jpg,1\nx.jpg,2\n")
    with pytest.raises(LabelError, match="listed twice"):
        label_collection(tmp_path / "refs", catalogue=cat)
    with pytest.raises(LabelError, match="Catalogue not found"):
        label_collection(tmp_path / "refs", rule="catalogue")


def test_auto_ignores_a_catalogue_that_lists_none_of_the_images(tmp_path):
    (tmp_path / "catalogue.csv").write_text("file,instance\nother.jpg,x\n")  # belongs to another folder
    write_images(tmp_path / "mine", ["a/1.jpg", "b/2.jpg"])
    lab = label_collection(tmp_path / "mine")
    assert lab.rule == "folder"
    assert lab.instances == ["a", "b"]
    with pytest.raises(LabelError, match="No reference .* catalogue rule"):
        label_collection(tmp_path / "mine", rule="catalogue")


# --------------------------------------------------------------------------- folder, regex, none


def test_folder_per_instance_on_disk(tmp_path):
    write_images(tmp_path, ["mona/1.jpg", "mona/2.jpeg", "guernica/g.PNG", "guernica/detail/d.tif", "queries/q.jpg"])
    (tmp_path / "guernica" / "readme.txt").write_text("x")
    lab = label_collection(tmp_path)
    assert lab.rule == "folder"
    assert [(r.path, r.instance) for r in lab.references] == [
        ("guernica/detail/d.tif", "guernica"),
        ("guernica/g.PNG", "guernica"),
        ("mona/1.jpg", "mona"),
        ("mona/2.jpeg", "mona"),
    ]
    assert labelling_summary(lab) == "Folder-per-instance layout: 4 references of 2 instances"

    write_images(tmp_path, ["loose.jpg"])  # a loose image: no longer a folder layout
    assert label_collection(tmp_path).rule == "none"
    lab = label_collection(tmp_path, rule="folder")
    assert lab.ignored == [("loose.jpg", "not in a subfolder (folder-per-instance layout)")]


@pytest.mark.data
def test_coil100_regex(shared_data):
    lab = label_collection(shared_data / "coil100", rule="regex", regex=COIL100_REGEX)
    assert lab.rule == "regex"
    assert len(lab.references) == 7168
    assert lab.n_instances == 100
    assert set(lab.instances) == {str(n) for n in range(1, 101)}
    assert lab.ignored == []
    assert Reference("obj1__0.jpg", "1", {}) in lab.references
    # auto uses the regex when one is given
    assert label_collection(shared_data / "coil100", regex=COIL100_REGEX).rule == "regex"


def test_regex_rule_group_forms_and_non_matching(tmp_path):
    files = ["obj7__0.jpg", "views/obj7__5.png", "obj12__355.jpg", "cover.jpg"]
    lab = label_collection(tmp_path, rule="regex", regex=COIL100_REGEX, files=files)
    assert [(r.path, r.instance) for r in lab.references] == [
        ("obj12__355.jpg", "12"),
        ("obj7__0.jpg", "7"),
        ("views/obj7__5.png", "7"),
    ]
    assert lab.ignored == [("cover.jpg", f"does not match the regular expression {COIL100_REGEX!r}")]
    # first (unnamed) group when there is no group called "instance"
    lab = label_collection(tmp_path, rule="regex", regex=r"obj(\d+)__(\d+)", files=files)
    assert {r.instance for r in lab.references} == {"7", "12"}


@pytest.mark.parametrize(
    "regex, message",
    [
        (r"obj(?P<instance>\d+", "Invalid regular expression"),
        (r"obj\d+", "has no group"),
        (None, "needs a regular expression"),
        ("  ", "needs a regular expression"),
        (r"painting-(?P<instance>\d+)", "No reference .* could be labelled"),
    ],
)
def test_regex_errors(tmp_path, regex, message):
    with pytest.raises(LabelError, match=message):
        label_collection(tmp_path, rule="regex", regex=regex, files=["obj1__0.jpg"])


def test_none_rule_uses_stem():
    lab = label_collection("/x", files=["IMG_0001.jpg", "IMG_0002.jpg", "trip/IMG_0003.JPG"])
    assert lab.rule == "none"
    assert [r.instance for r in lab.references] == ["IMG_0001", "IMG_0002", "IMG_0003"]
    assert labelling_summary(lab) == "Unlabelled collection: 3 references, each its own instance"


def test_empty_missing_and_unknown(tmp_path):
    (tmp_path / "empty").mkdir()
    (tmp_path / "empty" / "list.csv").write_text("a,b\n")
    write_images(tmp_path / "empty", ["queries/q.jpg"])  # queries are never references
    with pytest.raises(LabelError, match="No images found"):
        label_collection(tmp_path / "empty")
    with pytest.raises(LabelError, match="Folder not found"):
        label_collection(tmp_path / "nope")
    with pytest.raises(LabelError, match="Unknown labelling rule"):
        label_collection(tmp_path, rule="exif", files=["a.jpg"])
    assert issubclass(LabelError, MuseumSearchError)
    assert RULES[0] == "auto"


def test_reference_is_hashable_and_frozen():
    ref = Reference("a.jpg", "a", {"title": "A"})
    assert len({ref, Reference("a.jpg", "a", {"title": "A"})}) == 1
    with pytest.raises(AttributeError):
        ref.instance = "b"


# --------------------------------------------------------------------------- bad inputs survive


def test_catalogue_keeps_quoted_multiline_fields(tmp_path):
    # as a spreadsheet saves it: BOM, ';' separated, CRLF rows, cells on several lines (LF and CRLF)
    write_images(tmp_path / "photos", ["a.jpg", "b.jpg", "c.jpg"])
    (tmp_path / "photos" / "catalogue.csv").write_bytes(
        (
            "\ufefffile;instance;title;artist\r\n"
            'a.jpg;mona;"La Joconde\r\n(Mona Lisa)";Leonardo\r\n'
            'b.jpg;guernica;"Guernica; 1937\nmural";Picasso\r\n'
            "c.jpg;scream;Skrik;Munch\r\n"
        ).encode("utf-8")
    )
    lab = label_collection(tmp_path / "photos")
    assert lab.rule == "catalogue"
    assert lab.ignored == []
    assert [(r.path, r.instance, r.metadata) for r in lab.references] == [
        ("a.jpg", "mona", {"title": "La Joconde\n(Mona Lisa)", "artist": "Leonardo"}),
        ("b.jpg", "guernica", {"title": "Guernica; 1937\nmural", "artist": "Picasso"}),
        ("c.jpg", "scream", {"title": "Skrik", "artist": "Munch"}),
    ]


def test_catalogue_errors_give_the_physical_line(tmp_path):
    write_images(tmp_path / "photos", ["a.jpg", "b.jpg"])
    (tmp_path / "photos" / "catalogue.csv").write_text(
        'file,instance,title\na.jpg,1,"two\nlines"\nb.jpg,2,B\na.jpg,3,again\n', encoding="utf-8"
    )
    with pytest.raises(LabelError, match="line 5: a.jpg is listed twice"):
        label_collection(tmp_path / "photos")


@pytest.mark.data
def test_paintings_catalogue_with_multiline_titles(shared_data, tmp_path):
    rows = _catalogue_rows(shared_data)
    for row in rows:
        if row["file"] == "bbdd_00003.jpg":
            row["title"] = "Youth\n(Puberty)"
        if row["file"] == "bbdd_00015.jpg":
            row["title"] = "Guitarra\r\nvermella"
    cat = tmp_path / "catalogue.csv"
    with open(cat, "w", newline="", encoding="utf-8") as f:  # csv quotes the cells with newlines
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    lab = label_collection(shared_data / "paintings" / "references", catalogue=cat)
    assert len(lab.references) == 287 and lab.ignored == []
    by_path = {r.path: r for r in lab.references}
    assert by_path["bbdd_00003.jpg"].metadata == {"artist": "Edvard Munch", "title": "Youth\n(Puberty)"}
    assert by_path["bbdd_00015.jpg"].metadata["title"] == "Guitarra\nvermella"


def _write_raw_name(folder: Path, name: bytes, data: bytes | None = None) -> None:
    """A file (or, with ``data=None``, a folder) whose name is raw bytes, as a camera or a zip may leave."""
    path = os.path.join(os.fsencode(folder), name)
    try:
        if data is None:
            os.mkdir(path)
        else:
            with open(path, "wb") as f:
                f.write(data)
    except OSError as exc:  # e.g. macOS or Windows file systems refuse names that are not UTF-8
        pytest.skip(f"this file system refuses non-UTF-8 names: {exc}")


def test_non_utf8_file_names_are_ignored_with_a_reason(tmp_path):
    write_images(tmp_path, ["mona/1.jpg", "mona/2.jpg", "guernica/1.jpg"])
    _write_raw_name(tmp_path / "mona", b"bad\xff.jpg", TINY_JPEG)
    _write_raw_name(tmp_path, b"caf\xe9")
    _write_raw_name(tmp_path / os.fsdecode(b"caf\xe9"), b"x.jpg", TINY_JPEG)
    lab = label_collection(tmp_path)
    assert lab.rule == "folder"
    assert [r.path for r in lab.references] == ["guernica/1.jpg", "mona/1.jpg", "mona/2.jpg"]
    assert lab.ignored == [
        ("caf\\xe9/x.jpg", NON_UTF8_FOLDER_REASON),
        ("mona/bad\\xff.jpg", NON_UTF8_FILE_REASON),
    ]
    assert "rename the file" in NON_UTF8_FILE_REASON and "rename the folder" in NON_UTF8_FOLDER_REASON
    for path, _ in lab.ignored:
        path.encode("utf-8")  # printable: can be shown, logged and written to JSON
    assert "2 ignored" not in labelling_summary(lab) and "not valid UTF-8" in labelling_summary(lab)
    assert [r.path for r in label_collection(tmp_path, rule="none").references] == [
        "guernica/1.jpg", "mona/1.jpg", "mona/2.jpg"]


def _symlinks(root: Path) -> None:
    """A link to a real image, a dangling link and a loop (a -> b -> a)."""
    try:
        (root / "mona" / "link.jpg").symlink_to(root / "mona" / "1.jpg")
    except (OSError, NotImplementedError) as exc:
        pytest.skip(f"no symbolic links here: {exc}")
    (root / "mona" / "gone.jpg").symlink_to(root / "mona" / "deleted.jpg")
    (root / "guernica" / "a.jpg").symlink_to("b.jpg")
    (root / "guernica" / "b.jpg").symlink_to("a.jpg")


def test_broken_and_looping_symlinks_are_ignored_with_a_reason(tmp_path):
    write_images(tmp_path, ["mona/1.jpg", "guernica/1.jpg"])
    _symlinks(tmp_path)
    lab = label_collection(tmp_path)
    assert lab.rule == "folder"
    assert [r.path for r in lab.references] == ["guernica/1.jpg", "mona/1.jpg", "mona/link.jpg"]
    assert lab.ignored == [
        ("guernica/a.jpg", LOOPING_LINK_REASON),
        ("guernica/b.jpg", LOOPING_LINK_REASON),
        ("mona/gone.jpg", BROKEN_LINK_REASON),
    ]
    assert all(reason.startswith("broken symbolic link") for _, reason in lab.ignored)
    for ref in lab.references:
        (tmp_path / ref.path).stat()  # every reference can be stat'ed
    # the same when the files are given (and a catalogue lists a broken link: reported once)
    (tmp_path / "catalogue.csv").write_text(
        "file,instance\nmona/1.jpg,m\nmona/link.jpg,m\nmona/gone.jpg,m\nguernica/1.jpg,g\n", encoding="utf-8")
    lab = label_collection(tmp_path)
    assert lab.rule == "catalogue"
    assert [r.path for r in lab.references] == ["guernica/1.jpg", "mona/1.jpg", "mona/link.jpg"]
    assert dict(lab.ignored) == {"guernica/a.jpg": LOOPING_LINK_REASON, "guernica/b.jpg": LOOPING_LINK_REASON,
                                 "mona/gone.jpg": BROKEN_LINK_REASON}


def test_a_collection_of_only_unusable_files_says_why(tmp_path):
    (tmp_path / "coll").mkdir()
    (tmp_path / "coll" / "gone.jpg").symlink_to(tmp_path / "nowhere.jpg")
    with pytest.raises(LabelError, match=r"No images found .*gone\.jpg: broken symbolic link"):
        label_collection(tmp_path / "coll")


@pytest.mark.skipif(hasattr(os, "geteuid") and os.geteuid() == 0, reason="root reads any folder")
def test_unreadable_subfolder_is_reported(tmp_path):
    write_images(tmp_path, ["mona/1.jpg", "guernica/1.jpg", "locked/x.jpg"])
    (tmp_path / "locked").chmod(0)
    try:
        lab = label_collection(tmp_path, rule="none")
    finally:
        (tmp_path / "locked").chmod(0o755)
    assert [r.path for r in lab.references] == ["guernica/1.jpg", "mona/1.jpg"]
    assert len(lab.ignored) == 1 and lab.ignored[0][0] == "locked"
    assert lab.ignored[0][1].startswith("folder cannot be read")


def test_build_and_update_survive_bad_names_and_links(tmp_path, sample_collection):
    """End to end: the index is written (its JSON is UTF-8) and updated; bad files are reported."""
    from museum_search.core.index._store import Index, LabellingSpec
    from museum_search.core.inference._backbones import BackboneConfig
    from museum_search.core.jobs._indexing import build_index, update_index
    from museum_search.core.progress import drive as run

    coll = tmp_path / "coll"
    for f in sorted((sample_collection / "collection").glob("*.jpg"))[:4]:
        dst = coll / f.stem.rsplit("-", 1)[0] / f.name
        dst.parent.mkdir(parents=True, exist_ok=True)
        dst.write_bytes(f.read_bytes())
    first = sorted(coll.glob("*/*.jpg"))[0]
    _write_raw_name(first.parent, b"copie\xe9.jpg", first.read_bytes())
    (first.parent / "link.jpg").symlink_to(first)
    (first.parent / "gone.jpg").symlink_to(first.parent / "deleted.jpg")
    (first.parent / "loop.jpg").symlink_to("loop.jpg")
    report = run(build_index(coll, tmp_path / "idx", BackboneConfig(size=64), LabellingSpec("folder")))
    folder = first.parent.name
    assert dict(report.labelling.ignored) == {
        f"{folder}/copie\\xe9.jpg": NON_UTF8_FILE_REASON,
        f"{folder}/gone.jpg": BROKEN_LINK_REASON,
        f"{folder}/loop.jpg": LOOPING_LINK_REASON,
    }
    idx = Index.load(tmp_path / "idx")
    assert len(idx) == 5 and f"{folder}/link.jpg" in [it.path for it in idx.items]
    first.unlink()  # link.jpg now dangles too: update drops it with a reason instead of failing
    up = run(update_index(idx))
    assert (up.removed, len(up.index)) == (2, 3)
    assert dict(up.labelling.ignored)[f"{folder}/link.jpg"] == BROKEN_LINK_REASON
