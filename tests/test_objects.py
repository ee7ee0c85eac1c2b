"""Every object in the photo (``Answer.objects``) and region queries (``query --region``,
``/api/identify?region=``): a work beside another is a second object, not a rival; only the part of
the photo asked about is answered, and what is found is outlined in the whole photo's pixels."""

import csv
import json

import cv2
import numpy as np
import pytest

from museum_search.core.answer import RegionError, parse_region
from museum_search.core.answer._pipeline import QueryPipeline, load_query, query_from_bytes
from museum_search.core.evaluation._metrics import all_objects_found, extra_objects_named


def _truth(folder):
    rows = csv.DictReader(open(folder / "ground_truth.csv", encoding="utf-8"))
    out: dict[str, list[str]] = {}
    for row in rows:
        out.setdefault(row["query"], []).append(row["instance"])
    return out


@pytest.fixture(scope="module")
def pipe(sample_index):
    return QueryPipeline(sample_index)


@pytest.fixture(scope="module")
def sample_truth(sample_collection):
    return _truth(sample_collection / "queries")


@pytest.fixture(scope="module")
def wall(tmp_path_factory, sample_collection, sample_truth, pipe):
    """Two known sample photos side by side on one wall (a grey gap between them): (path, left
    instance, right instance, the width of the left photo and the gap)."""
    known = [q for q, inst in sample_truth.items() if inst[0]]
    answers = {q: pipe.answer([load_query(sample_collection / "queries" / q)])[0] for q in known}
    verified = [q for q in known if answers[q].in_collection and answers[q].top_inliers
                and answers[q].top.instance == sample_truth[q][0]]
    a, b = next((a, b) for a in verified for b in verified if sample_truth[a] != sample_truth[b])
    left, right = (cv2.imread(str(sample_collection / "queries" / q)) for q in (a, b))
    h = max(left.shape[0], right.shape[0])
    gap = 40
    canvas = np.full((h, left.shape[1] + gap + right.shape[1], 3), 128, np.uint8)
    canvas[: left.shape[0], : left.shape[1]] = left
    canvas[: right.shape[0], left.shape[1] + gap:] = right
    path = tmp_path_factory.mktemp("wall") / "wall.png"
    cv2.imwrite(str(path), canvas)
    return path, sample_truth[a][0], sample_truth[b][0], left.shape[1] + gap, right.shape


def test_a_single_object_photo_lists_its_answer_and_an_unknown_none(pipe, sample_collection, sample_truth):
    for q, inst in sample_truth.items():
        query = load_query(sample_collection / "queries" / q)
        answer = pipe.answer([query])[0]
        if not answer.in_collection:
            assert answer.objects == []  # an unknown photo lists none
            continue
        first = answer.objects[0]
        assert (first.instance, first.confidence, first.reason) == (answer.top.instance, answer.confidence,
                                                                    answer.reason)
        assert first.result == answer.top
        named = {o.instance for o in answer.objects}
        if inst[0]:
            assert named <= set(inst), (q, named)  # no wrong extra object
        if answer.top_inliers is not None and answer.top_inliers >= pipe.verdict.min_inliers:
            w, h = query.photo_size
            region = np.array(first.region)
            assert region.shape == (4, 2)
            lo, hi = region.min(axis=0), region.max(axis=0)
            assert lo[0] < w and lo[1] < h and hi[0] > 0 and hi[1] > 0  # on the photo (it may reach beyond)
        d = answer.to_dict()["objects"][0]
        assert set(d) == {"instance", "confidence", "reason", "region"}


def test_two_works_side_by_side_are_two_objects(pipe, wall):
    path, left, right, offset, _ = wall
    answer = pipe.answer([load_query(path)])[0]
    assert answer.in_collection
    named = [o.instance for o in answer.objects]
    assert sorted(named) == sorted([left, right]), [(o.instance, o.reason) for o in answer.objects]
    assert answer.rival == 0 or answer.rival * 2 <= (answer.top_inliers or 0)  # the other work is no rival
    for o in answer.objects:
        xs = np.array(o.region)[:, 0].mean()
        assert (xs < offset) == (o.instance == left)  # each outlined where it is


