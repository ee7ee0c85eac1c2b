"""The visitor page of ``museum-search serve`` in a real browser (issue 22).

Debian's Chromium, headless, driven by Playwright (``executable_path``: ``playwright install`` is
not needed), at phone size (360×740, touch, mobile). The real server runs in a child process on an
index of the bundled sample collection whose catalogue has French columns (``title@fr``,
``description@fr``). The page is asked what a visitor's photo shows through the file input (the
``capture`` input a phone opens its camera with), and the test reads the card; it checks the "not
in this collection" path, the busy answer (503 + Retry-After: the page says so and retries), the
server's error messages, the language switch (a French phone gets the French title and words), and
that the live viewfinder appears only where a browser allows a camera and sends its frame.

Needs /usr/bin/chromium (``apt-get install chromium``) and ``playwright`` (the dev extra; both
installed by ``tools/install.sh --dev``). Without them the tests are skipped, except in CI
(``CI`` set), where they fail.

Screenshots of the answer and of "not found" go to a temporary folder, or to
``$MUSEUM_SEARCH_SCREENSHOTS`` when set (``MUSEUM_SEARCH_SCREENSHOTS=docs/screenshots`` refreshes
``docs/screenshots/serve-answer.png`` and ``serve-not-found.png``).
"""

from __future__ import annotations

import base64
import csv
import json
import os
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import pytest

pytestmark = [pytest.mark.browser, pytest.mark.slow]

PHONE = {"viewport": {"width": 360, "height": 740}, "device_scale_factor": 2, "is_mobile": True, "has_touch": True}
OUTLINE_RGB = (0xE8, 0xB4, 0x5A)  # the page's outline colour
# French titles of the sample's objects (the catalogue's title@fr column)
TITLES_FR = {
    "valley_at_dusk": "Vallée au crépuscule",
    "composition_rby": "Composition en rouge, bleu et jaune n° 3",
    "twelve_suns": "Douze soleils",
    "wind_over_wheat": "Le vent sur les blés",
    "ochre_tessellation": "Pavage ocre et sarcelle",
    "undulation": "Ondulation",
    "improvisation_circles": "Improvisation avec des cercles",
    "turbulent_night": "Nuit turbulente",
    "three_fields_of_ember": "Trois champs de braise",
    "still_life_pears": "Nature morte aux poires et au pichet bleu",
    "harbour_lights": "Lumières du port",
    "rose_window": "Rosace",
}
DESCRIPTION_FR = {
    "wind_over_wheat": "Le vent couche les blés en vagues dorées sous un ciel d’orage. "
                       "Chaque coup de pinceau suit un champ de vecteurs tiré au hasard.",
}
# visitor photos of resources/sample/queries (see its ground_truth.csv): a known painting, recognised
# with confidence ≥ 0.95 by the default pipeline, and one that is not in the collection
KNOWN = ("q19.jpg", "wind_over_wheat", "Wind over the Wheat", "Workshop of the Gaussian Kernel")
UNKNOWN = "q08.jpg"


def _unavailable(reason: str):
    if os.environ.get("CI"):
        pytest.fail(f"{reason}: the browser tests must run in CI (tools/install.sh --dev installs it)")
    pytest.skip(reason)


@pytest.fixture(scope="module")
def chromium() -> str:
    path = next((p for p in (shutil.which("chromium"), shutil.which("chromium-browser")) if p), None)
    if path is None:
        _unavailable("Debian's chromium is not installed (apt-get install chromium)")
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:
        _unavailable("playwright is not installed (pip install playwright, or the dev extra)")
    return path


