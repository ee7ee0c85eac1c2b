"""The command line against Ctrl-C at any moment and damaged index files (issue 33, cases 9-11).

Each test reproduces what the trial found on the code before it: Ctrl-C during ``evaluate`` aborted
the process ("FATAL: exception not rethrown", exit 134) when a helper thread was still inside ONNX
Runtime or OpenCV as the interpreter finalized; a Ctrl-C while ONNX Runtime loaded was taken for a
failure of ONNX Runtime (the run went on with torch, exit 0); one that landed in a string ``exec``
made ``python -m museum_search`` die by SIGINT; ``info --check`` called an index with damaged
neighbour lists intact; ``query --rerank icfrr`` wrote a new generation of the index."""

from __future__ import annotations

import json
import os
import pickle
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import pytest

from museum_search.cli import main as cli_main
from museum_search.core.errors import reraise_interrupt
from museum_search.core.index._store import JOURNAL, LOCK, MANIFEST, Index, LabellingSpec
from museum_search.core.inference._backbones import BackboneConfig
from museum_search.core.jobs._indexing import build_index
from museum_search.core.progress import drive as run

REPO = Path(__file__).resolve().parents[1]
ABORTED = ("FATAL", "terminate called", "Fatal Python error", "Traceback", "Exception ignored")


@pytest.fixture(scope="module")
def sample_built(tmp_path_factory, sample_collection):
    """An index of the whole sample (42 references) and its labelled queries."""
    out = tmp_path_factory.mktemp("hardening-cli") / "index"
    run(build_index(sample_collection / "collection", out, BackboneConfig(size=96),
                    LabellingSpec("catalogue", str(sample_collection / "catalogue.csv"))))
    return out, sample_collection / "queries"


def _popen(args, **kw) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            cwd=REPO, env=dict(os.environ, PYTHONUNBUFFERED="1", **kw.pop("env", {})), **kw)


def _snapshot(folder: Path) -> dict[str, tuple[int, int]]:
    """Every file of ``folder`` with its size and modification time (what a write would change)."""
    return {p.name: (p.stat().st_size, p.stat().st_mtime_ns) for p in sorted(folder.iterdir())}


# ---- case 9: Ctrl-C at any moment of evaluate ----------------------------------------------------


@pytest.mark.slow
def test_ctrl_c_during_evaluate_exits_130_at_every_moment(sample_built):
    """SIGINT at 16 moments spread over a whole ``evaluate`` (loading, describing, answering): each
    exits 130 with the one line, never an abort. The code before aborted in 7 of 17 such tries."""
    index, queries = sample_built
    args = ["-m", "museum_search", "evaluate", str(index), str(queries)]
    t0 = time.monotonic()
    whole = _popen(args)
    whole.communicate(timeout=300)
    assert whole.returncode == 0
    span = time.monotonic() - t0  # the moments are spread over one run's length on this machine
    results = []
    for i in range(16):
        proc = _popen(args)
        time.sleep(0.15 * span + 0.8 * span * i / 15)
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=120)
        results.append((proc.returncode, err))
        if proc.returncode == 0:  # the run ended before the signal: it printed its whole summary
            assert "MP@1" in out, err
            continue
        assert proc.returncode == 130, err
        assert err.rstrip().endswith("museum-search: cancelled; nothing was changed"), err
        assert not any(a in err for a in ABORTED), err
    assert sum(rc == 130 for rc, _ in results) >= 12, [rc for rc, _ in results]


_ANSWER_HELD = textwrap.dedent("""
    import sys
    from museum_search.cli import main
    from museum_search.core.answer import _pipeline

    real, calls = _pipeline.QueryPipeline.answer, []

    def answer(self, *a, **k):
        calls.append(1)
        if len(calls) == 3:  # the third query: a long call in ONNX Runtime (C++), on the helper thread
            print("answering", flush=True)
            for _ in range(6):
                self.embed(list(a[0]) * 8)
            print("answered", flush=True)
        return real(self, *a, **k)

    _pipeline.QueryPipeline.answer = answer
    raise SystemExit(main(sys.argv[1:]))
""")