def test_a_region_query_answers_the_part_asked_about(pipe, wall, sample_index):
    from museum_search.cli import main

    path, left, right, offset, (rh, rw, _) = wall
    region = (offset, 0, rw, rh)
    query = load_query(path, region)
    assert query.size == (offset + rw, max(rh, cv2.imread(str(path)).shape[0])) and query.region is not None
    answer = pipe.answer([query])[0]
    assert answer.in_collection and answer.top.instance == right
    assert [o.instance for o in answer.objects] == [right]
    outline = np.array(answer.objects[0].region)
    assert outline[:, 0].mean() > offset  # in the whole photo's pixels, where the right work is
    # the same from bytes (an upload) and from the command line
    again = pipe.answer([query_from_bytes(path.read_bytes(), "wall.png", region)])[0]
    assert again.objects[0].region == answer.objects[0].region
    assert main(["query", str(sample_index.path), str(path), "--region", ",".join(map(str, region)), "--json"]) == 0


def test_bad_regions_are_refused_with_a_clear_error(wall, sample_index, capsys):
    from museum_search.cli import main

    path, *_ = wall
    for text in ("1,2,3", "a,b,c,d", "1,2,3,nan"):
        with pytest.raises(RegionError, match="x,y,w,h"):
            parse_region(text)
    w, h = cv2.imread(str(path)).shape[1::-1]
    with pytest.raises(RegionError, match="not inside"):
        load_query(path, (w - 10, 0, 20, 20))
    with pytest.raises(RegionError, match="not inside"):
        load_query(path, (-1, 0, 20, 20))
    with pytest.raises(RegionError, match="empty"):
        load_query(path, (0, 0, 0, 20))
    assert main(["query", str(sample_index.path), str(path), "--region", f"0,0,{w + 1},{h}"]) != 0
    err = capsys.readouterr().err
    assert "not inside" in err and "Traceback" not in err


def test_the_api_gives_objects_and_asks_about_a_region(sample_index, wall):
    from fastapi.testclient import TestClient

    from museum_search.serve.app import create_app

    path, left, right, offset, (rh, rw, _) = wall
    with TestClient(create_app(sample_index.path, workers=1)) as client:
        files = {"photo": ("wall.png", path.read_bytes(), "image/png")}
        doc = client.post("/api/identify", files=files).json()
        assert sorted(o["instance"] for o in doc["objects"]) == sorted([left, right])
        for o in doc["objects"]:
            assert set(o) >= {"instance", "confidence", "reason", "region", "id", "image"}
            assert client.get(o["image"]).status_code == 200
        r = client.post("/api/identify", params={"region": f"{offset},0,{rw},{rh}"}, files=files)
        assert [o["instance"] for o in r.json()["objects"]] == [right]
        bad = client.post("/api/identify", params={"region": "0,0,99999,5"}, files=files)
        assert bad.status_code == 422 and "not inside" in bad.json()["error"]
        bad = client.post("/api/identify", params={"region": "left"}, files=files)
        assert bad.status_code == 422 and "x,y,w,h" in bad.json()["error"]


def test_object_figures():
    named = [["a"], ["a", "b"], ["a"], [], ["c"]]
    relevant = [["a"], ["a", "b"], ["a", "b"], [], []]
    assert all_objects_found(named, relevant) == pytest.approx(2 / 3)  # the photos with objects
    assert extra_objects_named(named, relevant) == pytest.approx(1 / 5)  # the open-set one names "c"


@pytest.mark.data
@pytest.mark.slow
def test_a_real_wall_of_two_paintings_names_both(shared_data, paintings_index_path):
    from museum_search.core.index import Index

    index = Index.load(paintings_index_path)
    folder = shared_data / "paintings" / "queries" / "qsd2_w3"
    truth = _truth(folder)
    pipe = QueryPipeline(index)
    answer = pipe.answer([load_query(folder / "00005.jpg")])[0]
    assert sorted(o.instance for o in answer.objects) == sorted(truth["00005.jpg"])
    regions = [np.array(o.region) for o in answer.objects]
    assert all(r.shape == (4, 2) for r in regions)
    assert abs(regions[0][:, 0].mean() - regions[1][:, 0].mean()) > 100  # side by side, each where it is
    doc = json.loads(json.dumps(answer.to_dict()))
    assert len(doc["objects"]) == 2
