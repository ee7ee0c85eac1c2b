"""``serve``'s handlers alone (issue 32): each route is a module-level function on ``serve.app.router``
that reads what it needs from ``request.app.state``, so an app made of the router and a state set by
hand answers without an index, a network or a worker pool.
"""

from __future__ import annotations

import asyncio
import warnings
from contextlib import contextmanager
from pathlib import Path
from types import SimpleNamespace

import anyio
import cv2
import numpy as np
import pytest

warnings.filterwarnings("ignore", message=".*httpx.*", category=DeprecationWarning)
from fastapi import FastAPI  # noqa: E402
from fastapi.testclient import TestClient  # noqa: E402
from starlette.requests import Request  # noqa: E402

from museum_search.serve.app import EXCEPTION_HANDLERS, Ids, catalogue_page, healthz, router, row_of  # noqa: E402
from museum_search.serve.upload import ApiError  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")


class FakeCatalogue:
    """Three objects; ``match`` finds the titles that contain the text."""

    def __init__(self):
        self.items = [SimpleNamespace(instance=f"obj{i}", path=f"obj{i}.jpg",
                                      metadata={"title": f"Title {i}", "title@fr": f"Titre {i}"}) for i in range(3)]

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, row: int):
        return self.items[row]

    def match(self, q: str):
        return None if not q else [i for i, it in enumerate(self.items) if q in it.metadata["title"]]

    def rows(self, rows):
        return [self.items[r] for r in rows]


class FakePool:
    """Answers at once with what ``identify`` hands to its worker (the function and its arguments)."""

    workers, busy, queued = 3, 1, 2

    @contextmanager
    def admission(self):
        yield

    def check_room(self):
        pass

    async def run(self, fn, *args):
        query, prefs, ids, visitors, decoded, language, client = args
        return {"fn": fn.__name__, "name": query.name, "shape": list(query.image.shape), "prefs": prefs,
                "visitors": str(visitors), "language": language, "client": client}


class FakeIndex:
    root = Path("/nowhere/collection")
    instances = ["a", "b"]

    def __len__(self) -> int:
        return 3


def small_app(**state) -> FastAPI:
    """The router alone, its exception handlers, and ``state``."""
    app = FastAPI()
    for exc_class, handler in EXCEPTION_HANDLERS.items():
        app.add_exception_handler(exc_class, handler)
    app.include_router(router)
    defaults = dict(index=FakeIndex(), pool=FakePool(), ids=Ids(b"key", 3), catalogue=FakeCatalogue(),
                    languages=["fr"], visitors=None, image_limiter=anyio.CapacityLimiter(1),
                    decode_limiter=anyio.CapacityLimiter(1),
                    max_upload=1 << 20, body_timeout=5.0)
    for key, value in {**defaults, **state}.items():
        setattr(app.state, key, value)
    return app


def test_info_and_healthz_read_the_state():
    with TestClient(small_app()) as c:
        assert c.get("/healthz").json() == {"status": "ok", "references": 3, "workers": 3, "busy": 1, "queued": 2}
        info = c.get("/api/info").json()
        assert {k: info[k] for k in ("name", "objects", "references", "languages")} == {
            "name": "collection", "objects": 2, "references": 3, "languages": ["fr"]}


def test_objects_one_object_and_unknown_ids_on_a_fake_catalogue():
    app = small_app()
    ids = app.state.ids
    with TestClient(app) as c:
        doc = c.get("/api/objects?q=Title 1&lang=fr").json()
        assert doc["total"] == 1 and doc["items"] == [{"id": ids.make(1), "instance": "obj1",
                                                        "metadata": {"title": "Titre 1"},
                                                        "image": f"/api/objects/{ids.make(1)}/image"}]
        assert c.get("/api/objects?per_page=2&page=2").json()["items"][0]["instance"] == "obj2"
        assert c.get(f"/api/objects/{ids.make(2)}").json()["metadata"] == {"title": "Title 2"}
        r = c.get("/api/objects/0-0000000000")
        assert r.status_code == 404 and "no object has this id" in r.json()["error"]
        r = c.get(f"/api/objects/{ids.make(0)}/image")  # the fake photo is not in any folder
        assert r.status_code == 404 and set(r.json()) == {"error", "code"} and r.json()["code"] == "not_found"