@pytest.mark.slow
def test_ctrl_c_while_a_query_is_answered_waits_for_the_call_then_exits_130(sample_built):
    """The signal comes exactly while the helper thread is inside a long ONNX Runtime call: the
    exit lets that call end before the interpreter finalizes (before, the thread was torn down
    inside C++: an abort, or no "answered")."""
    index, queries = sample_built
    proc = _popen(["-c", _ANSWER_HELD, "evaluate", str(index), str(queries), "--engine", "onnx"])
    line = proc.stdout.readline()
    if line.strip() == "answering":
        proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=120)
    assert line.strip() == "answering", (line, err)
    assert proc.returncode == 130, err
    assert "museum-search: cancelled; nothing was changed" in err
    assert not any(a in err for a in ABORTED), err
    assert "answered" in out  # the running call was let finish, not torn down


def test_ctrl_c_inside_a_string_exec_still_exits_130(sample_built, tmp_path):
    """numpy and scipy import with a string ``exec``: an interrupt that ends one leaves CPython's
    "unhandled interrupt" flag set, and ``python -m`` then killed itself with SIGINT (-2) after
    printing the message. Injected exactly: ``info``'s handler interrupts inside such an exec."""
    index, _ = sample_built
    (tmp_path / "sitecustomize.py").write_text(textwrap.dedent("""
        import museum_search.cli as cli

        def interrupted_info(args):
            exec("raise KeyboardInterrupt", {})

        cli.cmd_info = interrupted_info
    """))
    proc = _popen(["-m", "museum_search", "info", str(index)], env={"PYTHONPATH": f"{tmp_path}:{REPO}"})
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, (proc.returncode, err)
    assert err.strip() == "museum-search: cancelled; nothing was changed"


def test_an_interrupt_python_cannot_raise_is_not_lost(sample_built, monkeypatch, capsys):
    """A Ctrl-C that lands in a weakref callback or a ``__del__`` (the import system has such
    callbacks) is printed as "Exception ignored" and lost: the command went on to its end, exit 0."""
    import museum_search.cli as cli

    index, _ = sample_built

    class Unlucky:
        def __del__(self):
            raise KeyboardInterrupt

    def info(args):
        Unlucky()  # the interrupt lands here, where Python cannot raise it
        for _ in range(50):
            time.sleep(0.02)
        print("went on to the end")
        return 0

    monkeypatch.setattr(cli, "cmd_info", info)
    assert cli_main(["info", str(index)]) == 130
    captured = capsys.readouterr()
    assert "went on to the end" not in captured.out
    # (the message of an interrupt; this process built the fixture's index, so it may say "saved")
    assert captured.err.startswith("museum-search: ") and "Exception ignored" not in captured.err


def test_ctrl_c_while_onnx_runtime_loads_is_not_taken_for_its_failure(monkeypatch):
    """pybind11 reports an interrupt during a native module's import as ImportError("initialization
    failed") caused by it; the engine took that for ONNX Runtime failing and went on with torch."""
    from museum_search.core.inference import _engines

    def interrupted(*a, **k):
        try:
            raise KeyboardInterrupt
        except KeyboardInterrupt as exc:
            raise ImportError("initialization failed") from exc

    monkeypatch.setattr(_engines, "OnnxExtractor", interrupted)
    monkeypatch.setattr(_engines, "_sessions", {})
    with pytest.raises(KeyboardInterrupt):
        _engines.onnx_extractor(BackboneConfig(size=96))
    with pytest.raises(KeyboardInterrupt):  # the rule itself
        _chained_interrupt()
    reraise_interrupt(ValueError("a real failure"))  # anything else is left to the caller


def _chained_interrupt():
    try:
        try:
            raise KeyboardInterrupt
        except KeyboardInterrupt as exc:
            raise ImportError("initialization failed") from exc
    except ImportError as exc:
        reraise_interrupt(exc)


# ---- cases 10 and 11: damaged neighbour lists; readers never write ------------------------------


def _neighbours_file(out: Path) -> Path:
    return out / json.loads((out / MANIFEST).read_text())["files"]["neighbours"]


def _damage(f: Path, how: str) -> None:
    size = f.stat().st_size
    if how == "random bytes":
        f.write_bytes(np.random.default_rng(0).integers(0, 256, size, dtype=np.uint8).tobytes())
    else:  # a pickled array, saved with numpy as an object array, of the same size
        arr = np.empty(1, dtype=object)
        arr[0] = np.zeros(3)
        with open(f, "wb") as fp:
            np.save(fp, arr, allow_pickle=True)
        data = f.read_bytes()
        f.write_bytes(data + b"\0" * max(0, size - len(data)))
        assert pickle.PROTO in f.read_bytes()