@pytest.fixture(scope="module")
def served_index(tmp_path_factory, sample_collection) -> Path:
    """An index of the sample collection with a catalogue in English and French."""
    from museum_search.core.index._store import LabellingSpec
    from museum_search.core.jobs._indexing import build_index
    from museum_search.core.progress import drive

    root = tmp_path_factory.mktemp("serve-browser")
    coll = root / "collection"
    coll.mkdir()
    for f in (sample_collection / "collection").glob("*.jpg"):
        shutil.copy2(f, coll / f.name)
    with open(sample_collection / "catalogue.csv", encoding="utf-8", newline="") as f:
        rows = list(csv.DictReader(f))
    fields = ["file", "instance", "title", "title@fr", "artist", "year", "description", "description@fr"]
    with open(coll / "catalogue.csv", "w", encoding="utf-8", newline="") as f:
        w = csv.DictWriter(f, fieldnames=fields)
        w.writeheader()
        for r in rows:
            w.writerow({**r, "title@fr": TITLES_FR[r["instance"]], "description@fr": DESCRIPTION_FR.get(r["instance"], "")})
    out = root / "index"
    drive(build_index(coll, out, labelling=LabellingSpec("catalogue", str(coll / "catalogue.csv"))))
    return out


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextmanager
def _serving(index: Path, log: Path):
    """``museum-search serve INDEX --port P`` in a child process; yields its base URL."""
    port = _free_port()
    with open(log, "wb") as out:
        proc = subprocess.Popen([sys.executable, "-m", "museum_search", "serve", str(index),
                                 "--host", "127.0.0.1", "--port", str(port)],
                                stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 180  # loads the network and warms it up first
        while True:
            if proc.poll() is not None:
                pytest.fail(f"the server stopped (exit {proc.returncode}):\n{log.read_text(errors='replace')[-3000:]}")
            try:
                with urllib.request.urlopen(base + "/api/info", timeout=2) as r:
                    if r.status == 200:
                        break
            except OSError:
                pass
            if time.monotonic() > deadline:
                pytest.fail(f"the server did not answer in 180 s:\n{log.read_text(errors='replace')[-3000:]}")
            time.sleep(0.25)
        yield base
    finally:
        proc.terminate()
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)


@pytest.fixture(scope="module")
def server(served_index, tmp_path_factory):
    with _serving(served_index, tmp_path_factory.mktemp("serve-log") / "serve.log") as base:
        yield base


@pytest.fixture(scope="module")
def browser(chromium):
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        # a fake camera (a test pattern) that needs no permission prompt, for the live viewfinder
        b = p.chromium.launch(executable_path=chromium, headless=True,
                              args=["--use-fake-device-for-media-stream", "--use-fake-ui-for-media-stream"])
        yield b
        b.close()


@pytest.fixture(scope="module")
def shots(tmp_path_factory) -> Path:
    d = os.environ.get("MUSEUM_SEARCH_SCREENSHOTS")
    out = Path(d) if d else tmp_path_factory.mktemp("screenshots")
    out.mkdir(parents=True, exist_ok=True)
    return out


class Phone:
    """A page at phone size, with its console errors and its /api/identify requests recorded."""

    def __init__(self, browser, base: str, locale: str = "en-GB", **kw):
        self.context = browser.new_context(locale=locale, **PHONE, **kw)
        self.page = self.context.new_page()
        self.errors: list[str] = []
        self.identify: list[str] = []
        self.page.on("console", lambda m: self.errors.append(f"{m.text} {m.location.get('url', '')}")
                     if m.type == "error" else None)
        self.page.on("pageerror", lambda e: self.errors.append(str(e)))
        self.page.on("requestfailed", lambda r: self.errors.append(f"{r.url}: {r.failure}"))
        self.page.on("request", lambda r: self.identify.append(r.url) if "/api/identify" in r.url else None)
        self.page.set_default_timeout(60_000)
        self.page.goto(base + "/")
        # /api/info answered: the collection's size is shown
        self.page.wait_for_function("() => document.getElementById('collection-size').textContent !== ''")

    def send(self, photo: Path | dict) -> None:
        self.page.set_input_files("#photo", photo)

    def text(self, selector: str) -> str:
        return self.page.inner_text(selector).strip()

    def visible(self, selector: str) -> bool:
        return self.page.is_visible(selector)

    def wait_answer(self) -> str:
        """Waits for the card or "not found"; returns which."""
        self.page.wait_for_selector("#answer:not([hidden]), #not-found:not([hidden])", state="visible")
        return "answer" if self.visible("#answer") else "not-found"

    def close(self) -> None:
        self.context.close()