def test_identify_hands_the_decoded_photo_and_the_state_to_a_worker(tmp_path):
    """The photo is decoded before it takes a worker's place: the worker gets its pixels, and what is
    not an image is refused (415) without a worker."""
    ok, jpeg = cv2.imencode(".jpg", np.full((30, 40, 3), 128, np.uint8))
    with TestClient(small_app(visitors=tmp_path, decode_limiter=anyio.CapacityLimiter(1))) as c:
        r = c.post("/api/identify?lang=pt-BR", files={"photo": ("a.jpg", jpeg.tobytes(), "image/jpeg")})
        assert r.json() == {"fn": "answer_photo", "name": "a.jpg", "shape": [30, 40, 3], "prefs": ["pt-br", "pt"],
                            "visitors": str(tmp_path), "language": "pt", "client": "testclient"}
        r = c.post("/api/identify", files={"photo": ("a.jpg", b"\xff\xd8\xff" + bytes(100), "image/jpeg")})
        assert r.status_code == 415 and r.json()["code"] == "not_an_image"
    with TestClient(small_app(max_upload=50)) as c:  # the limit comes from the state too
        r = c.post("/api/identify", files={"photo": ("a.jpg", bytes(100), "image/jpeg")})
        assert r.status_code == 413


def test_a_handler_is_a_plain_coroutine_and_the_helpers_plain_functions():
    app = small_app()
    request = Request({"type": "http", "app": app, "method": "GET", "path": "/healthz", "headers": []})
    assert asyncio.run(healthz(request))["workers"] == 3
    ids = Ids(b"key", 3)
    page = catalogue_page(FakeCatalogue(), ids, "", 1, 2, [])
    assert page["total"] == 3 and [it["instance"] for it in page["items"]] == ["obj0", "obj1"]
    assert row_of(ids, ids.make(2)) == 2
    with pytest.raises(ApiError):
        row_of(ids, "3-" + ids.make(2).split("-")[1])


def test_a_staff_confirmed_view_shows_a_photo_of_its_object(tmp_path):
    """A visitor's photo staff added as a view (kept outside the collection, an absolute path) is
    never served; the image of its id is a collection photo of the same object (issue 34)."""
    from museum_search.serve.app import shown_rows

    root = tmp_path / "collection"
    root.mkdir()
    ok, jpeg = cv2.imencode(".jpg", np.full((20, 30, 3), 200, np.uint8))
    (root / "a-1.jpg").write_bytes(jpeg.tobytes())
    staff = tmp_path / "visitors" / "views" / "a" / "x.jpg"
    staff.parent.mkdir(parents=True)
    staff.write_bytes(jpeg.tobytes())
    items = [SimpleNamespace(instance="a", path="a-1.jpg", metadata={}),
             SimpleNamespace(instance="a", path=str(staff), metadata={}),
             SimpleNamespace(instance="b", path=str(staff), metadata={})]  # no photo of b in the collection
    assert shown_rows(items) == {1: 0}
    catalogue = FakeCatalogue()
    catalogue.items = items
    index = SimpleNamespace(root=root, instances=["a", "b"], __len__=lambda: 3)
    app = small_app(catalogue=catalogue, index=index, shown=shown_rows(items))
    ids = app.state.ids
    with TestClient(app) as c:
        r = c.get(f"/api/objects/{ids.make(1)}/image")
        assert r.status_code == 200 and r.headers["content-type"] == "image/jpeg"
        assert c.get(f"/api/objects/{ids.make(2)}/image").status_code == 404
