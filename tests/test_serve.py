"""``museum-search serve`` (issue 22): the JSON API over the one query pipeline.

Fast tests drive the app in process with FastAPI's TestClient on an index of the bundled sample
collection; the slow-client tests run the real uvicorn server (the header-timeout protocol of
``serve.server``) on a loopback socket; the data test compares ``/api/identify`` with
``museum-search query --json`` on every paintings query photo.
"""

from __future__ import annotations

import json
import shutil
import socket
import subprocess
import sys
import threading
import time
import warnings
from pathlib import Path

import cv2
import numpy as np
import pytest

warnings.filterwarnings("ignore", message=".*httpx.*", category=DeprecationWarning)
from fastapi.testclient import TestClient  # noqa: E402

from museum_search.core.answer._pipeline import QueryPipeline, load_query  # noqa: E402
from museum_search.core.answer._presentation import CONFIDENCE_BANDS, confidence_band  # noqa: E402
from museum_search.serve import create_app  # noqa: E402
from museum_search.serve import server as serve_server  # noqa: E402
from museum_search.serve.app import CODES, CSP, language_preferences, localize  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")
STATIC_PAGE = Path(__file__).resolve().parents[1] / "museum_search" / "serve" / "static" / "index.html"


@pytest.fixture(scope="module")
def app(sample_index):
    if not STATIC_PAGE.exists():  # the page is another engineer's file: a placeholder only if missing
        STATIC_PAGE.parent.mkdir(parents=True, exist_ok=True)
        try:
            with open(STATIC_PAGE, "x", encoding="utf-8") as f:
                f.write("<!doctype html><title>museum-search</title><p>placeholder</p>\n")
        except FileExistsError:
            pass
    return create_app(sample_index.path, workers=2)


@pytest.fixture(scope="module")
def client(app):
    with TestClient(app) as c:
        yield c


def photo(path: Path, name: str | None = None) -> dict:
    return {"photo": (name or path.name, path.read_bytes(), "image/jpeg")}


def queries(sample_collection) -> list[tuple[Path, str]]:
    lines = (sample_collection / "queries" / "ground_truth.csv").read_text().splitlines()[1:]
    return [(sample_collection / "queries" / q, inst) for q, inst in (line.split(",") for line in lines)]


def check_security_headers(r) -> None:
    assert r.headers["content-security-policy"] == CSP
    assert r.headers["x-content-type-options"] == "nosniff"
    assert r.headers["referrer-policy"] == "no-referrer"
    assert "access-control-allow-origin" not in r.headers


def check_error(r, status: int) -> str:
    assert r.status_code == status, (r.status_code, r.text)
    assert r.headers["content-type"].startswith("application/json")
    doc = r.json()
    assert set(doc) == {"error", "code"} and len(doc["error"]) > 10 and doc["code"] == CODES[status]
    check_security_headers(r)
    return doc["error"]


# ---- answers -------------------------------------------------------------------------------------


def test_identify_gives_the_pipeline_answer(client, sample_index, sample_collection):
    pipe = QueryPipeline(sample_index)
    for path, _ in queries(sample_collection):
        r = client.post("/api/identify", files=photo(path))
        assert r.status_code == 200, r.text
        check_security_headers(r)
        got = r.json()
        answer = pipe.answer([load_query(path)])[0]
        want = answer.to_dict()
        assert got["in_collection"] == want["in_collection"]
        assert got["confidence"] == want["confidence"]
        assert got["reason"] == want["reason"]
        assert [x["instance"] for x in got["results"]] == [x["instance"] for x in want["results"]]
        assert got["query"] == path.name
        assert set(got) == set(want) | {"timing", "evidence", "confidence_band"}
        assert got["confidence_band"] == confidence_band(answer.confidence)  # core's band, not the page's
        assert set(got["timing"]) == {"decode_ms", "describe_ms", "search_ms", "verify_ms", "total_ms"}
        img = cv2.imread(str(path))
        assert got["evidence"]["photo_size"] == [img.shape[1], img.shape[0]]  # sample photos are small
        if got["in_collection"] and got["inliers"] is not None and got["inliers"] >= pipe.verdict.min_inliers:
            outline = got["evidence"]["outline"]
            assert outline is not None and len(outline) == 4 and all(len(p) == 2 for p in outline)
        for res in got["results"]:
            assert "path" not in res and str(sample_index.root) not in json.dumps(res)
            assert set(res) == {"rank", "score", "cosine", "inliers", "id", "image", "instance", "metadata"}