@pytest.fixture()
def copied(sample_built, tmp_path):
    import shutil

    out = tmp_path / "index"
    shutil.copytree(sample_built[0], out)
    (out / LOCK).unlink(missing_ok=True)
    return out, sample_built[1]


@pytest.mark.parametrize("how", ["random bytes", "pickled array"])
def test_info_check_reports_damaged_neighbour_lists(copied, how, capsys):
    out, _ = copied
    f = _neighbours_file(out)
    _damage(f, how)
    assert cli_main(["info", "--check", str(out)]) == 1
    captured = capsys.readouterr()
    assert f"damaged: {f.name}" in captured.out
    assert "intact" not in captured.out
    assert "1 data file(s)" in captured.err and f"museum-search update {out}" in captured.err
    # without --check, info still says so (and exits 0: the index answers, the lists are computed)
    assert cli_main(["info", str(out)]) == 0
    assert f"damaged: {f.name}" in capsys.readouterr().out


def test_query_with_icfrr_on_damaged_lists_writes_nothing_and_update_stores_them(copied, capsys, caplog):
    out, queries = copied
    _damage(_neighbours_file(out), "random bytes")
    before = _snapshot(out)
    q = str(sorted(queries.glob("*.jpg"))[0])
    assert cli_main(["query", str(out), q, "--rerank", "icfrr", "-k", "3", "--no-verify"]) == 0
    assert _snapshot(out) == before  # not one file written, renamed or touched
    err = caplog.text  # the CLI prints core's warnings on stderr (pytest captures them here)
    assert "computed for this run only" in err and f"museum-search update {out} stores them" in err
    assert cli_main(["update", str(out)]) == 0  # the writer stores them again
    capsys.readouterr()
    assert cli_main(["info", "--check", str(out)]) == 0
    assert "intact" in capsys.readouterr().out
    assert Index.load(out).neighbours_stored == 32


def test_longer_lists_for_one_query_are_not_written_and_update_stores_them_when_asked(copied, capsys, caplog):
    out, queries = copied
    before = _snapshot(out)
    q = str(sorted(queries.glob("*.jpg"))[0])
    assert cli_main(["query", str(out), q, "--rerank", "icfrr", "--kg", "40", "--no-verify", "--json"]) == 0
    assert _snapshot(out) == before
    assert f"museum-search update {out} --neighbours 40 stores them" in caplog.text
    assert not (out / JOURNAL).exists()
    assert cli_main(["update", str(out), "--neighbours", "40"]) == 0
    assert Index.load(out).neighbours_stored == 40
    caplog.clear()
    assert cli_main(["query", str(out), q, "--rerank", "icfrr", "--kg", "40", "--no-verify", "--json"]) == 0
    assert "computed for this run only" not in caplog.text


# ---- cases 12, 13 and 16: every number checked against its meaning; a changed query set --------------


@pytest.mark.parametrize("option, value, named", [
    ("-k", "0", "-k: the number of results"), ("-k", "-3", "-k: the number of results"),
    ("--min-inliers", "-5", "--min-inliers: the matching points"), ("--kg", "0", "--kg: ICFRR's K_g"),
    ("--beta", "nan", "--beta: ICFRR's beta"), ("--verify-top", "-1", "--verify-top:"),
    ("--threshold", "2", "--threshold: a cosine"), ("--qe-n", "0", "--qe-n:"), ("--iterations", "0", "--iterations:"),
])
def test_query_options_are_checked_against_their_meaning(sample_built, capsys, option, value, named):
    """``-k 0`` answered "NOT in this collection (the collection is empty)"; ``--min-inliers -5``
    failed with "max() arg is an empty sequence"."""
    index, queries = sample_built
    q = str(sorted(queries.glob("*.jpg"))[0])
    assert cli_main(["query", str(index), q, option, value]) == 1
    captured = capsys.readouterr()
    assert captured.out == ""  # no answer printed
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"museum-search: error: {named}"), lines
    assert repr(float(value)) in lines[0] or value in lines[0]