@pytest.fixture()
def phone(browser, request):
    made = []

    def make(base: str | None = None, **kw) -> Phone:
        p = Phone(browser, base or request.getfixturevalue("server"), **kw)
        made.append(p)
        return p

    yield make
    for p in made:
        p.close()


def _outline_pixels(page) -> int:
    """How many pixels of the visitor-photo canvas have the outline's colour."""
    return page.evaluate("""([r, g, b]) => {
        const c = document.getElementById('visitor-photo');
        const d = c.getContext('2d').getImageData(0, 0, c.width, c.height).data;
        let n = 0;
        for (let i = 0; i < d.length; i += 4)
            if (Math.abs(d[i] - r) < 8 && Math.abs(d[i + 1] - g) < 8 && Math.abs(d[i + 2] - b) < 8) n++;
        return n;
    }""", list(OUTLINE_RGB))


def test_phone_photo_gets_the_card(phone, sample_collection, shots):
    p = phone()
    page = p.page
    assert page.evaluate("document.documentElement.lang") == "en"
    assert p.text("#take") == "Take a photo"
    box = page.locator("#take").bounding_box()
    assert box["height"] >= 48 and box["width"] >= 300  # a large touch target at 360 px
    assert p.text("#collection-size") == "12 objects"
    assert p.visible("#live-start")  # localhost is a secure context: the live camera is offered
    assert not p.visible("#answer") and not p.visible("#not-found")

    name, instance, title, artist = KNOWN
    with page.expect_response(lambda r: "/api/identify" in r.url) as resp:
        p.send(sample_collection / "queries" / name)
    doc = resp.value.json()
    assert p.wait_answer() == "answer"
    assert doc["in_collection"] and doc["results"][0]["instance"] == instance
    assert "lang=" not in p.identify[0]  # the catalogue has no English columns: the default ones
    assert p.text("#answer-title") == title
    assert p.text("#answer-artist") == artist
    assert p.text("#answer-description").startswith(doc["results"][0]["metadata"]["description"][:30])
    assert p.text("#answer-confidence") == "We are sure it is this one"  # confidence ≥ 0.95: core's "sure"
    assert doc["confidence"] >= 0.9 and doc["confidence_band"] == "sure"
    page.wait_for_function("() => document.getElementById('answer-photo').complete"
                           " && document.getElementById('answer-photo').naturalWidth > 0")
    assert page.get_attribute("#answer-photo", "alt") == title
    # the visitor's photo with the evidence outline drawn on it
    assert doc["evidence"]["outline"] and len(doc["evidence"]["outline"]) == 4
    w, h = page.evaluate("[document.getElementById('visitor-photo').width, document.getElementById('visitor-photo').height]")
    pw, ph = doc["evidence"]["photo_size"]
    assert abs(w / h - pw / ph) < 0.02  # the photo keeps its shape
    assert _outline_pixels(page) > 300
    assert p.text("#status") == ""
    assert page.evaluate("document.documentElement.scrollWidth") <= 360  # nothing wider than the phone
    page.evaluate("window.scrollTo(0, 0)")
    page.screenshot(path=str(shots / "serve-answer.png"), full_page=True)
    assert p.errors == []