def test_the_same_answer_reads_the_same_in_the_kiosk_and_on_the_phone(client, sample_index, sample_collection):
    """The API's band is core's, and the kiosk's sentence is the one of that band; the phone page
    has words for every band in each of its languages."""
    from museum_search.gui.demo_window import CONFIDENCE_WORDS, confidence_words

    pipe = QueryPipeline(sample_index)
    bands = set()
    for path, _ in queries(sample_collection):
        answer = pipe.answer([load_query(path)])[0]
        band = client.post("/api/identify", files=photo(path)).json()["confidence_band"]
        assert band == confidence_band(answer.confidence)
        assert confidence_words(answer.confidence) == ("" if band is None else CONFIDENCE_WORDS[band])
        bands.add(band)
    assert "sure" in bands and len(bands) >= 2  # the sample is answered in more than one band
    page = STATIC_PAGE.read_text(encoding="utf-8")
    for band, _ in CONFIDENCE_BANDS:  # en, fr, de
        assert page.count(f"\n      {band}: \"") == 3, band


def test_result_ids_resolve_and_images_are_small_jpegs(client, sample_collection):
    top = client.post("/api/identify", files=photo(sample_collection / "queries" / "q02.jpg")).json()["results"][0]
    item = client.get(f"/api/objects/{top['id']}").json()
    assert item["instance"] == top["instance"] and item["metadata"] == top["metadata"]
    assert top["image"] == f"/api/objects/{top['id']}/image"
    for size in (32, 200, 2048):
        r = client.get(f"{top['image']}?size={size}")
        assert r.status_code == 200 and r.headers["content-type"] == "image/jpeg"
        assert "max-age" in r.headers["cache-control"]
        img = cv2.imdecode(np.frombuffer(r.content, np.uint8), cv2.IMREAD_COLOR)
        assert img is not None and max(img.shape[:2]) <= size
    assert client.get(top["image"], headers={"If-None-Match": r.headers["etag"].replace("2048", "512")}).status_code == 304
    for size in (0, 31, 2049, "x"):
        check_error(client.get(f"{top['image']}?size={size}"), 400)


def test_objects_are_filtered_and_paginated(client, sample_index):
    every = client.get("/api/objects?per_page=100").json()
    assert every["total"] == len(sample_index) and len(every["items"]) == len(sample_index)
    ids = [it["id"] for it in every["items"]]
    assert len(set(ids)) == len(ids)
    pages = [client.get(f"/api/objects?per_page=10&page={p}").json() for p in (1, 2, 3, 4, 5, 6)]
    assert [it["id"] for p in pages for it in p["items"]] == ids
    assert pages[-1]["items"] == [] and pages[0]["total"] == len(sample_index)
    valley = client.get("/api/objects?q=valley dusk").json()
    assert valley["total"] == 4 and {it["instance"] for it in valley["items"]} == {"valley_at_dusk"}
    assert client.get("/api/objects?q=nothing-like-this").json()["total"] == 0
    check_error(client.get("/api/objects?per_page=101"), 400)
    check_error(client.get("/api/objects?page=0"), 400)


