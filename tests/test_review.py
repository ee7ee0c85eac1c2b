"""Issue 34, item 3: staff-confirmed visitor photos through the incremental update.

Real indexes of 30 paintings (those qsd1_w1's photos show, from ../shared/data), real visitor photos
(qsd1_w1's and qsd1_w3's photos as a phone takes them: :mod:`museum_search.core.conditions`)."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import cv2
import pytest

from museum_search.core.answer import QueryPipeline, QuerySettings, load_query, query_from_array
from museum_search.core.conditions import degrade, photo_seed
from museum_search.core.errors import MuseumSearchError
from museum_search.core.images import load_image
from museum_search.core.index import Index, LabellingSpec
from museum_search.core.jobs import (
    STAFF_VIEWS_MIN,
    update_index,
)
from museum_search.core.jobs._indexing import build_index
from museum_search.core.progress import drive as run


def _ground_truth(folder: Path) -> dict[Path, str]:
    rows = (folder / "ground_truth.csv").read_text(encoding="utf-8").splitlines()[1:]
    return {folder / q: x for q, x in (r.split(",", 1) for r in rows)}


@pytest.fixture()
def paintings(tmp_path, shared_data) -> tuple[Path, dict[Path, str]]:
    """(a collection of the 30 paintings qsd1_w1 shows, with its catalogue; the photos of qsd1_w1
    and qsd1_w3 by the painting they show, known or not)."""
    queries = shared_data / "paintings" / "queries"
    truth = {**_ground_truth(queries / "qsd1_w1"), **_ground_truth(queries / "qsd1_w3")}
    shown = sorted(set(_ground_truth(queries / "qsd1_w1").values()))
    coll = tmp_path / "coll"
    coll.mkdir()
    lines = (shared_data / "paintings" / "catalogue.csv").read_text(encoding="utf-8").splitlines()
    rows = [lines[0]] + [line for line in lines[1:] if line.split(",")[1] in shown]
    for line in rows[1:]:
        shutil.copy2(shared_data / "paintings" / "references" / line.split(",")[0], coll / line.split(",")[0])
    (coll / "catalogue.csv").write_text("\n".join(rows) + "\n", encoding="utf-8")
    return coll, truth


def _build(collection: Path, out: Path, spec: LabellingSpec | None = None) -> Index:
    spec = spec or LabellingSpec("catalogue", str(collection / "catalogue.csv"))
    run(build_index(collection, out, labelling=spec))
    return Index.load(out)


def _snapshot(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def _photo(dest: Path, query: Path, condition: str = "clean") -> Path:
    """The photo ``query`` as a visitor's phone took it, written to ``dest`` (JPEG)."""
    img = load_image(query, max_side=1024)
    if condition != "clean":
        img = degrade(img, condition, photo_seed(condition, f"{query.parent.name}/{query.name}"))
    dest.parent.mkdir(parents=True, exist_ok=True)
    assert cv2.imwrite(str(dest), cv2.cvtColor(img, cv2.COLOR_RGB2BGR))
    return dest


def _answer(index: Index, photo: Path):
    (a,) = QueryPipeline(index, QuerySettings()).answer([load_query(photo)])
    return a


@pytest.fixture()
def built(tmp_path, paintings):
    """(the index of the 30 paintings, the visitors folder beside it, the photos by painting)."""
    index = _build(paintings[0], tmp_path / "index")
    return index, tmp_path / "index-visitors", paintings[1]


def _rejected_photo(built) -> tuple[Path, str]:
    """A visitor's photo of a known painting that the index does not recognise (a real phone-like
    degradation of a real photo), written under the visitors folder."""
    index, folder, truth = built
    known = {q: x for q, x in truth.items() if x in index.instances}
    for condition in ("phone-hard", "webcam", "far"):
        for q, x in sorted(known.items()):
            photo = _photo(folder / "views" / x / f"{condition}-{q.name}", q, condition)
            if not _answer(index, photo).in_collection:
                return photo, x
            photo.unlink()
    pytest.fail("every phone-like photo of the known paintings is recognised: no photo to add")


def test_added_view_survives_updates_and_is_recognised(built, paintings):
    index, visitors, truth = built
    collection = paintings[0]
    photo, x = _rejected_photo(built)
    before = _snapshot(collection)
    report = run(update_index(index, added=[(photo, x)]))
    assert report.added == 1 and report.unchanged == len(index)
    loaded = Index.load(index.path)
    row = [i for i, it in enumerate(loaded.items) if it.path == str(photo)]
    assert len(row) == 1
    item = loaded.items[row[0]]
    own = next(it for it in loaded.items if it.instance == x and it.path != str(photo))
    assert item.instance == x and item.metadata == own.metadata and item.metadata.get("title")
    assert _snapshot(collection) == before  # nothing written into the collection
    answer = _answer(loaded, photo)
    assert answer.in_collection and answer.top.instance == x

    # a later update (a photo of the collection removed) keeps it, described once
    victim = next(p for p in sorted(collection.glob("*.jpg")) if p.stem != x)
    victim.unlink()
    report = run(update_index(Index.load(index.path)))
    assert report.removed == 1 and report.added == 0
    assert str(photo) in {it.path for it in Index.load(index.path).items}
    # its file changed: dropped, said why
    _photo(photo, next(iter(truth)))
    os.utime(photo, (1e9, 1e9))
    report = run(update_index(Index.load(index.path)))
    assert [p for p, _ in report.removed_files] == [str(photo)]
    assert "staff-confirmed view" in report.removed_files[0][1]