def test_not_in_the_collection(phone, sample_collection, shots):
    p = phone()
    with p.page.expect_response(lambda r: "/api/identify" in r.url) as resp:
        p.send(sample_collection / "queries" / UNKNOWN)
    assert resp.value.json()["in_collection"] is False
    assert p.wait_answer() == "not-found"
    assert not p.visible("#answer")
    assert "This does not seem to be in this collection. Try another angle, closer, with less glare." in p.text("#not-found")
    # a known photo after it: the card replaces the message
    p.send(sample_collection / "queries" / KNOWN[0])
    p.page.wait_for_selector("#answer", state="visible")
    assert not p.visible("#not-found")
    # and back, for the screenshot
    p.send(sample_collection / "queries" / UNKNOWN)
    p.page.wait_for_selector("#not-found", state="visible")
    p.page.evaluate("window.scrollTo(0, 0)")
    p.page.screenshot(path=str(shots / "serve-not-found.png"), full_page=True)
    assert p.errors == []


def test_busy_server_retries_after_retry_after(phone, sample_collection):
    p = phone()
    page = p.page
    answered = []

    def busy_once(route):
        if not answered:
            answered.append(503)
            route.fulfill(status=503, headers={"Retry-After": "2"}, content_type="application/json",
                          body=json.dumps({"error": "busy, try again"}))
        else:
            answered.append("server")
            route.continue_()

    page.route("**/api/identify*", busy_once)
    t0 = time.monotonic()
    p.send(sample_collection / "queries" / KNOWN[0])
    page.wait_for_function("() => document.getElementById('status').textContent === 'Busy, trying again…'")
    assert p.wait_answer() == "answer"
    assert time.monotonic() - t0 >= 1.9  # it waited Retry-After seconds
    assert answered == [503, "server"]
    assert p.text("#answer-title") == KNOWN[2] and p.text("#status") == ""
    page.unroute("**/api/identify*")

    # always busy: the page gives up after a few tries and says so
    tries = []

    def always_busy(route):
        tries.append(1)
        route.fulfill(status=503, headers={"Retry-After": "1"}, content_type="application/json",
                      body=json.dumps({"error": "busy, try again"}))

    page.route("**/api/identify*", always_busy)
    p.send(sample_collection / "queries" / KNOWN[0])
    page.wait_for_function("() => document.getElementById('status').textContent.startsWith('Still busy')", timeout=30_000)
    assert len(tries) == 6  # the first try and 5 retries
    assert not p.visible("#answer") and not p.visible("#not-found")


#: what each phone reads when it sends a text file (the API's code not_an_image, in its words)
NOT_A_PHOTO = {"en-GB": "This file is not a photo we can read. Please send a photo (JPEG, PNG or WebP).",
               "fr-FR": "Ce fichier n’est pas une photo lisible. Envoyez une photo (JPEG, PNG ou WebP).",
               "de-DE": "Diese Datei ist kein lesbares Foto. Bitte senden Sie ein Foto (JPEG, PNG oder WebP)."}


@pytest.mark.parametrize("locale", sorted(NOT_A_PHOTO))
def test_server_errors_are_shown_in_the_phones_language(phone, locale):
    """Issue 35, item 4: the API's English message never reaches a French or German phone; the
    page words the error's code."""
    p = phone(locale=locale)
    with p.page.expect_response(lambda r: "/api/identify" in r.url) as resp:
        p.send({"name": "notes.txt", "mimeType": "text/plain", "buffer": b"not a photo at all\n"})
    assert resp.value.status == 415 and resp.value.json()["code"] == "not_an_image"
    p.page.wait_for_selector("#status.error")
    assert p.text("#status") == NOT_A_PHOTO[locale]
    assert resp.value.json()["error"] not in p.text("#status")
    assert not p.visible("#answer") and not p.visible("#not-found")


