"""A bounded fuzzer over the web API's requests (issue 33, item 6): Hypothesis draws methods, paths,
query strings, headers and bodies (multipart photos of random, cut or bit-flipped image bytes,
random bodies) and sends them to the real app (the sample index, in process). Every request gets
an answer: never a 5xx, every error is ``{"error", "code"}`` JSON. ``FUZZ_EXAMPLES`` sets the
number of inputs per test (200 in CI; e.g. ``FUZZ_EXAMPLES=5000`` for a longer run)."""

from __future__ import annotations

import os
import warnings

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

warnings.filterwarnings("ignore", message=".*httpx.*", category=DeprecationWarning)
from fastapi.testclient import TestClient  # noqa: E402

from museum_search.serve import create_app  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")
EXAMPLES = int(os.environ.get("FUZZ_EXAMPLES", "200"))
PATHS = ["/api/identify", "/api/objects", "/api/info", "/healthz", "/", "/api/objects/{id}",
         "/api/objects/{id}/image", "/openapi.json", "/static/index.html"]
ASCII = st.text(st.characters(min_codepoint=32, max_codepoint=126), max_size=40)


@pytest.fixture(scope="module")
def fuzz_client(sample_index, sample_collection):
    app = create_app(sample_index.path, workers=1, max_upload=1 << 20)
    with TestClient(app, raise_server_exceptions=False) as c:
        oid = c.get("/api/objects?per_page=1").json()["items"][0]["id"]
        photo = sorted((sample_collection / "queries").glob("*.jpg"))[0].read_bytes()
        yield c, oid, photo


@st.composite
def photo_bytes(draw, real: bytes) -> bytes:
    kind = draw(st.sampled_from(["real", "cut", "flipped", "random", "header"]))
    if kind == "real":
        return real
    if kind == "cut":
        return real[: draw(st.integers(0, len(real)))]
    if kind == "flipped":
        data = bytearray(real)
        for _ in range(draw(st.integers(1, 20))):
            i = draw(st.integers(0, len(data) - 1))
            data[i] = draw(st.integers(0, 255))
        return bytes(data)
    if kind == "header":
        return draw(st.sampled_from([b"\xff\xd8\xff", b"\x89PNG\r\n\x1a\n", b"RIFF\x00\x00\x00\x00WEBP", b"BM"])) \
            + draw(st.binary(max_size=200))
    return draw(st.binary(max_size=2000))


def check(r) -> None:
    assert r.status_code < 500, (r.status_code, r.text[:300])
    if r.status_code >= 400:
        doc = r.json()
        assert set(doc) == {"error", "code"} and doc["error"], doc


def test_identify_answers_every_photo_and_form(fuzz_client):
    client, _oid, real = fuzz_client
    seen: list[int] = []

    @settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=list(HealthCheck), database=None)
    @given(data=st.data())
    def run(data):
        photo = data.draw(photo_bytes(real))
        field = data.draw(st.sampled_from(["photo", "photo", "image", ""]))
        params = {}
        if data.draw(st.booleans()):
            params["region"] = data.draw(st.one_of(ASCII, st.builds(
                lambda *v: ",".join(map(str, v)), *[st.integers(-50, 3000)] * 4)))
        if data.draw(st.booleans()):
            params["lang"] = data.draw(ASCII)
        if data.draw(st.booleans()):
            r = client.post("/api/identify", params=params, files={field or "x": ("p.jpg", photo, "image/jpeg")})
        else:
            ctype = data.draw(st.sampled_from(["multipart/form-data; boundary=xyz", "multipart/form-data",
                                               "image/jpeg", "text/plain", ""]))
            r = client.post("/api/identify", params=params, content=data.draw(st.binary(max_size=500)),
                            headers={"Content-Type": ctype} if ctype else {})
        check(r)
        seen.append(r.status_code)
        if r.status_code == 200:
            assert {"in_collection", "results", "objects"} <= set(r.json())

    run()
    print(f"identify: {len(seen)} inputs, statuses {sorted(set(seen))}, {seen.count(200)} answered")
    assert len(seen) >= EXAMPLES and 200 in seen and 415 in seen


def test_every_route_answers_any_request(fuzz_client):
    client, oid, _real = fuzz_client

    @settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=list(HealthCheck), database=None)
    @given(method=st.sampled_from(["GET", "POST", "PUT", "DELETE", "HEAD", "OPTIONS", "PATCH"]),
           path=st.one_of(st.sampled_from(PATHS), ASCII.map(lambda t: "/" + t.lstrip("/"))),
           oid_kind=st.sampled_from(["ours", "text"]), text=ASCII,
           params=st.dictionaries(st.sampled_from(["q", "page", "per_page", "size", "lang", "region", "x"]),
                                  ASCII, max_size=4))
    def run(method, path, oid_kind, text, params):
        path = path.replace("{id}", oid if oid_kind == "ours" else text.replace("/", "") or "x")
        try:
            r = client.request(method, path, params=params)
        except Exception as exc:  # an URL httpx itself refuses is no request to the server
            if "Invalid" in type(exc).__name__ or "URL" in str(exc):
                return
            raise
        check(r) if method != "HEAD" else None

    run()