def test_settings_are_checked_in_core_for_every_view():
    """The check is QuerySettings' own: the app, the web service and a run's JSON get it too."""
    from museum_search.core.answer import QuerySettings, RerankOptions, Verdict
    from museum_search.core.answer._verdict import Model
    from museum_search.core.errors import SettingsError

    model = Model(("cosine", "margin", "inliers", "rival"), (0.5, 0.1, 2.0, 1.0), (0.1, 0.1, 1.0, 1.0),
                  (1.0, 1.0, 1.0, -1.0), 0.0, 0.5)
    QuerySettings(verdict=Verdict(model_verified=model))  # a sound model passes
    bad = {
        "k": dict(k=-5), "verify_top": dict(verify_top=-1), "search": dict(search="fast"),
        "options.k_g": dict(options=RerankOptions(k_g=0)), "options.icfrr_mode": dict(options=RerankOptions(icfrr_mode="x")),
        "verdict.min_inliers": dict(verdict=Verdict(min_inliers=-5)),
        "verdict.model_verified.features": dict(verdict=Verdict(model_verified=Model(
            ("cosinus", "margin", "inliers", "rival"), *[model.mean, model.scale, model.weights, 0.0, 0.5]))),
        "verdict.model_verified.weights": dict(verdict=Verdict(model_verified=Model(
            model.features, model.mean, model.scale, (1.0,), 0.0, 0.5))),
        "verdict.model_verified.scale": dict(verdict=Verdict(model_verified=Model(
            model.features, model.mean, (0.1, 0.0, 1.0, 1.0), model.weights, 0.0, 0.5))),
        "verdict.model_verified.threshold": dict(verdict=Verdict(model_verified=Model(
            model.features, model.mean, model.scale, model.weights, 0.0, 1.5))),
    }
    for field, kw in bad.items():
        with pytest.raises(SettingsError) as e:
            QuerySettings(**kw)
        assert e.value.field == field, (field, str(e.value))


@pytest.fixture()
def exported_run(sample_built, tmp_path, capsys):
    """A run of 5 queries exported with ``evaluate --json``, its query folder and its index."""
    import shutil

    index, queries = sample_built
    qs = tmp_path / "queries"
    qs.mkdir()
    lines = (queries / "ground_truth.csv").read_text().splitlines()
    for line in lines[1:6]:
        shutil.copy2(queries / line.split(",")[0], qs)
    (qs / "ground_truth.csv").write_text("\n".join(lines[:6]) + "\n")
    run_json = tmp_path / "run.json"
    assert cli_main(["evaluate", str(index), str(qs), "--json", str(run_json)]) == 0
    capsys.readouterr()
    return run_json, qs, index