def test_info_healthz_and_openapi(client, sample_index):
    info = client.get("/api/info").json()
    assert info["references"] == len(sample_index) and info["objects"] == len(sample_index.instances)
    assert info["name"] == sample_index.root.name and info["languages"] == [] and info["version"]
    health = client.get("/healthz").json()
    assert health == {"status": "ok", "references": len(sample_index), "workers": 2, "busy": 0, "queued": 0}
    spec = client.get("/openapi.json").json()
    assert {"/api/identify", "/api/objects", "/api/objects/{oid}", "/api/objects/{oid}/image", "/healthz",
            "/api/info"} <= set(spec["paths"])
    assert "multipart/form-data" in spec["paths"]["/api/identify"]["post"]["requestBody"]["content"]
    for path in ("/docs", "/redoc"):  # they would load their assets from a CDN
        check_error(client.get(path), 404)
    r = client.get("/")
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/html")
    check_security_headers(r)


# ---- bad requests ----------------------------------------------------------------------------------


def test_bad_uploads_get_json_errors(client, sample_collection, tmp_path):
    from test_decode_budget import write_png_bomb

    good = (sample_collection / "queries" / "q01.jpg").read_bytes()
    big = b"\xff\xd8\xff" + bytes(50 << 20)
    assert "too large" in check_error(client.post("/api/identify", files={"photo": ("big.jpg", big)}), 413)

    def chunks():  # no Content-Length: the bytes are counted as they come
        for _ in range(25):
            yield bytes(1 << 20)

    check_error(client.post("/api/identify", content=chunks(),
                            headers={"Content-Type": "multipart/form-data; boundary=xyz"}), 413)
    bomb = write_png_bomb(tmp_path / "bomb.png", 20_000, 20_000)
    msg = check_error(client.post("/api/identify", files={"photo": ("bomb.png", bomb.read_bytes())}), 415)
    assert "20000" in msg.replace(",", "").replace(" ", "") or "memory" in msg or "large" in msg
    check_error(client.post("/api/identify", files={"photo": ("notes.txt", b"just some words\n" * 50)}), 415)
    check_error(client.post("/api/identify", files={"photo": ("half.jpg", good[: len(good) // 2])}), 415)
    check_error(client.post("/api/identify", files={"photo": ("empty.jpg", b"")}), 400)
    check_error(client.post("/api/identify", files={"picture": ("q01.jpg", good)}), 400)
    check_error(client.post("/api/identify", data={"photo": "not a file"}), 400)  # urlencoded
    check_error(client.post("/api/identify", content=good, headers={"Content-Type": "image/jpeg"}), 400)
    body = (b"--xyz\r\nContent-Disposition: form-data; name=\"photo\"; filename=\"a.jpg\"\r\n"
            b"Content-Type: image/jpeg\r\n\r\n" + good[:5000])
    assert "truncated" in check_error(client.post("/api/identify", content=body, headers={
        "Content-Type": "multipart/form-data; boundary=xyz"}), 400)
    check_error(client.post("/api/identify?lang=%3Cscript%3E", files=photo(sample_collection / "queries" / "q01.jpg")), 400)
    assert client.get("/healthz").json()["queued"] == 0  # nothing left admitted


def test_ids_are_opaque_and_unknown_routes_are_json(client):
    good = client.get("/api/objects?per_page=1").json()["items"][0]["id"]
    row, tag = good.split("-")
    forged = f"{int(row, 16) + 1:x}-{tag}"
    for oid in ("..%2F..%2Fetc%2Fpasswd", "%2Fetc%2Fpasswd", "..", "0", "zz-0000000000", forged,
                "fffffffffff-0000000000", "%00", "1" * 300):
        check_error(client.get(f"/api/objects/{oid}"), 404)
        check_error(client.get(f"/api/objects/{oid}/image"), 404)
    for path in ("/../etc/passwd", "/etc/passwd", "/api/objects/../../etc/passwd", "/static/../app.py",
                 "/api/nothing", "/index.php"):
        r = client.get(path)
        check_error(r, 404)
        assert "root:" not in r.text
    assert "GET" in check_error(client.post("/api/info"), 405)
    assert "POST" in check_error(client.get("/api/identify"), 405)
    check_error(client.delete(f"/api/objects/{good}"), 405)


def test_no_cors_unless_asked(client, sample_index):
    r = client.get("/api/info", headers={"Origin": "http://evil.example"})
    assert "access-control-allow-origin" not in r.headers
    r = client.options("/api/identify", headers={"Origin": "http://evil.example", "Access-Control-Request-Method": "POST"})
    assert "access-control-allow-origin" not in r.headers and r.status_code in (404, 405)
    with TestClient(create_app(sample_index.path, workers=1, allow_origin="https://guide.example")) as c:
        r = c.get("/api/info", headers={"Origin": "https://guide.example"})
        assert r.headers["access-control-allow-origin"] == "https://guide.example"
        r = c.get("/api/info", headers={"Origin": "http://evil.example"})
        assert "access-control-allow-origin" not in r.headers


# ---- a crowd -------------------------------------------------------------------------------------


def test_full_queue_answers_503_with_retry_after(sample_index, sample_collection, block):
    app = create_app(sample_index.path, workers=1, queue=1)
    q = photo(sample_collection / "queries" / "q02.jpg")
    with TestClient(app) as c:
        gate = block(QueryPipeline, "answer")
        out: dict[str, int] = {}

        def ask(key):
            out[key] = c.post("/api/identify", files=q).status_code

        first = threading.Thread(target=ask, args=("first",))
        first.start()
        assert gate.started.wait(30)  # the one worker is answering (blocked)
        second = threading.Thread(target=ask, args=("second",))
        second.start()
        deadline = time.monotonic() + 30
        while c.get("/healthz").json()["queued"] < 1:  # the second one waits in the queue
            assert time.monotonic() < deadline
            time.sleep(0.01)
        assert c.get("/healthz").json() == {"status": "ok", "references": len(sample_index), "workers": 1,
                                            "busy": 1, "queued": 1}
        r = c.post("/api/identify", files=q)
        assert check_error(r, 503) == "busy, try again" and r.headers["retry-after"] == "1"
        assert c.get("/api/info").status_code == 200  # the rest of the API still answers
        gate.release.set()
        first.join(60)
        second.join(60)
        assert out == {"first": 200, "second": 200}
        assert c.post("/api/identify", files=q).status_code == 200
        assert c.get("/healthz").json()["queued"] == 0


def test_nothing_is_stored_by_default(client, sample_index, sample_collection):
    """The index is never written; by default no photo is kept either (tests/test_serve_visitors.py)."""
    before = {p: p.stat().st_mtime_ns for p in sample_index.path.iterdir()}
    client.post("/api/identify", files=photo(sample_collection / "queries" / "q08.jpg"))
    assert {p: p.stat().st_mtime_ns for p in sample_index.path.iterdir()} == before


# ---- languages -------------------------------------------------------------------------------------


def test_language_preferences_and_localize():
    assert language_preferences("fr-FR") == ["fr-fr", "fr"]
    assert language_preferences("de") == ["de"] and language_preferences(None) == []
    meta = {"title": "Valley", "title@fr": "Vallée", "description": "Hills", "description@de": "Hügel", "year": "2026"}
    assert localize(meta, ["fr-fr", "fr"]) == {"title": "Vallée", "description": "Hills", "year": "2026"}
    assert localize(meta, []) == {"title": "Valley", "description": "Hills", "year": "2026"}
    assert localize(meta, ["it"]) == {"title": "Valley", "description": "Hills", "year": "2026"}


def test_lang_picks_per_language_columns(tmp_path, collection, sample_collection):
    from museum_search.core.index._store import LabellingSpec
    from museum_search.core.jobs._indexing import build_index
    from museum_search.core.progress import drive as run

    lines = (collection / "catalogue.csv").read_text(encoding="utf-8").splitlines()
    rows = [lines[0] + ",title@fr"] + [line + ",Titre " + line.split(",")[1] for line in lines[1:]]
    (collection / "catalogue.csv").write_text("\n".join(rows) + "\n", encoding="utf-8")
    out = tmp_path / "index"
    run(build_index(collection, out, labelling=LabellingSpec("catalogue", str(collection / "catalogue.csv"))))
    with TestClient(create_app(out, workers=1)) as c:
        assert c.get("/api/info").json()["languages"] == ["fr"]
        ref = sorted(collection.glob("*.jpg"))[0]
        fr = c.post("/api/identify?lang=fr-FR", files=photo(ref)).json()["results"][0]
        en = c.post("/api/identify?lang=en", files=photo(ref)).json()["results"][0]
        assert fr["metadata"]["title"] == "Titre " + fr["instance"] and "title@fr" not in fr["metadata"]
        assert en["metadata"]["title"] != fr["metadata"]["title"] and "title@fr" not in en["metadata"]
        item = c.get(f"/api/objects/{fr['id']}?lang=fr").json()
        assert item["metadata"]["title"] == fr["metadata"]["title"]


# ---- the real server: slow clients ---------------------------------------------------------------


@pytest.fixture()
def live(sample_index, monkeypatch):
    """The app under uvicorn with the serve protocol, on a loopback port: (host, port)."""
    import uvicorn

    monkeypatch.setattr(serve_server.GuardedH11, "header_timeout", 1.0)
    app = create_app(sample_index.path, workers=1, body_timeout=0.5)
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    config = uvicorn.Config(app, http=serve_server.GuardedH11, log_level="error", timeout_keep_alive=5,
                            h11_max_incomplete_event_size=serve_server.HEADER_LIMIT)
    srv = uvicorn.Server(config)
    t = threading.Thread(target=srv.run, kwargs={"sockets": [sock]}, daemon=True)
    t.start()
    deadline = time.monotonic() + 30
    while not srv.started:
        assert time.monotonic() < deadline
        time.sleep(0.02)
    yield sock.getsockname()
    srv.should_exit = True
    t.join(10)


def _get(addr, path: str) -> tuple[int, float]:
    import httpx

    t0 = time.perf_counter()
    r = httpx.get(f"http://{addr[0]}:{addr[1]}{path}", timeout=10)
    return r.status_code, time.perf_counter() - t0


def test_slow_clients_get_408_or_are_closed_while_others_are_answered(live, sample_collection):
    head = (b"POST /api/identify HTTP/1.1\r\nHost: x\r\nContent-Type: multipart/form-data; boundary=xyz\r\n"
            b"Content-Length: 100000\r\n\r\n")

    def drip(pause: float, head_only: bool = False) -> tuple[bytes, float]:
        s = socket.create_connection(live, timeout=10)
        t0 = time.perf_counter()
        got = b""
        try:
            data = head[:20] if head_only else head + b"--xyz\r\n"
            s.sendall(data)
            for _ in range(200):
                time.sleep(pause)
                s.sendall(b"a")
        except OSError:  # the server closed the connection
            pass
        try:
            got = s.recv(4096)
        except OSError:
            pass
        s.close()
        return got, time.perf_counter() - t0

    results: dict[str, tuple[bytes, float]] = {}
    threads = [threading.Thread(target=lambda k=k, a=a: results.__setitem__(k, drip(*a)))
               for k, a in (("idle", (1.0,)), ("drip", (0.1,)), ("headers", (0.3, True)))]
    for t in threads:
        t.start()
    time.sleep(0.2)
    latencies = [_get(live, "/healthz") for _ in range(5)]  # others are answered meanwhile
    assert all(code == 200 for code, _ in latencies)
    for t in threads:
        t.join(30)
    for key in ("idle", "drip"):
        got, took = results[key]
        assert got.startswith(b"HTTP/1.1 408"), (key, got[:200])
        # dropped at the body timeout (0.5 s here), long before the drip ends (20 s, 200 s)
        assert b'"error"' in got and took < 15
    got, took = results["headers"]
    assert got == b"" and took < 15  # closed at the header timeout (1 s here), not after 60 s of drips
    photo_bytes = (sample_collection / "queries" / "q02.jpg").read_bytes()
    import httpx

    r = httpx.post(f"http://{live[0]}:{live[1]}/api/identify", files={"photo": ("q.jpg", photo_bytes)}, timeout=60)
    assert r.status_code == 200 and r.json()["in_collection"]


# ---- getting visitors there ---------------------------------------------------------------------


def test_label_and_urls(tmp_path):
    png = serve_server.write_label(tmp_path / "label.png", "http://192.168.1.20:8000/", "Musée d'Orsay")
    assert png.read_bytes().startswith(b"\x89PNG")
    pdf = serve_server.write_label(tmp_path / "label.pdf", "http://192.168.1.20:8000/", "Paintings")
    assert pdf.read_bytes().startswith(b"%PDF")
    (tmp_path / "taken.png").write_bytes(b"someone else's")
    with pytest.raises(Exception, match="exists"):
        serve_server.write_label(tmp_path / "taken.png", "http://x/", "x")
    assert (tmp_path / "taken.png").read_bytes() == b"someone else's"
    with pytest.raises(Exception, match="png or .pdf"):
        serve_server.write_label(tmp_path / "label.svg", "http://x/", "x")
    assert serve_server.urls("127.0.0.1", 8000, False) == ["http://127.0.0.1:8000/"]
    assert serve_server.urls("0.0.0.0", 443, True)[-1] == "https://127.0.0.1/"
    assert "█" in serve_server.terminal_qr("http://127.0.0.1:8000/") or "▀" in serve_server.terminal_qr("http://x/")


def test_cli_serve_refuses_an_existing_label(tmp_path, sample_index, capsys):
    from museum_search.cli import main

    taken = tmp_path / "label.png"
    taken.write_bytes(b"x")
    assert main(["serve", str(sample_index.path), "--label", str(taken)]) == 1
    assert "exists" in capsys.readouterr().err and taken.read_bytes() == b"x"


# ---- identical answers on the real paintings ---------------------------------------------------------


@pytest.mark.data
@pytest.mark.slow
def test_paintings_answers_are_those_of_query_json(shared_data, tmp_path_factory, paintings_index_path):
    # a copy of the session's index: the service may write beside it
    path = shutil.copytree(paintings_index_path, tmp_path_factory.mktemp("paintings-serve") / "index")
    photos = sorted(p for p in (shared_data / "paintings" / "queries").glob("*/*")
                    if p.suffix.lower() in (".jpg", ".jpeg", ".png"))
    assert len(photos) >= 60
    r = subprocess.run([sys.executable, "-m", "museum_search", "query", str(path), *map(str, photos), "--json"],
                       capture_output=True, text=True, timeout=3600)
    assert r.returncode == 0, r.stderr
    cli = {Path(a["query"]).resolve(): a for a in json.loads(r.stdout)}
    assert len(cli) == len(photos)
    same = 0
    with TestClient(create_app(path)) as c:
        for p in photos:
            got = c.post("/api/identify", files=photo(p)).json()
            want = cli[p.resolve()]
            key = lambda a: (a["results"][0]["instance"] if a["results"] else None, a["in_collection"], a["confidence"])
            same += key(got) == key(want)
    print(f"paintings: {same} of {len(photos)} photos identical (top-1, verdict, confidence)")
    assert same == len(photos)


def test_serve_does_not_reach_into_core_or_qt():
    code = ("import sys; import museum_search.serve; "
            "print(any(m.startswith(('PySide6', 'museum_search.gui')) for m in sys.modules))")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.stdout.strip() == "False", r.stderr
    core = Path(__file__).resolve().parents[1] / "museum_search" / "core"
    assert not [f for f in core.rglob("*.py") if "museum_search.serve" in f.read_text() or "from ..serve" in f.read_text()]