def test_refused_adds_change_nothing(built, paintings, tmp_path):
    index, visitors, truth = built
    collection = paintings[0]
    photo = _photo(visitors / "views" / "x" / "q.jpg", next(iter(truth)))
    x = index.instances[0]
    manifest = (index.path / "manifest.json").read_bytes()
    with pytest.raises(MuseumSearchError, match=x):  # a misspelt object: the close match is named
        run(update_index(index, added=[(photo, x[:-1] + "z")]))
    with pytest.raises(MuseumSearchError, match="inside the collection"):
        run(update_index(index, added=[(sorted(collection.glob("*.jpg"))[0], x)]))
    with pytest.raises(MuseumSearchError, match="not a file"):
        run(update_index(index, added=[(tmp_path / "gone.jpg", x)]))
    with pytest.raises(MuseumSearchError, match="catalogue"):  # never into a catalogue's collection
        run(update_index(index, into_collection=[(photo, x)]))
    assert (index.path / "manifest.json").read_bytes() == manifest


def test_interrupted_add_leaves_the_index_as_it_was(built):
    index, visitors, truth = built
    photo, x = _rejected_photo(built)
    unknown = [_photo(visitors / "unknown" / q.name, q) for q, o in sorted(truth.items()) if o not in index.instances]
    files = _snapshot(index.path)
    for stop in ("describing", "local features", "calibrating"):
        job = update_index(Index.load(index.path), added=[(photo, x)], unknown_views=unknown[:STAFF_VIEWS_MIN])
        stages = []
        for p in job:
            stages.append(p.stage)
            if p.stage == stop:
                job.close()
                break
        assert stages[-1] == stop and _snapshot(index.path) == files, stop
    assert str(photo) not in {it.path for it in Index.load(index.path).items}


def test_into_collection_adds_a_new_file_only(tmp_path, sample_collection):
    coll = tmp_path / "coll"
    for f in sorted((sample_collection / "collection").glob("*.jpg"))[:9]:
        d = coll / f.stem.rsplit("-", 1)[0]
        d.mkdir(parents=True, exist_ok=True)
        shutil.copy2(f, d / f.name)
    index = _build(coll, tmp_path / "index", LabellingSpec("folder"))
    x = index.instances[0]
    photo = _photo(tmp_path / "kept" / "q.jpg", sample_collection / "queries" / "q01.jpg")
    squatter = coll / x / "visitor-q.jpg"  # a file already at the first name: never written over
    squatter.write_bytes(b"not ours")
    before = _snapshot(coll)
    job = update_index(index, into_collection=[(photo, x)])  # cancelled: the copy is removed again
    for p in job:
        if p.stage == "calibrating":
            job.close()
            break
    assert _snapshot(coll) == before
    run(update_index(Index.load(index.path), into_collection=[(photo, x)]))
    new = set(_snapshot(coll)) - set(before)
    assert len(new) == 1 and squatter.read_bytes() == b"not ours"
    (rel,) = new
    assert rel.startswith(f"{x}/") and (coll / rel).read_bytes() == photo.read_bytes()
    loaded = Index.load(index.path)
    assert {it.path: it.instance for it in loaded.items}[rel] == x


def test_staff_views_feed_the_refit_and_info_says_how_many(built, capsys):
    index, visitors, truth = built
    known = [(q, x) for q, x in sorted(truth.items()) if x in index.instances]
    unknown = [q for q, x in sorted(truth.items()) if x not in index.instances][:6]
    added = [(_photo(visitors / "views" / x / q.name, q, "phone"), x) for q, x in known[:2]]
    unknown_photos = [_photo(visitors / "unknown" / q.name, q, "phone") for q in unknown]
    assert len(added) + 1 < STAFF_VIEWS_MIN <= len(added) + len(unknown_photos)
    # fewer than STAFF_VIEWS_MIN: references only, the calibration left as it was
    run(update_index(index, added=added, unknown_views=unknown_photos[:1]))
    assert Index.load(index.path).verdict["staff_views"] == {"known": 0, "unknown": 0}
    report = run(update_index(Index.load(index.path), unknown_views=unknown_photos))
    verdict = report.index.verdict
    assert verdict["staff_views"] == {"known": len(added), "unknown": len(unknown_photos)}
    used = {e["path"] for e in verdict["evidence"]}
    assert {str(p) for p in unknown_photos} <= used and {str(p) for p, _ in added} <= used
    # a later plain update keeps them; the CLI's info says how many
    run(update_index(Index.load(index.path)))
    assert Index.load(index.path).verdict["staff_views"] == verdict["staff_views"]
    from museum_search.cli import main

    assert main(["info", str(index.path)]) == 0
    total = len(added) + len(unknown_photos)
    assert (f"calibrated with {total} visitor photos confirmed by staff: {len(added)} of known objects, "
            f"{len(unknown_photos)} not in the collection") in capsys.readouterr().out