@pytest.mark.parametrize("tamper, field", [
    (lambda s: s["verdict"]["model_verified"]["features"].__setitem__(0, "cosinus"), "verdict.model_verified.features"),
    (lambda s: s.__setitem__("k", -5), "k"),
    (lambda s: s["verdict"]["model_verified"].__setitem__("weights", [1.0]), "verdict.model_verified.weights"),
])
def test_a_tampered_settings_json_is_refused_naming_the_field(exported_run, tmp_path, capsys, tamper, field):
    """A verdict feature renamed gave a KeyError traceback; k = -5 ran and every answer said "the
    collection is empty"; one weight for four features passed by numpy broadcasting."""
    run_json, _, _ = exported_run
    doc = json.loads(run_json.read_text())
    tamper(doc["run"]["settings"])
    bad = tmp_path / "tampered.json"
    bad.write_text(json.dumps(doc))
    assert cli_main(["evaluate", "--settings", str(bad)]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and f"the run's setting {field} is wrong" in err[0], err
    assert str(bad) in err[0]


def test_a_query_set_given_again_elsewhere_is_the_same_and_a_changed_one_is_named(exported_run, tmp_path, capsys):
    """A copy of the query set given after --settings was said to differ ("queries: 5 then, 5 now"):
    the queries were compared by their absolute paths."""
    import shutil

    run_json, qs, index = exported_run
    copy = tmp_path / "elsewhere"
    shutil.copytree(qs, copy)
    with open(copy / "ground_truth.csv", "a") as f:  # one more row, naming a photo that is not there
        f.write("q99.jpg,harbour_lights\n")
    assert cli_main(["evaluate", "--settings", str(run_json), str(index), str(copy)]) == 0
    captured = capsys.readouterr()
    assert f"same numbers as {run_json}" in captured.out
    assert "1 ignored: listed in ground_truth.csv but no such image" in captured.err  # the extra row is named
    with open(qs / "ground_truth.csv", "a") as f:  # one more row for a query of the run: its ground truth changed
        f.write("q02.jpg,composition_rby\n")
    assert cli_main(["evaluate", "--settings", str(run_json)]) == 1
    assert "changed since the run: its queries or their ground truth differ" in capsys.readouterr().err


def test_import_append_counts_only_the_new_files(tmp_path, capsys):
    """With none of 7 files present, ``import --append`` of 2 said "5 of 7 files found" (the index's
    5 counted as found, never looked for): only the new files are looked for, and counted."""
    rng = np.random.default_rng(3)

    def items(path: Path, names: list[str]) -> Path:
        path.write_text("path,instance\n" + "".join(f"{n},obj{i % 3}\n" for i, n in enumerate(names)))
        return path

    np.save(tmp_path / "first.npy", rng.normal(size=(5, 16)).astype(np.float32))
    np.save(tmp_path / "more.npy", rng.normal(size=(2, 16)).astype(np.float32))
    first = items(tmp_path / "first.csv", [f"gone/{i}.jpg" for i in range(5)])
    more = items(tmp_path / "more.csv", [f"gone/new{i}.jpg" for i in range(2)])
    out = tmp_path / "index"
    assert cli_main(["import", str(tmp_path / "first.npy"), "--items", str(first), "-o", str(out)]) == 0
    assert "0 of 5 files found" in capsys.readouterr().out
    assert cli_main(["import", str(tmp_path / "more.npy"), "--items", str(more), "-o", str(out), "--append"]) == 0
    captured = capsys.readouterr()
    assert "7 references" in captured.out and "0 of 2 new files found" in captured.out, captured.out
    assert "2 of the 2 new files were not found" in captured.err


# ---- exit codes ----------------------------------------------------------------------------------------


def test_every_exit_code_is_one_the_readme_lists(sample_built, tmp_path, monkeypatch, capsys):
    """0, 1, 2 and 130, whatever happens: an unexpected exception was a traceback, and a reader that
    closed the pipe (``| head``) gave "Exception ignored ... BrokenPipeError" at the exit."""
    import re

    import museum_search.cli as cli

    readme = (REPO / "README.md").read_text(encoding="utf-8")
    line = next(x for x in readme.splitlines() if x.startswith("Exit codes:"))
    listed = {int(n) for n in re.findall(r"\b(\d+)\b", line)}
    index, queries = sample_built
    seen = {}
    seen["ok"] = cli_main(["info", str(index)])
    seen["error"] = cli_main(["info", str(tmp_path)])
    with pytest.raises(SystemExit) as usage:
        cli_main(["query", "--no-such-option"])
    seen["usage"] = usage.value.code

    def raising(exc):
        def cmd(args):
            raise exc
        return cmd

    capsys.readouterr()
    monkeypatch.setattr(cli, "cmd_info", raising(RuntimeError("an unforeseen state")))
    seen["bug"] = cli_main(["info", str(index)])
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "unexpected RuntimeError: an unforeseen state" in err[0], err
    monkeypatch.setattr(cli, "cmd_info", raising(KeyboardInterrupt()))
    seen["ctrl-c"] = cli_main(["info", str(index)])
    proc = _popen(["-m", "museum_search", "query", str(index), *map(str, sorted(queries.glob("*.jpg"))[:4]),
                   "--json", "--no-verify"])
    proc.stdout.close()  # the reader goes away before the answer is printed
    err = proc.stderr.read()
    seen["broken pipe"] = proc.wait(timeout=300)
    assert "Traceback" not in err and "Exception ignored" not in err, err
    assert seen == {"ok": 0, "error": 1, "usage": 2, "bug": 1, "ctrl-c": 130, "broken pipe": 1}, seen
    assert set(seen.values()) <= listed == {0, 1, 2, 130}


@pytest.mark.parametrize("command", ["index", "update", "evaluate"])
def test_batch_size_zero_is_refused_not_waited_on(sample_built, sample_collection, tmp_path, command):
    """``index --batch-size 0`` waited forever (no photo was ever taken into a batch); ``evaluate
    --batch-size -1`` ran as if it were 1."""
    index, queries = sample_built
    args = {"index": ["index", str(sample_collection / "collection"), "-o", str(tmp_path / "new"), "--size", "64"],
            "update": ["update", str(index)], "evaluate": ["evaluate", str(index), str(queries)]}[command]
    proc = _popen(["-m", "museum_search", *args, "--batch-size", "0" if command != "evaluate" else "-1"])
    try:
        out, err = proc.communicate(timeout=120)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.communicate()
        pytest.fail(f"{command} --batch-size 0 still runs after 120 s")
    assert proc.returncode == 1 and "--batch-size (photos described at once) must be a whole number" in err, err
    assert not (tmp_path / "new").exists()