def test_french_phone_gets_french(phone, sample_collection):
    p = phone(locale="fr-FR")
    page = p.page
    page.wait_for_function("() => document.documentElement.lang === 'fr'")
    assert p.text("#take") == "Prendre une photo"
    assert p.text("h1") == "Quel est cet objet ?"
    assert p.text("#collection-size") == "12 objets"
    p.send(sample_collection / "queries" / KNOWN[0])
    assert p.wait_answer() == "answer"
    assert "lang=fr" in p.identify[-1]
    assert p.text("#answer-title") == TITLES_FR[KNOWN[1]]  # the title@fr column
    assert p.text("#answer-description") == DESCRIPTION_FR[KNOWN[1]]
    assert p.text("#answer-artist") == KNOWN[3]  # no artist@fr: the default column
    assert p.text("#answer-confidence") == "Nous sommes sûrs que c’est celui-ci"
    p.send(sample_collection / "queries" / UNKNOWN)
    page.wait_for_selector("#not-found", state="visible")
    assert "Cela ne semble pas faire partie de cette collection" in p.text("#not-found")
    assert p.errors == []


def test_german_phone_gets_german_words_and_the_default_columns(phone, sample_collection):
    """German words in the page; the catalogue has no German columns: the default ones, no lang=."""
    p = phone(locale="de-DE")
    assert p.page.evaluate("document.documentElement.lang") == "de"
    assert p.text("#take") == "Foto aufnehmen"
    p.send(sample_collection / "queries" / KNOWN[0])
    assert p.wait_answer() == "answer"
    assert "lang=" not in p.identify[-1]
    assert p.text("#answer-title") == KNOWN[2]
    assert p.text("#answer-confidence") == "Wir sind sicher: Es ist dieses Objekt"


def test_live_viewfinder_only_where_a_camera_is_allowed(phone):
    # plain HTTP on the museum Wi-Fi (not a secure context): only the file input
    p = phone()
    p.page.add_init_script("Object.defineProperty(window, 'isSecureContext', {value: false})")
    p.page.reload()
    p.page.wait_for_function("() => document.getElementById('collection-size').textContent !== ''")
    assert p.visible("#take") and not p.visible("#live") and not p.visible("#shutter")

    # localhost (secure): the viewfinder with the fake camera; the shutter sends a frame
    q = phone(permissions=["camera"])
    assert q.visible("#live-start") and not q.visible("#shutter")
    q.page.click("#live-start")
    q.page.wait_for_function("() => document.getElementById('video').videoWidth > 0")
    assert q.visible("#shutter")
    size = q.page.evaluate("() => [document.getElementById('video').videoWidth, document.getElementById('video').videoHeight]")
    with q.page.expect_response(lambda r: "/api/identify" in r.url) as resp:
        q.page.click("#shutter")
    assert resp.value.status == 200
    doc = resp.value.json()
    assert doc["query"] == "camera.jpg"
    w, h = doc["evidence"]["photo_size"]  # the frame, decoded (the server may scale it down)
    assert abs(w / h - size[0] / size[1]) < 0.01
    q.wait_answer()  # the test pattern is no painting; any answer will do
    q.page.click("#live-stop")
    assert not q.visible("#shutter") and q.visible("#live-start")
    assert q.page.evaluate("document.getElementById('video').srcObject") is None
    assert p.errors == [] and q.errors == []


# ---- a real painting: ../shared/data/paintings ------------------------------------------------
PAINTINGS_FR = {"bbdd_00170": "Tête de jeune fille", "bbdd_00192": "Port de Barcelone"}


@pytest.fixture(scope="module")
def paintings_server(shared_data, tmp_path_factory):
    """The real server on 22 paintings of ../shared/data/paintings, with a title@fr column."""
    from museum_search.core.index._store import LabellingSpec
    from museum_search.core.jobs._indexing import build_index
    from museum_search.core.progress import drive

    data = shared_data / "paintings"
    with open(data / "catalogue.csv", encoding="utf-8", newline="") as f:
        rows = {r["instance"]: r for r in csv.DictReader(f)}
    keep = [f"bbdd_{i:05d}" for i in range(20)] + sorted(PAINTINGS_FR)
    root = tmp_path_factory.mktemp("paintings-serve")
    coll = root / "collection"
    coll.mkdir()
    with open(coll / "catalogue.csv", "w", encoding="utf-8", newline="") as f:
        w = csv.writer(f)
        w.writerow(["file", "instance", "title", "title@fr", "artist"])
        for inst in keep:
            r = rows[inst]
            shutil.copy2(data / "references" / r["file"], coll / r["file"])
            w.writerow([r["file"], inst, r["title"], PAINTINGS_FR.get(inst, ""), r["artist"]])
    drive(build_index(coll, root / "index", labelling=LabellingSpec("catalogue", str(coll / "catalogue.csv"))))
    with _serving(root / "index", root / "serve.log") as base:
        yield base, data, rows


