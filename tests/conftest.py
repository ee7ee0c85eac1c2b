import os
import signal
import tempfile
from pathlib import Path

# The Ctrl-C tests send SIGINT to the program in a child process. A runner may start the suite with
# SIGINT ignored (bash ignores it in a background job, and an ignored signal stays ignored across
# exec: the child would never see the Ctrl-C); a handled one is reset to the default in the child.
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)

# Qt offscreen and throw-away per-user folders, before anything imports Qt or platformdirs.
os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
_HOME = tempfile.mkdtemp(prefix="museum-search-test-home-")
for _var in ("XDG_CONFIG_HOME", "XDG_DATA_HOME", "XDG_CACHE_HOME"):
    os.environ[_var] = os.path.join(_HOME, _var.lower())

import pytest  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
SHARED_DATA = Path(os.environ.get("MUSEUM_SEARCH_SHARED_DATA", REPO.parent / "shared" / "data"))
SAMPLE = REPO / "resources" / "sample"


@pytest.fixture(scope="session")
def shared_data() -> Path:
    """The real labelled photos in ../shared/data. Fails in CI when missing; skips elsewhere."""
    if not (SHARED_DATA / "paintings" / "catalogue.csv").is_file():
        if os.environ.get("CI"):
            pytest.fail(f"shared data missing at {SHARED_DATA}: data tests must run in CI")
        pytest.skip(f"shared data not found at {SHARED_DATA}")
    return SHARED_DATA


@pytest.fixture(scope="session")
def sample_collection() -> Path:
    """The bundled, redistributable sample collection (resources/sample)."""
    assert (SAMPLE / "catalogue.csv").is_file(), "resources/sample is missing: run tools/make_sample_collection.py"
    return SAMPLE


@pytest.fixture(scope="session")
def sample_index(tmp_path_factory, sample_collection):
    """An index of the sample collection built once per test session with the default backbone."""
    from museum_search.core.index._store import LabellingSpec
    from museum_search.core.jobs._indexing import build_index
    from museum_search.core.progress import drive as run

    out = tmp_path_factory.mktemp("sample-index") / "index"
    report = run(build_index(sample_collection / "collection", out,
                             labelling=LabellingSpec("catalogue", str(sample_collection / "catalogue.csv"))))
    return report.index


@pytest.fixture(scope="session")
def paintings_index_path(shared_data, tmp_path_factory) -> Path:
    """The index of the paintings' 287 references with the default settings, built once per test
    session (a build with its calibration takes about a minute; four modules ask the same one). A
    test that may write into an index's folder (a service, the app) copies it first
    (``shutil.copytree``)."""
    from museum_search.core.jobs._indexing import build_index
    from museum_search.core.progress import drive as run

    out = tmp_path_factory.mktemp("paintings-default") / "index"
    run(build_index(shared_data / "paintings" / "references", out))
    return out


@pytest.fixture(scope="session")
def single_photo_index(tmp_path_factory, sample_collection):
    """The sample's objects with one reference photo each, like the paintings (no verification:
    a quick build): a collection ICFRR cannot help."""
    import shutil

    from museum_search.core.index._store import LabellingSpec
    from museum_search.core.jobs._indexing import build_index
    from museum_search.core.progress import drive as run

    coll = tmp_path_factory.mktemp("one-photo") / "collection"
    coll.mkdir()
    rows = ["file,instance"]
    for f in sorted((sample_collection / "collection").glob("*-1.jpg")):
        shutil.copy2(f, coll / f.name)
        rows.append(f"{f.name},{f.stem.rsplit('-', 1)[0]}")
    (coll / "catalogue.csv").write_text("\n".join(rows) + "\n", encoding="utf-8")
    return run(build_index(coll, None, labelling=LabellingSpec("catalogue", str(coll / "catalogue.csv")),
                           verification=False)).index


@pytest.fixture()
def block(monkeypatch):
    """``block(owner, "name")`` makes ``owner.name`` wait until ``.release`` is set, then do what it
    did; ``.started`` is set when it is called. Everything is released at the end of the test.
    (A job must stop while such a call still runs: cancelling never waits for it.)"""
    import threading
    from types import SimpleNamespace

    made = []

    def make(owner, name):
        b = SimpleNamespace(release=threading.Event(), started=threading.Event())
        real = getattr(owner, name)

        def blocked(*a, **k):
            b.started.set()
            b.release.wait(120)
            return real(*a, **k)

        monkeypatch.setattr(owner, name, blocked)
        made.append(b)
        return b

    yield make
    for b in made:
        b.release.set()


@pytest.fixture()
def collection(tmp_path, sample_collection):
    """A copy of 3 objects of the sample collection (so tests can change files)."""
    import shutil

    dst = tmp_path / "coll"
    dst.mkdir()
    files = sorted((sample_collection / "collection").glob("*.jpg"))
    instances = sorted({f.stem.rsplit("-", 1)[0] for f in files})[:3]
    keep = [f for f in files if f.stem.rsplit("-", 1)[0] in instances]
    for f in keep:
        shutil.copy2(f, dst / f.name)
    lines = (sample_collection / "catalogue.csv").read_text(encoding="utf-8").splitlines()
    rows = [lines[0]] + [line for line in lines[1:] if line.split(",")[0] in {f.name for f in keep}]
    (dst / "catalogue.csv").write_text("\n".join(rows) + "\n", encoding="utf-8")
    return dst