# ---- the review queue (core.visitors) and `museum-search review` ---------------------------------


@pytest.fixture()
def queue(built):
    """(index, log, {kept id: the painting it shows, "" when not in the collection}): phone-like
    photos answered by the index and kept through a real VisitorLog (keep "unsure")."""
    from museum_search.core.visitors import KeepPolicy, VisitorLog

    index, folder, truth = built
    log = VisitorLog.open(index.path, KeepPolicy(keep="unsure"), folder=folder)
    pipe = QueryPipeline(index, QuerySettings())
    shows = {}
    for q, x in sorted(truth.items())[:40]:
        img = degrade(load_image(q, max_side=1024), "phone-hard", photo_seed("phone-hard", q.name))
        (answer,) = pipe.answer([query_from_array(img, q.name)])
        kept = log.record(answer, source="phone", image=img)
        if kept is not None:
            shows[kept.id] = x if x in index.instances else ""
    yield index, log, shows
    log.close()


def _not_recognised(log, shows, index) -> tuple[str, str]:
    for k in log.kept("new"):
        if shows[k.id] and not k.in_collection:
            return k.id, shows[k.id]
    pytest.fail("no kept photo of a known painting was not recognised")


def test_this_is_object_x_then_not_in_collection_then_discard(queue, paintings):
    from museum_search.core.visitors import add_views_job, discard, mark_unknown

    index, log, shows = queue
    ref, x = _not_recognised(log, shows, index)
    kept_file = log.photo(ref).path
    before_coll, before_index = _snapshot(paintings[0]), _snapshot(index.path)
    with pytest.raises(MuseumSearchError, match=x):  # a misspelt object: refused, named, nothing changed
        run(add_views_job(index.path, log, [ref], x[:-1] + "x"))
    assert _snapshot(index.path) == before_index and log.photo(ref).status == "new" and kept_file.is_file()

    report = run(add_views_job(index.path, log, [ref, kept_file], x))  # by id and by path: one photo
    assert report.added == 1
    photo = log.photo(ref)
    assert photo.status == "added" and photo.instance == x and not kept_file.exists()
    assert photo.path == log.folder / "views" / x / kept_file.name and photo.path.is_file()
    assert _snapshot(paintings[0]) == before_coll  # the collection untouched
    loaded = Index.load(index.path)
    assert {it.path: it.instance for it in loaded.items}[str(photo.path)] == x
    answer = _answer(loaded, photo.path)
    assert answer.in_collection and answer.top.instance == x
    with pytest.raises(MuseumSearchError, match="already added"):
        run(add_views_job(index.path, log, [ref], x))
    with pytest.raises(MuseumSearchError, match="reference view"):
        discard(log, [ref])

    others = [k.id for k in log.kept("new") if not shows[k.id]]
    assert others, "no photo of a painting not in the collection was kept"
    mark_unknown(log, others)
    assert all(log.photo(r).status == "unknown" and log.photo(r).path.parent == log.folder / "unknown"
               for r in others)
    rest = [k.id for k in log.kept("new")]
    if rest:
        gone = log.photo(rest[0]).path
        discard(log, rest[:1])
        assert not gone.exists()
        with pytest.raises(MuseumSearchError):
            log.photo(rest[0])


def test_review_cli(queue, capsys, monkeypatch):
    from museum_search.cli import main
    from museum_search.core.jobs import _indexing

    index, log, shows = queue
    ref, x = _not_recognised(log, shows, index)
    args = ["review", str(index.path), "--visitors", str(log.folder)]
    assert main([*args, "--list"]) == 0
    listed = capsys.readouterr().out
    assert ref in listed and f"{len(log.kept('new'))} kept photo(s) to review" in listed

    assert main([*args, "--add", ref, "--as", x[:-1] + "x"]) == 1
    assert x in capsys.readouterr().err

    # Ctrl-C while the photo is described: 130, and nothing changed
    files, kept_file = _snapshot(index.path), log.photo(ref).path
    def interrupted(*a, **k):
        raise KeyboardInterrupt
        yield

    with monkeypatch.context() as m:
        m.setattr(_indexing, "extract", interrupted)
        assert main([*args, "--add", ref, "--as", x]) == 130
    capsys.readouterr()  # (its line names the indexes this test process saved before: the builds)
    assert _snapshot(index.path) == files and kept_file.is_file() and log.photo(ref).status == "new"
    assert not (log.folder / "views" / x / kept_file.name).exists()

    assert main([*args, "--add", ref, "--as", x]) == 0
    out = capsys.readouterr().out
    assert f"1 photo(s) added as views of {x} in " in out and log.photo(ref).status == "added"
    assert main([*args, "--discard", ref]) == 1  # a reference view now: refused