@pytest.mark.data
@pytest.mark.parametrize("locale", ["en-US", "fr-FR"])
def test_painting_photo_gets_its_card(phone, paintings_server, locale):
    base, data, rows = paintings_server
    p = phone(base, locale=locale)
    queries = data / "queries" / "qsd1_w1"
    with open(queries / "ground_truth.csv", encoding="utf-8", newline="") as f:
        truth = {r["query"]: r["instance"] for r in csv.DictReader(f)}
    for query in ("00001.jpg", "00010.jpg"):  # visitor photos of bbdd_00170 and bbdd_00192
        instance = truth[query]
        assert instance in PAINTINGS_FR
        with p.page.expect_response(lambda r: "/api/identify" in r.url) as resp:
            p.send(queries / query)
        doc = resp.value.json()
        assert p.wait_answer() == "answer", doc["reason"]
        assert doc["results"][0]["instance"] == instance
        title = PAINTINGS_FR[instance] if locale == "fr-FR" else rows[instance]["title"]
        assert p.text("#answer-title") == title
        assert p.text("#answer-artist") == rows[instance]["artist"]
        assert _outline_pixels(p.page) > 100
    assert p.errors == []


def test_several_objects_get_a_card_each(phone, server, sample_collection):
    """Issue 36, item 4: an answer naming two objects shows "2 objects in this photo" and a card
    for each (the server's answer, with a second object put in its ``objects`` as core gives it)."""
    p = phone()
    seen: dict = {}

    def two_objects(route):
        import httpx  # the page's own request, sent again from here (a route loses a form's file)

        photo = (sample_collection / "queries" / KNOWN[0]).read_bytes()
        doc = httpx.post(server + "/api/identify", files={"photo": (KNOWN[0], photo)}, timeout=60).json()
        first, second = doc["results"][0], doc["results"][1]
        doc["objects"] = [{"instance": r["instance"], "confidence": c, "reason": "matched", "region": None,
                           "id": r["id"], "image": r["image"], "metadata": r["metadata"], "confidence_band": band}
                          for r, c, band in ((first, 0.97, "sure"), (second, 0.7, "likely"))]
        seen.update(doc)
        route.fulfill(status=200, content_type="application/json", body=json.dumps(doc))

    p.page.route("**/api/identify*", two_objects)
    p.send(sample_collection / "queries" / KNOWN[0])
    assert p.wait_answer() == "answer"
    p.page.wait_for_selector("#objects", state="visible")
    assert p.text("#objects-title") == "2 objects in this photo"
    titles = [t.strip() for t in p.page.locator("#object-cards h3").all_inner_texts()]
    assert titles == [o["metadata"].get("title") or o["instance"] for o in seen["objects"]]
    assert [t.strip() for t in p.page.locator("#object-cards p").all_inner_texts()] == [
        "We are sure it is this one", "Probably this one"]
    p.page.unroute("**/api/identify*")
    p.send(sample_collection / "queries" / KNOWN[0])  # one object: no such section
    p.page.wait_for_function("() => document.getElementById('objects').hidden")
    assert p.errors == []


#: records what the page posts to /api/identify: each form's photo, as base64, in window.__sent
RECORD_SENT = """(() => {
  const fetch0 = window.fetch;
  window.__sent = [];
  window.fetch = async function (url, options) {
    const body = options && options.body;
    if (String(url).includes("/api/identify") && body instanceof FormData) {
      const bytes = new Uint8Array(await body.get("photo").arrayBuffer());
      let s = "";
      for (let i = 0; i < bytes.length; i++) s += String.fromCharCode(bytes[i]);
      window.__sent.push(btoa(s));
    }
    return fetch0.apply(this, arguments);
  };
})();"""


def test_a_large_photo_is_scaled_down_in_the_page_and_answered_as_the_cli_would(
        phone, server, served_index, sample_collection, tmp_path):
    """Issue 33, item 2: the page scales a 12-megapixel photo to /api/info's photo_side before
    sending it (a few hundred KB, not MB), and the answer is the CLI's for the pixels sent."""
    import cv2

    name, instance = KNOWN[:2]
    small = cv2.imread(str(sample_collection / "queries" / name))
    big = cv2.resize(small, (4000, round(4000 * small.shape[0] / small.shape[1])), interpolation=cv2.INTER_CUBIC)
    original = tmp_path / "phone-photo.jpg"
    cv2.imwrite(str(original), big, [cv2.IMWRITE_JPEG_QUALITY, 97])
    p = phone()
    p.page.add_init_script(RECORD_SENT)
    p.page.reload()
    p.page.wait_for_function("() => document.getElementById('collection-size').textContent !== ''")
    side = p.page.evaluate("fetch('/api/info').then(r => r.json()).then(i => i.photo_side)")
    with p.page.expect_response(lambda r: "/api/identify" in r.url) as resp:
        p.send(original)
    doc = resp.value.json()
    assert p.wait_answer() == "answer" and doc["results"][0]["instance"] == instance
    (sent,) = p.page.evaluate("window.__sent")
    photo = base64.b64decode(sent)
    shape = cv2.imdecode(np.frombuffer(photo, np.uint8), cv2.IMREAD_COLOR).shape
    assert max(shape[:2]) == side and side == 640
    assert abs(shape[1] / shape[0] - big.shape[1] / big.shape[0]) < 0.01  # its shape is kept
    print(f"sent {len(photo):,} bytes for a {original.stat().st_size:,}-byte photo")
    assert len(photo) * 10 < original.stat().st_size
    assert doc["evidence"]["photo_size"] == [shape[1], shape[0]]  # the server answered from the pixels sent
    (tmp_path / "sent.jpg").write_bytes(photo)
    r = subprocess.run([sys.executable, "-m", "museum_search", "query", str(served_index), str(tmp_path / "sent.jpg"),
                        "--json"], capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr
    (cli,) = json.loads(r.stdout)
    assert ([x["instance"] for x in doc["results"]], doc["in_collection"], doc["confidence"], doc["inliers"]) == (
        [x["instance"] for x in cli["results"]], cli["in_collection"], cli["confidence"], cli["inliers"])
    assert p.errors == []


def test_the_notice_shows_only_where_photos_are_kept(phone, server):
    """Issue 34, item 4: the page says nothing new, except, where keeping is on, /api/info's one
    plain line of what is kept, in the phone's language."""
    p = phone()
    assert not p.visible("#notice")  # the default server keeps no photo: no line
    assert p.page.evaluate("fetch('/api/info').then(r => r.json()).then(i => i.notice)") is None
    from museum_search.core.visitors import KeepPolicy

    line = KeepPolicy(keep="unsure").notice("fr")
    asked = []

    def keeping(route):
        asked.append(route.request.url)
        doc = json.loads(route.fetch().text())
        route.fulfill(status=200, content_type="application/json", body=json.dumps({**doc, "notice": line}))

    fr = phone(locale="fr-FR")
    fr.page.route("**/api/info*", keeping)
    fr.page.reload()
    fr.page.wait_for_selector("#notice:not([hidden])")
    assert fr.text("#notice") == line and "lang=fr" in asked[-1]
    assert fr.errors == []
