"""`museum-search` command line: index, import, update, query, evaluate, info, backbones, gui, demo.

Exit codes: 0 ok, 2 usage error (argparse), 1 anything else with a one-line message on stderr,
130 when interrupted with Ctrl-C (nothing on disk is changed then).

Each command imports the core modules it uses inside its function: lazy, for start-up time only
(``museum-search --help`` or ``info`` must not load torch, OpenCV, faiss or Qt). Nothing is imported
late to dodge a cycle: core is layered (see the README's Architecture).
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from pathlib import Path
from typing import Any, Sequence

from museum_search import __version__

PROG = "museum-search"


def _progress_bar(total: int, desc: str):
    from tqdm import tqdm

    return tqdm(total=total, desc=desc, unit="img", file=sys.stderr, dynamic_ncols=True, disable=None)


def _drive(gen, desc: str):
    """Run a core progress generator with a tqdm bar; return its result."""
    bar = None
    try:
        while True:
            try:
                p = next(gen)
            except StopIteration as stop:
                return stop.value
            if p.total <= 0:
                continue  # a step of unknown length (loading the network, gallery ranks): no count
            label = f"{desc}, step {p.step}/{p.steps} {p.stage}" if p.steps else desc
            if bar is None:
                bar = _progress_bar(p.total, label)
            elif bar.total != p.total or getattr(bar, "desc", None) != label:  # a new step: a new count
                # (a disabled bar, stderr not a terminal, has no desc)
                bar.set_description_str(label, refresh=False)
                bar.set_postfix_str("", refresh=False)
                bar.reset(total=p.total)
            bar.n = p.done
            whole = f"whole job {bar.format_interval(p.job_eta)} left" if p.job_eta is not None else ""
            name = Path(p.current).name[-30:] if p.current else ""
            if whole or name:
                bar.set_postfix_str(", ".join(t for t in (whole, name) if t), refresh=False)
            bar.refresh()
    finally:
        gen.close()
        if bar is not None:
            bar.close()


def _print_skips(skipped: Sequence[tuple[str, str]], ignored: Sequence[tuple[str, str]] = ()) -> None:
    if skipped:
        print(f"{len(skipped)} file(s) skipped:", file=sys.stderr)
        for path, reason in skipped:
            print(f"  {path}: {reason}", file=sys.stderr)
    if ignored:
        print(f"{len(ignored)} file(s) left out by the labelling (first 10):", file=sys.stderr)
        for path, reason in list(ignored)[:10]:
            print(f"  {path}: {reason}", file=sys.stderr)


# ---- commands --------------------------------------------------------------------------------


def cmd_index(args: argparse.Namespace) -> int:
    from museum_search.core.index import LabellingSpec
    from museum_search.core.inference import BackboneConfig
    from museum_search.core.jobs import build_job

    config = BackboneConfig(args.backbone, args.head, args.size, tuple(args.scales), args.gem_p, args.weights)
    spec = LabellingSpec(args.labels, args.catalogue, args.regex)
    report = _drive(build_job(args.collection, args.output, config, spec, batch_size=args.batch_size,
                              dtype="float16" if args.float16 else "float32", ann=args.ann,
                              neighbours=args.neighbours, ray=args.ray, matcher=args.matcher,
                              engine=args.engine, whitening=args.whitening), "indexing")
    print(f"backbone: {report.index.meta.summary()}", file=sys.stderr)
    _print_skips(report.skipped, report.labelling.ignored)
    print(f"index written to {args.output}: {report.summary()}")
    return 0


def cmd_import(args: argparse.Namespace) -> int:
    from museum_search.core.errors import MuseumSearchError
    from museum_search.core.jobs import append_to_index, import_index

    if args.append:
        if args.float16:
            raise MuseumSearchError("--append keeps the index's own dtype: leave out --float16")
        report = _drive(append_to_index(args.descriptors, args.items, args.output, root=args.root, ann=args.ann),
                        "appending")
    else:
        report = _drive(import_index(args.descriptors, args.items, args.output, float16=args.float16,
                                     root=args.root, ann=args.ann, neighbours=args.neighbours), "importing")
    for notice in report.notices:
        print(f"notice: {notice}", file=sys.stderr)
    print(f"index written to {args.output}: {report.summary()}")
    return 0


def cmd_update(args: argparse.Namespace) -> int:
    from museum_search.core.jobs import update_job

    report = _drive(update_job(args.index, weights=args.weights, batch_size=args.batch_size,
                               checksum=args.checksum, ann=args.ann, engine=args.engine,
                               neighbours=args.neighbours), "updating")
    _print_skips(report.skipped, report.labelling.ignored)
    if report.removed_files:
        print(f"{len(report.removed_files)} reference(s) removed from the index:", file=sys.stderr)
        for path, why in report.removed_files:
            print(f"  {path}: {why}", file=sys.stderr)
    print(f"index {args.index} updated: {report.summary()}")
    return 0


def cmd_upgrade(args: argparse.Namespace) -> int:
    from museum_search.core.jobs import upgrade_index

    index = _drive(upgrade_index(args.index, ann=args.ann, neighbours=args.neighbours), "converting")
    print(f"index {args.index} converted to the current format: {index.summary()}")
    return 0


def query_settings(args: argparse.Namespace, index=None):
    """The query pipeline's settings from the command line (``query`` and ``evaluate``, ``--engine``
    included); with ``index``, ``--min-inliers`` and ``--threshold`` replace its verdict's model for this run."""
    from museum_search.core.answer import QuerySettings, RerankOptions, Verdict
    from museum_search.core.errors import MuseumSearchError, SettingsError

    opts = RerankOptions(
        k_q=args.kq, k_g=args.kg, beta=args.beta, iterations=args.iterations, icfrr_mode=args.icfrr_mode,
        qe_n=args.qe_n, qe_alpha=args.qe_alpha,
    )
    try:
        return QuerySettings(k=getattr(args, "k", 5), per_instance=getattr(args, "per_instance", False),
                             regions=not args.whole_image, rerank=args.rerank, options=opts,
                             verify=not args.no_verify, verify_top=args.verify_top, search=args.search,
                             verdict=None if index is None else _verdict_override(args, Verdict.of_index(index)),
                             engine=getattr(args, "engine", None))
    except SettingsError as exc:  # checked in core; said here with the option's name
        raise MuseumSearchError(f"{OPTION_OF_SETTING.get(exc.field, exc.field)}: {exc.message}") from None


#: The command-line option of each query setting (:class:`SettingsError`'s ``field``).
OPTION_OF_SETTING = {"k": "-k", "verify_top": "--verify-top", "options.k_q": "--kq", "options.k_g": "--kg",
                     "options.beta": "--beta", "options.iterations": "--iterations", "options.qe_n": "--qe-n",
                     "options.qe_alpha": "--qe-alpha", "verdict.min_inliers": "--min-inliers",
                     "verdict.min_cosine": "--threshold"}


def _verdict_override(args: argparse.Namespace, verdict):
    """The index's ``verdict`` with the rule of ``--min-inliers``/``--threshold``; None without them."""
    min_inliers, threshold = getattr(args, "min_inliers", None), getattr(args, "threshold", None)
    if min_inliers is None and threshold is None:
        return None
    if min_inliers is not None:
        verdict = verdict.with_rule(min_inliers=min_inliers, source="--min-inliers")
    if threshold is not None:
        verdict = verdict.with_rule(min_cosine=threshold, source="--threshold")
    return verdict


def _descriptor_pipeline(args: argparse.Namespace, index):
    """The pipeline of ``--descriptors`` queries, with the notice that they are not verified."""
    from museum_search.core.answer import DESCRIPTORS_NOT_VERIFIED, QueryPipeline

    if not args.no_verify:
        print(f"notice: {DESCRIPTORS_NOT_VERIFIED}", file=sys.stderr)
    return QueryPipeline.for_descriptors(index, query_settings(args, index))


def cmd_query(args: argparse.Namespace) -> int:
    from museum_search.core.errors import MuseumSearchError
    from museum_search.core.index import Index

    if bool(args.images) == bool(args.descriptors):
        raise MuseumSearchError("give query photos or --descriptors Q.npy (one of the two)")
    if args.region is not None and args.descriptors:
        raise MuseumSearchError("--region asks about a part of a photo; queries given as descriptors have none")
    index = Index.load(args.index)
    out: list[dict[str, Any]] = []
    for answer in (_descriptor_answers if args.descriptors else _photo_answers)(args, index):
        out.append(answer.to_dict())
        if not args.json:
            _print_answer(answer)
    if args.json:
        json.dump(out, sys.stdout, ensure_ascii=False, indent=2)
        print()
    return 0


def _photo_answers(args: argparse.Namespace, index):
    from museum_search.core.answer import QueryPipeline, load_query, parse_region
    from museum_search.core.errors import ImageError, MuseumSearchError

    region = None if args.region is None else parse_region(args.region)
    pipe = QueryPipeline(index, query_settings(args, index), weights=args.weights)
    failures = 0
    for path in args.images:
        try:
            query = load_query(path, region)
        except ImageError as exc:
            print(f"{PROG}: skipped {exc}", file=sys.stderr)
            failures += 1
            continue
        yield pipe.answer([query])[0]
    if failures == len(args.images):
        raise MuseumSearchError("none of the query images could be read")


def _descriptor_answers(args: argparse.Namespace, index):
    from museum_search.core.jobs import descriptor_queries

    queries = descriptor_queries(args.descriptors, index)
    pipe = _descriptor_pipeline(args, index)
    for lo in range(0, len(queries), 64):  # a bounded score matrix, whatever the number of queries
        yield from pipe.answer(queries[lo:lo + 64])


def _print_answer(answer) -> None:
    verdict = "in the collection" if answer.in_collection else "NOT in this collection"
    print(f"query: {answer.query}  → {verdict} ({answer.verdict_text()})")
    print(f"  {'rank':>4}  {'cosine':>6}  {'inliers':>7}  {'instance':<20}  {'title / artist':<40}  path")
    for r in answer.results:
        meta = " / ".join(v for v in (r.metadata.get("title", ""), r.metadata.get("artist", "")) if v)
        inl = "-" if r.inliers is None else str(r.inliers)
        print(f"  {r.rank:>4}  {r.cosine:>6.3f}  {inl:>7}  {r.instance[:20]:<20}  {meta[:40]:<40}  {r.path}")
    if len(answer.objects) > 1:
        print(f"  {len(answer.objects)} objects in this photo:")
        for o in answer.objects:
            where = "" if o.region is None else "  at " + " ".join(f"({x:.0f},{y:.0f})" for x, y in o.region)
            print(f"    {o.instance}  confidence {o.confidence:.2f}; {o.reason}{where}")


def cmd_info(args: argparse.Namespace) -> int:
    from museum_search.core.errors import MuseumSearchError
    from museum_search.core.index import Index

    index = Index.load(args.index, verify="full" if args.check else True)
    print(index.summary())
    for damage in index.damaged:
        print(f"damaged: {damage}")
    if args.check and index.damaged:
        raise MuseumSearchError(f"{len(index.damaged)} data file(s) of {args.index} damaged (listed above); "
                                f"museum-search update {args.index} writes them again")
    if args.check:
        print("every data file checked byte for byte: intact")
    print(f"labelling: {index.labelling.rule}; nearest neighbours stored per reference (ICFRR): "
          f"{index.neighbours_stored}")
    if index.ann is not None:
        print(f"approximate search: {index.ann.summary() if hasattr(index.ann, 'summary') else index.ann.params}")
        from museum_search.core.index import resolve_mode

        tuning = index.ann.params.tuning
        print("  measured (at build time, again after each update): "
              + (tuning.summary() if tuning is not None else "nothing (built before the measurement existed)"))
        print(f"  --search auto: {resolve_mode('auto', len(index), index.ann)}")
    else:
        print("approximate search: none (every search is exact)")
    from museum_search.core.answer import Verdict

    if index.meta.imported:
        print("verification: none (imported descriptors: queries are descriptors, --descriptors)")
    elif index.local is None:
        print("verification: no local features stored (rebuild the index to verify answers)")
    else:
        from museum_search.core.verification import params_of_settings

        p = params_of_settings(index.local.settings)
        print(f"verification: local features of {len(index.local)} references "
              f"({p.effective_feature.upper()}, {p.max_side} px; a query photo's at {p.photo_side} px)")
    v = Verdict.of_index(index)
    print(f"verdict: {v.summary()}")
    staff = (index.verdict or {}).get("staff_views") or {}
    if staff.get("known") or staff.get("unknown"):
        print(f"calibrated with {staff['known'] + staff['unknown']} visitor photos confirmed by staff: "
              f"{staff['known']} of known objects, {staff['unknown']} not in the collection")
    warning = v.warning()
    if warning is not None:
        print(f"warning: {warning}")
    return 0


def cmd_backbones(args: argparse.Namespace) -> int:
    from museum_search.core import inference
    from museum_search.core.inference import REGISTRY

    for name, spec in REGISTRY.items():
        print(f"{name:<20} {spec.description}")
    print(f"inference engine: {inference.default_engine()} (onnxruntime {'installed' if inference.onnx_available() else 'not installed'}, "
          f"torch {'installed' if inference.torch_available() else 'not installed'}; --engine or MUSEUM_SEARCH_ENGINE)")
    return 0


#: ``evaluate``'s options that make a run: with ``--settings`` they come from the run's JSON.
RUN_OPTIONS = ("descriptors", "ground_truth", "layout", "regex", "search", "whole_image", "rerank", "kq", "kg", "beta",
               "iterations", "icfrr_mode", "qe_n", "qe_alpha", "no_verify", "verify_top", "min_inliers", "threshold",
               "batch_size", "weights")


def _evaluation_inputs(args: argparse.Namespace):
    """(index, query set, its source, pipeline, batch size, weights, the exported run or None) of
    ``evaluate``: from the command line, or from ``--settings RUN.json`` (the run's index, query set
    and settings, checked to be the run's)."""
    from dataclasses import replace

    from museum_search.core import evaluation
    from museum_search.core.answer import QueryPipeline
    from museum_search.core.errors import MuseumSearchError, SettingsError
    from museum_search.core.index import Index

    rerun = None
    if args.settings:
        defaults = build_parser().parse_args(["evaluate"])
        given = [name for name in RUN_OPTIONS if getattr(args, name) != getattr(defaults, name)]
        if given:
            raise MuseumSearchError(f"--settings takes every setting of the run from {args.settings}; leave out "
                                    + ", ".join("--" + n.replace("_", "-") for n in given))
        try:
            spec, old = rerun = evaluation.read_run(args.settings)
        except SettingsError as exc:
            raise MuseumSearchError(f"{args.settings}: the run's setting {exc.field} is wrong: {exc.message}; "
                                    "export the run again") from None
        where = args.index or spec.index_path
        if where is None or not Path(where).exists():
            raise MuseumSearchError(f"the run's index is not at {where} any more; give its folder: "
                                    f"{PROG} evaluate --settings {args.settings} INDEX [QUERIES]")
        index = Index.load(where)
        spec.check_index(index)
        for note in spec.notes():
            print(f"notice: {note}", file=sys.stderr)
        source = spec.query_set if args.queries is None else replace(spec.query_set, path=str(Path(args.queries).resolve()))
        settings, batch_size, weights = spec.settings_for(index), spec.batch_size, spec.weights
        settings = replace(settings, engine=_rerun_engine(spec.engine, args.engine))
    else:
        if not args.index:
            raise MuseumSearchError("give an index folder (or --settings RUN.json to run an exported run again)")
        if bool(args.queries) == bool(args.descriptors) or bool(args.descriptors) != bool(args.ground_truth):
            raise MuseumSearchError("give a query folder, or --descriptors Q.npy with --ground-truth GT.csv")
        index = Index.load(args.index)
        source = (evaluation.QuerySetSource(str(Path(args.ground_truth).resolve()), "descriptors",
                                        descriptors=str(Path(args.descriptors).resolve())) if args.descriptors
                  else evaluation.QuerySetSource(str(Path(args.queries).resolve()), args.layout, args.regex))
        settings, batch_size, weights = query_settings(args, index), args.batch_size, args.weights
    if source.descriptors:
        from museum_search.core.answer import DESCRIPTORS_NOT_VERIFIED
        from museum_search.core.jobs import descriptor_queryset

        queryset = descriptor_queryset(source.descriptors, source.path, index)
        if settings.verify:
            print(f"notice: {DESCRIPTORS_NOT_VERIFIED}", file=sys.stderr)
        pipe = QueryPipeline.for_descriptors(index, settings)
    else:
        queryset = source.load()
        pipe = QueryPipeline(index, settings, weights=weights)
    if rerun is not None:
        rerun[0].check_queryset(queryset)
    print(f"queries: {queryset.summary()}", file=sys.stderr)
    return index, queryset, source, pipe, batch_size, weights, rerun


def _rerun_engine(engine: str | None, given: str | None) -> str | None:
    """The engine of a re-run: ``--engine`` when given, else the run's (the engines give the same
    descriptors to a cosine of 0.9999, not bit for bit), else the default when the run's is not installed."""
    from museum_search.core import inference

    if given or not engine or engine == inference.default_engine():
        return given or engine
    available = inference.onnx_available() if engine == "onnx" else inference.torch_available()
    if available:
        return engine
    print(f"notice: the run used the {engine} engine, which is not installed here; using "
          f"{inference.default_engine()} (the numbers may differ in the last digits)", file=sys.stderr)
    return None


def cmd_evaluate(args: argparse.Namespace) -> int:
    from datetime import datetime

    from museum_search.core import evaluation
    from museum_search.core.errors import MuseumSearchError
    from museum_search.core.evaluation import evaluate

    if args.settings and args.json and Path(args.json).resolve() == Path(args.settings).resolve():
        raise MuseumSearchError(f"--json {args.json} would overwrite the run being run again; write to another file")
    _check_evaluate_numbers(args)
    index, queryset, source, pipe, batch_size, weights, rerun = _evaluation_inputs(args)
    report = _drive(evaluate(index, queryset, pipeline=pipe, batch_size=batch_size), "evaluating")
    _print_skips(report.skipped)
    name = evaluation.run_name(pipe.settings, source.name, datetime.now())
    spec = evaluation.run_spec(report, index, source, queryset, name=name, batch_size=batch_size, weights=weights)
    doc = evaluation.run_document(report, index, spec, rankings=args.rankings, seed=args.seed)
    if args.baseline:
        doc["summary"]["baseline"] = evaluation.compare_with_baseline(doc, args.baseline, seed=args.seed)
    _print_summary(doc["summary"])
    if args.json:
        evaluation.atomic_write(args.json, json.dumps(doc, ensure_ascii=False, indent=1))
    if args.csv:
        evaluation.write_run_csv(args.csv, report, index, spec)
    if args.trec:
        evaluation.write_trec(report, index, args.trec)
    if args.calibrate_verdict is not None:
        _recalibrate(index, report, args.calibrate_verdict, verified=pipe.settings.verify)
    if rerun is not None:
        diffs = evaluation.same_numbers(rerun[1], doc)
        if diffs:
            raise MuseumSearchError(f"the numbers differ from {args.settings} in {len(diffs)} place(s): "
                                    + "; ".join(diffs[:5]) + ("; …" if len(diffs) > 5 else ""))
        print(f"same numbers as {args.settings}: every figure of the summary and of each query")
    return 0


def _check_evaluate_numbers(args: argparse.Namespace) -> None:
    """``evaluate``'s own numbers, before anything runs (the query settings are QuerySettings')."""
    from museum_search.core.errors import MuseumSearchError
    from museum_search.core.jobs import check_batch_size

    check_batch_size(args.batch_size)
    share = args.calibrate_verdict
    if share is not None and not 0 <= share < 1:  # (the rule is the report's: EvalReport.recalibrated)
        raise MuseumSearchError(f"--calibrate-verdict: the share of known objects that may be rejected must be in "
                                f"[0, 1), e.g. 0.03, not {share}")


def _recalibrate(index, report, max_known_rejected: float, verified: bool) -> None:
    """Store the verdict's operating point chosen on this labelled query set in the index."""
    new, f = report.recalibrated(max_known_rejected)
    index.store_verdict(new)
    what = new.rule(verified)
    print(f"verdict re-calibrated and stored in {index.path}: {what}; on these queries it rejects "
          f"{100 * f['unknown_rejected']:.1f} % of the unknown objects and wrongly rejects "
          f"{100 * f['known_rejected']:.1f} % of the known ones")


def _print_summary(s: dict[str, Any]) -> None:
    if s.get("run"):
        print(f"run:       {s['run']}")
    print(f"index:     {s['index']}")
    print(f"queries:   {s['query_set']}")
    print(f"re-ranker: {s['rerank']}")
    print(f"evaluated {s['queries']} queries; {s['open_set_queries']} open-set queries excluded; "
          f"{s.get('unknown_instance_queries', 0)} naming only instances not in the index excluded; "
          f"{s['skipped_queries']} unreadable")
    from museum_search.core.evaluation import PRINTED_METRICS, unknown_instances_warning

    warning = unknown_instances_warning(s)
    if warning:
        print(f"warning: {warning}")
    v = s.get("verdict") or {}
    if v.get("known_queries") or v.get("unknown_queries"):
        def share(x):
            return "n/a" if x is None else f"{100 * x:.1f} %"

        rule = v.get("rule") or (f"at least {v['min_inliers']} matching points" if v.get("min_inliers") is not None
                                 else f"cosine at least {v.get('min_cosine')}")
        print(f"verdict ({rule}): unknown objects rejected {share(v['unknown_rejected'])} of "
              f"{v['unknown_queries']}; known objects wrongly rejected {share(v['known_rejected'])} of "
              f"{v['known_queries']}; accuracy (right answer or right rejection) {share(v['accuracy'])}")
    ci = s.get("ci95", {})
    print(f"  {'metric':<8} {'value %':>8}   95% CI")
    for m in PRINTED_METRICS.values():  # in percent, with the 95 % interval of a mean
        interval = ci.get(m.key)
        iv = f"[{m.percent(interval[0])}, {m.percent(interval[1])}]" if interval else ""
        if m.companion:  # GAP: over the known queries only, in brackets (no interval: not a mean)
            iv = f"({m.companion_label} queries only: {m.percent(s.get(m.companion)).strip()})"
        print(f"  {m.label:<8} {m.percent(s.get(m.key)):>8}   {iv}")
    base = s.get("baseline")
    if base:
        _print_comparison(base)


def _differ(n: int) -> str:
    return f"{n} query differs" if n == 1 else f"{n} queries differ"


def _print_comparison(base: dict[str, Any]) -> None:
    """``evaluate --baseline``'s lines, e.g. "MP@1 0.567 vs 0.967: worse, p = 0.0005 (12 queries differ)"."""
    from museum_search.core.evaluation import COMPARED, format_p

    alternative = base[next(iter(COMPARED))].get("alternative", "one-tailed")
    lower = " and ".join(m.label for m in COMPARED.values() if not m.higher_is_better)
    print(f"against baseline {base['baseline']} ({base['paired_queries']} paired queries; {alternative} paired "
          "randomization test, the bootstrap test's p next to it" + (f"; for {lower} lower is better" if lower else "")
          + "):")
    for key, m in COMPARED.items():
        b = base[key]
        levels = [lvl for lvl, sig in b["significant"].items() if sig]
        verdict = f"significant at {min(levels, key=float)}" if levels else "not significant"
        how = "exact" if b["exact"] else "Monte Carlo"
        means = (f"{b['run_mean']:.3f} vs {b['baseline_mean']:.3f}" if b.get("run_mean") is not None
                 and b.get("baseline_mean") is not None else f"delta {b['delta']:+.4f}")
        print(f"  {m.label} {means}: {b.get('direction', 'n/a')}, p = {format_p(b['p_value'])} "
              f"({_differ(b['differing_queries'])})  [{b['test']}, {how}; delta {b['delta']:+.4f}; "
              f"bootstrap p = {format_p(b['bootstrap_p_value'])}; {verdict}]")


def cmd_gui(args: argparse.Namespace) -> int:
    from museum_search.gui.app import main as gui_main

    argv = [] if args.index is None else [str(args.index)]
    return gui_main(argv, engine=args.engine)


def cmd_demo(args: argparse.Namespace) -> int:
    from museum_search.gui.app import main as gui_main

    return gui_main(["--demo", str(args.index)] + (["--camera", str(args.camera)] if args.camera is not None else []),
                    engine=args.engine)


def cmd_serve(args: argparse.Namespace) -> int:
    from museum_search.core.errors import MuseumSearchError

    try:
        from museum_search.serve import create_app, server
    except ImportError as exc:
        raise MuseumSearchError(f"serve needs fastapi, uvicorn, segno and python-multipart ({exc}); "
                                "pip install museum-search again to get them") from None
    https = args.https is not None
    if https:
        for f in args.https:
            if not Path(f).is_file():
                raise MuseumSearchError(f"--https: {f} is not a file (give CERT KEY, PEM files)")
    if args.label is not None and Path(args.label).exists():  # before loading anything
        raise MuseumSearchError(f"--label {args.label}: this file exists already; it is left as it is")
    sock = server.listen(args.host, args.port)  # a port in use is said before anything is printed
    print(f"loading {args.index} and warming up the network…", file=sys.stderr)
    from museum_search.core.answer import QuerySettings

    app = create_app(args.index, workers=args.workers, queue=args.queue, allow_origin=args.allow_origin,
                     keep=keep_policy(args), visitors=args.visitors, settings=QuerySettings(engine=args.engine))
    urls = server.urls(args.host, args.port, https)
    name = app.state.index.root.name
    print(f"serving {name} ({len(app.state.index)} references, {app.state.pool.workers} workers) at:")
    for url in urls:
        print(f"  {url}")
    if args.host == "127.0.0.1":
        print("only this machine can open it; --host 0.0.0.0 puts it on the local network")
    print(server.terminal_qr(urls[0]))
    if args.label is not None:
        print(f"label written to {server.write_label(args.label, urls[0], name)}")
    print(visitors_line(app.state.keep, app.state.visitors))
    server.run(app, sock, certfile=args.https[0] if https else None, keyfile=args.https[1] if https else None)
    return 0


# ---- parser ----------------------------------------------------------------------------------


def _add_rerank_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--search", choices=("auto", "exact", "ann"), default="auto",
                   help="exact: score every reference; ann: approximate search (faiss), then exact scores of its "
                        "shortlist (large indexes); auto (default): ann from a size where it is faster, if the "
                        "index has an approximate index")
    p.add_argument("--whole-image", action="store_true",
                   help="describe each query as one whole image (the papers' protocol) instead of the "
                        "default best of 6 regions (whole, left/right/top/bottom 60%%, centre 80%%)")
    g = p.add_argument_group("re-ranking")
    g.add_argument("--rerank", default="", metavar="LIST",
                   help="comma-separated global re-rankers applied in order before verification: icfrr, "
                        "aqe, dba (e.g. aqe,icfrr)")
    g.add_argument("--kq", type=int, default=None, help="ICFRR K_q (default: from the collection)")
    g.add_argument("--kg", type=int, default=None, help="ICFRR K_g (default: from the collection)")
    g.add_argument("--beta", type=float, default=0.5, help="ICFRR beta (default 0.5)")
    g.add_argument("--iterations", type=int, default=5, help="ICFRR maximum iterations (default 5, as the public code)")
    g.add_argument("--icfrr-mode", choices=("paper", "reference"), default="paper",
                   help="paper: s_t+1 = s_t + beta*Delta (default); reference: the public code's rule")
    g.add_argument("--qe-n", type=int, default=2, help="aQE/DBA neighbours (default 2)")
    g.add_argument("--qe-alpha", type=float, default=3.0, help="aQE/DBA weight exponent (default 3)")
    v = p.add_argument_group("verification and verdict")
    v.add_argument("--no-verify", action="store_true",
                   help="no geometric verification of the shortlist (faster; the verdict then uses the cosine)")
    v.add_argument("--verify-top", "--spatial-top", type=int, default=20, dest="verify_top",
                   help="how many of the best references are verified (default 20)")
    v.add_argument("--min-inliers", type=int, default=None,
                   help="'in the collection' needs at least this many matching points (default: the "
                        "index's calibration)")
    v.add_argument("--threshold", type=float, default=None,
                   help="with --no-verify: 'in the collection' needs at least this cosine (default: the "
                        "index's calibration)")


def _add_derived_options(p: argparse.ArgumentParser, neighbours: bool = True) -> None:
    from museum_search.core.index import K_MAX

    p.add_argument("--ann", choices=("auto", "yes", "no"), default="auto",
                   help="build an approximate-search index (faiss): auto (default) for large indexes, yes, no")
    if neighbours:
        p.add_argument("--neighbours", type=int, default=K_MAX, metavar="K",
                       help=f"store each reference's K nearest neighbours, for ICFRR with K_g up to K "
                            f"(default {K_MAX}; 0: none)")


def _add_engine_option(p: argparse.ArgumentParser) -> None:
    p.add_argument("--engine", choices=("onnx", "torch"), default=None,
                   help="what runs the network: onnx (ONNX Runtime, the default where it is installed; "
                        "about 4x faster on a CPU) or torch; both give the same descriptors")


def _add_backbone_options(s: argparse.ArgumentParser) -> None:
    """The network that describes the photos: backbone, head, size, scales and GeM exponent."""
    from museum_search.core.inference import DEFAULT_BACKBONE, DEFAULT_HEAD, DEFAULT_SIZE, HEADS, REGISTRY

    s.add_argument("--backbone", choices=list(REGISTRY), default=DEFAULT_BACKBONE)
    s.add_argument("--head", choices=HEADS, default=DEFAULT_HEAD,
                   help="logits = 1000-d ImageNet output at 224x224 (the papers' IM baseline); "
                        "gap/mac/gem/rmac = pooled conv features")
    s.add_argument("--size", type=int, default=DEFAULT_SIZE, help="longest image side for pooled heads")
    s.add_argument("--scales", type=float, nargs="+", default=[1.0], help="multi-scale factors, e.g. 1 0.707")
    s.add_argument("--gem-p", type=float, default=3.0, help="GeM exponent")


def _add_labelling_options(s: argparse.ArgumentParser) -> None:
    """How the photos' instances are named: the rule, a catalogue CSV or a regex."""
    from museum_search.core.index import RULES

    s.add_argument("--labels", choices=RULES, default="auto", help="labelling rule (default: auto-detect)")
    s.add_argument("--catalogue", type=Path, default=None, help="catalogue CSV: file,instance,metadata...")
    s.add_argument("--regex", default=None, help="regex with a group (?P<instance>...) on the relative path")


def _add_index(sub: argparse._SubParsersAction) -> None:
    s = sub.add_parser("index", help="index a collection folder of reference photos")
    s.add_argument("collection", type=Path, help="folder of reference photos")
    s.add_argument("-o", "--output", type=Path, required=True, help="index folder to write")
    _add_backbone_options(s)
    _add_labelling_options(s)
    s.add_argument("--weights", default=None, help="weights file for the backbone (offline use)")
    s.add_argument("--float16", action="store_true", help="store descriptors as float16 (half the size)")
    s.add_argument("--batch-size", type=int, default=8)
    s.add_argument("--ray", nargs="?", const=True, default=None, metavar="ADDRESS",
                   help="describe the photos as tasks on a Ray cluster: a local Ray instance without ADDRESS, "
                        "an existing cluster with one (e.g. ray://head:10001); the collection must be on storage "
                        "every worker reads at the same path. Needs: pip install 'museum-search[cluster]'")
    s.add_argument("--matcher", choices=("sift", "xfeat", "auto"), default=None,
                   help="local features stored for verification: sift, xfeat (learned, through ONNX Runtime: "
                        "sees dark works) or auto (both, each calibrated on the collection's views, the better "
                        "kept; twice the build time); default: sift, or $MUSEUM_SEARCH_MATCHER. "
                        "update keeps the index's matcher")
    s.add_argument("--whitening", action="store_true",
                   help="the verdict judges the photo's similarity with a whitening learned from the collection "
                        "(each reference also described as a phone takes it): fewer visitors' photos of 3D objects "
                        "refused; adds 0.07-0.4 s per reference (at most 1,000) to the build. "
                        "update keeps it")
    _add_derived_options(s)
    _add_engine_option(s)
    s.set_defaults(func=cmd_index)


def _add_import(sub: argparse._SubParsersAction) -> None:
    s = sub.add_parser("import", help="make an index of descriptors computed elsewhere (bring your own descriptors)",
                       description="Make an index of descriptors computed elsewhere; it is searched, re-ranked, "
                                   "answered and evaluated like an index of photos, with queries given as "
                                   "descriptors (query/evaluate --descriptors). Every row is L2-normalized.")
    s.add_argument("descriptors", type=Path, metavar="DESCRIPTORS.npy",
                   help="(N, D) numeric array saved with numpy.save, one row per reference (no pickles)")
    s.add_argument("--items", type=Path, required=True, metavar="ITEMS.csv",
                   help="CSV path,instance[,metadata...]: one row per descriptor row, in the same order; the "
                        "files need not exist")
    s.add_argument("-o", "--output", type=Path, required=True, help="index folder to write")
    s.add_argument("--root", type=Path, default=None,
                   help="folder the relative paths of ITEMS.csv are relative to (default: the folder of ITEMS.csv)")
    s.add_argument("--float16", action="store_true", help="store descriptors as float16 (half the size)")
    s.add_argument("--append", action="store_true",
                   help="add these references to the imported index -o INDEX (its approximate index and the "
                        "neighbour lists they enter are updated, not built again); nothing is replaced")
    _add_derived_options(s)
    s.set_defaults(func=cmd_import)


def _add_update(sub: argparse._SubParsersAction) -> None:
    s = sub.add_parser("update", help="re-index new/changed files of an index's collection, drop deleted ones")
    s.add_argument("index", type=Path)
    s.add_argument("--checksum", action="store_true",
                   help="compare file contents (SHA-256), not only size and time: finds a photo replaced "
                        "by another of the same size and time (reads every file)")
    s.add_argument("--weights", default=None)
    s.add_argument("--batch-size", type=int, default=8)
    _add_derived_options(s, neighbours=False)
    s.add_argument("--neighbours", type=int, default=None, metavar="K",
                   help="store each reference's K nearest neighbours, for ICFRR with K_g up to K (default: as "
                        "many as the index stores; lists found damaged are stored again)")
    _add_engine_option(s)
    s.set_defaults(func=cmd_update)


def _add_upgrade(sub: argparse._SubParsersAction) -> None:
    s = sub.add_parser("upgrade", help="convert an index written by an older museum-search to the current format",
                       description="Convert an index of format 2 in place: descriptors, items, local features and "
                                   "verdict are kept; items move to SQLite, neighbour lists replace the N x N "
                                   "gallery ranks. Atomic: a failure leaves the old index as it was.")
    s.add_argument("index", type=Path)
    _add_derived_options(s)
    s.set_defaults(func=cmd_upgrade)


def _add_query(sub: argparse._SubParsersAction) -> None:
    s = sub.add_parser("query", help="which objects of the collection do these photos show?")
    s.add_argument("index", type=Path)
    s.add_argument("images", type=Path, nargs="*")
    s.add_argument("--descriptors", type=Path, default=None, metavar="Q.npy",
                   help="queries given as descriptors instead of photos: a (Q, D) array (numpy.save), named "
                        "row 0, row 1... (not verified: there is no photo to match)")
    s.add_argument("-k", type=int, default=5, help="number of results (default 5)")
    s.add_argument("--per-instance", action="store_true", help="one result per instance")
    s.add_argument("--json", action="store_true", help="print JSON instead of a table")
    s.add_argument("--region", default=None, metavar="X,Y,W,H",
                   help="ask about this part of each photo only: left, top, width, height in the photo's pixels "
                        "(the objects found are outlined in the whole photo's pixels)")
    s.add_argument("--weights", default=None)
    _add_rerank_options(s)
    _add_engine_option(s)
    s.set_defaults(func=cmd_query)


def _add_evaluate(sub: argparse._SubParsersAction) -> None:
    s = sub.add_parser("evaluate", help="measure MP@1, MAP, AMNRO, GAP... on a labelled query set")
    s.add_argument("index", type=Path, nargs="?", default=None,
                   help="index folder (with --settings: default, the run's)")
    s.add_argument("queries", type=Path, nargs="?", default=None,
                   help="query folder (CLICIDE, GaRoFou, folder-per-instance, ground_truth.csv)")
    s.add_argument("--descriptors", type=Path, default=None, metavar="Q.npy",
                   help="queries given as descriptors instead of a query folder: a (Q, D) array (numpy.save); "
                        "needs --ground-truth")
    s.add_argument("--ground-truth", type=Path, default=None, metavar="GT.csv",
                   help="with --descriptors: CSV query,instance[,grade] where query is a row of Q.npy "
                        "(row N or N, from 0); an empty instance marks an open-set query")
    s.add_argument("--settings", type=Path, default=None, metavar="RUN.json",
                   help="run an exported run again (a JSON of evaluate --json or the Evaluation tab): its index, "
                        "query set and every setting, checked to be the run's; says whether the numbers are the same")
    s.add_argument("--layout", default="auto", choices=("auto", "clicide", "garofou", "folder", "csv", "regex"))
    s.add_argument("--regex", default=None, help="regex for --layout regex")
    s.add_argument("--json", type=Path, default=None, metavar="FILE", help="write the run: summary, per-query results and verdicts, and its index, query set "
                        "and settings (run it again with --settings FILE)")
    s.add_argument("--rankings", action="store_true", help="include full rankings in the JSON")
    s.add_argument("--csv", type=Path, default=None, metavar="FILE", help="write per-query CSV (metrics, top result, verdict, and the run's settings)")
    s.add_argument("--trec", type=Path, default=None, metavar="PREFIX", help="write PREFIX.run and PREFIX.qrels")
    s.add_argument("--baseline", type=Path, default=None, metavar="RUN.json",
                   help="paired randomization test (and bootstrap test) against this run")
    s.add_argument("--seed", type=int, default=0, help="seed of the bootstrap and of Monte Carlo randomization")
    s.add_argument("--batch-size", type=int, default=8)
    s.add_argument("--weights", default=None)
    s.add_argument("--calibrate-verdict", type=float, default=None, metavar="SHARE",
                   help="choose the 'in the collection' threshold on these labelled queries so that at most "
                        "SHARE of the known objects are rejected (e.g. 0.03), and store it in the index")
    _add_rerank_options(s)
    _add_engine_option(s)
    s.set_defaults(func=cmd_evaluate)


def _add_info(sub: argparse._SubParsersAction) -> None:
    s = sub.add_parser("info", help="describe an index")
    s.add_argument("index", type=Path)
    s.add_argument("--check", action="store_true",
                   help="check every byte of every data file (opening a large index checks sizes and samples)")
    s.set_defaults(func=cmd_info)


def _add_backbones(sub: argparse._SubParsersAction) -> None:
    s = sub.add_parser("backbones", help="list the available backbones")
    s.set_defaults(func=cmd_backbones)


def _add_gui(sub: argparse._SubParsersAction) -> None:
    s = sub.add_parser("gui", help="start the desktop application")
    s.add_argument("index", type=Path, nargs="?", default=None)
    _add_engine_option(s)
    s.set_defaults(func=cmd_gui)


def _add_demo(sub: argparse._SubParsersAction) -> None:
    s = sub.add_parser("demo", help="full-screen museum kiosk with the camera")
    s.add_argument("index", type=Path)
    s.add_argument("--camera", type=int, default=None, help="camera number (default: from settings)")
    _add_engine_option(s)
    s.set_defaults(func=cmd_demo)


def _int_in(low: int, high: int):
    """An argparse type: a whole number from ``low`` to ``high`` (else a usage error, exit 2)."""
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
        if not low <= value <= high:
            raise argparse.ArgumentTypeError(f"{value} is out of range: give {low} to {high}")
        return value
    return parse


def _add_serve(sub: argparse._SubParsersAction) -> None:
    s = sub.add_parser("serve", help="answer visitors' phones: a web page and JSON API on the local network",
                       description="Serve the visitor page and the JSON API (POST /api/identify, /api/objects, "
                                   "/healthz, /openapi.json) over the same query pipeline as 'query'.")
    s.add_argument("index", type=Path)
    s.add_argument("--host", default="127.0.0.1",
                   help="address to listen on (default 127.0.0.1: this machine only; 0.0.0.0: the local network)")
    s.add_argument("--port", type=_int_in(1, 65535), default=8000, help="port to listen on, 1-65535 (default 8000)")
    s.add_argument("--workers", type=_int_in(1, 256), default=None, help="query workers (default: one per core)")
    s.add_argument("--queue", type=_int_in(0, 10_000), default=None,
                   help="requests that may wait for a worker (default 2 x workers); more get 503 and retry")
    s.add_argument("--https", nargs=2, default=None, metavar=("CERT", "KEY"),
                   help="serve HTTPS with this certificate and key (PEM): phones then show a live viewfinder")
    s.add_argument("--allow-origin", default=None, metavar="ORIGIN",
                   help="send CORS headers for this origin (default: none)")
    _add_visitor_options(s)
    s.add_argument("--label", type=Path, default=None, metavar="FILE",
                   help="write a printable label (.png or .pdf) with the QR code; an existing file is refused")
    _add_engine_option(s)
    s.set_defaults(func=cmd_serve)


def _add_visitor_options(s: argparse.ArgumentParser) -> None:
    """What is counted and kept of visitors' questions (core.visitors.KeepPolicy; the defaults said
    here are the policy's, a test checks they agree)."""
    g = s.add_argument_group("visitors' questions (anonymous counts; photos only when asked for)")
    g.add_argument("--keep", choices=("none", "unsure", "all"), default=None,
                   help="keep visitors' photos: none (default), unsure (those not recognised or not surely "
                        "recognised), all; each is re-encoded from its pixels (no EXIF, no GPS) with its answer, "
                        "never its address")
    _add_visitors_folder(g)
    g.add_argument("--quota-mb", type=float, default=None, metavar="MB",
                   help="kept photos take at most this many MB in all (default 500)")
    g.add_argument("--per-day", type=_int_in(1, 1_000_000), default=None, metavar="N",
                   help="at most N photos kept per day (default 1000)")
    g.add_argument("--retention-days", type=_int_in(1, 3650), default=None, metavar="DAYS",
                   help="kept photos not yet reviewed are deleted after DAYS days (default 30)")
    g.add_argument("--per-client-per-hour", type=_int_in(1, 100_000), default=None, metavar="N",
                   help="at most N photos kept per phone address per hour (default 20; the address is never stored)")
    g.add_argument("--no-counting", action="store_true",
                   help="do not count questions (counted by default: per hour, the object or none, verdict, "
                        "confidence band, language, source; no photo, no address)")


def _add_visitors_folder(p) -> None:
    """``--visitors DIR``: the visitor log's folder (serve, review, stats)."""
    p.add_argument("--visitors", type=Path, default=None, metavar="DIR",
                   help="the folder of kept photos and counts (default: INDEX-visitors beside the index; never "
                        "inside the index or the collection)")


def visitors_line(policy, log) -> str:
    """What ``serve`` says it counts and keeps, in one line."""
    if log is None:
        return "visitors' questions are not counted and no photo is kept"
    kept = {"none": "no photo is kept", "unsure": "photos not surely recognised are kept",
            "all": "every photo is kept"}[policy.keep]
    counted = "questions are counted (anonymously)" if policy.counting else "questions are not counted"
    return f"{counted}; {kept}" + (f" for {policy.retention_days} days" if policy.keep != "none" else "") + \
        f" (in {log.folder})"


def keep_policy(args: argparse.Namespace):
    """The :class:`KeepPolicy` of ``serve``'s options (those not given keep the policy's defaults)."""
    from museum_search.core.visitors import KeepPolicy

    given = {name: getattr(args, name) for name in ("keep", "quota_mb", "per_day", "retention_days",
                                                      "per_client_per_hour") if getattr(args, name) is not None}
    return KeepPolicy(**given, counting=not args.no_counting)


def cmd_review(args: argparse.Namespace) -> int:
    """The staff's review queue of kept visitors' photos (core.visitors): list them, or say what each shows."""
    import time

    from museum_search.core.errors import MuseumSearchError
    from museum_search.core.visitors import KeepPolicy, VisitorLog, add_views_job, discard, unknown_job

    if args.add and not args.instance:
        raise MuseumSearchError("--add needs --as INSTANCE: the object the photos show")
    if args.instance and not args.add:
        raise MuseumSearchError("--as goes with --add PHOTO...")
    if args.into_collection and not args.add:
        raise MuseumSearchError("--into-collection goes with --add PHOTO... --as INSTANCE")
    # the longest retention: reviewing never deletes a photo that serve's own retention still keeps
    with VisitorLog.open(args.index, KeepPolicy(retention_days=3650), folder=args.visitors) as log:
        if args.list:
            _print_kept(log.kept("new"))
            return 0
        t = time.perf_counter()
        if args.discard:
            discard(log, args.discard)
            print(f"{len(set(args.discard))} photo(s) discarded")
            return 0
        if args.add:
            report = _drive(add_views_job(args.index, log, args.add, args.instance, engine=args.engine,
                                          into_collection=args.into_collection), "adding views")
            what = f"added as views of {args.instance}" + (" (copied into the collection)" if report.placed else "")
            n = len(set(args.add))
        else:
            report = _drive(unknown_job(args.index, log, args.unknown, engine=args.engine), "refitting the verdict")
            what, n = "marked as not in the collection", len(set(args.unknown))
        print(f"{n} photo(s) {what} in {time.perf_counter() - t:.1f} s; index {args.index}: {report.summary()}")
    return 0


def _print_kept(photos) -> None:
    """One line per kept photo: its id, hour, source, the answer it got and its best candidates."""
    if not photos:
        print("no kept photo waits for review")
        return
    for p in photos:
        answer = "recognised" if p.in_collection else "not recognised"
        conf = "" if p.confidence is None else f" ({p.confidence:.2f})"
        best = ", ".join(f"{c.get('instance')} {float(c.get('score') or 0):.2f}" for c in p.candidates[:3])
        print(f"{p.id}  {p.hour:%Y-%m-%d %H:00}  {p.source:<5}  {answer}{conf}  best: {best or '-'}  {p.path}")
    print(f"{len(photos)} kept photo(s) to review, newest first")


def _add_review(sub: argparse._SubParsersAction) -> None:
    s = sub.add_parser("review", help="the staff's review queue of kept visitors' photos",
                       description="List the visitors' photos kept for review, or say what they show: a view "
                                   "of a known object (added to the index by an update, in seconds), an object "
                                   "not in the collection (a calibration view), or nothing (discarded).")
    s.add_argument("index", type=Path)
    _add_visitors_folder(s)
    what = s.add_mutually_exclusive_group(required=True)
    what.add_argument("--list", action="store_true", help="list the photos waiting for review, newest first")
    what.add_argument("--add", nargs="+", metavar="PHOTO", help="photos (ids or paths) that show --as INSTANCE")
    what.add_argument("--unknown", nargs="+", metavar="PHOTO", help="photos of objects not in the collection")
    what.add_argument("--discard", nargs="+", metavar="PHOTO", help="photos to delete")
    s.add_argument("--as", dest="instance", default=None, metavar="INSTANCE", help="the object --add's photos show")
    s.add_argument("--into-collection", action="store_true",
                   help="copy the photos into the collection folder (new files only, under a name its labelling "
                        "rule gives the object; refused for a catalogue) instead of the visitors folder")
    _add_engine_option(s)
    s.set_defaults(func=cmd_review)


def cmd_stats(args: argparse.Namespace) -> int:
    """What visitors asked about (core.visitors' counts): the figures, as text or ``--json``, and ``--csv``."""
    from museum_search.core.visitors import KeepPolicy, VisitorLog

    with VisitorLog.open(args.index, KeepPolicy(), folder=args.visitors, create=False) as log:
        stats = log.stats(days=args.days)
        folder = log.folder
    if args.csv is not None:
        stats.to_csv(args.csv)
    if args.json:
        print(json.dumps({**stats.to_dict(), "folder": str(folder), "days": args.days}, indent=1))
        return 0
    _print_stats(stats, folder, args.days)
    if args.csv is not None:
        print(f"the counts per hour written to {args.csv}")
    return 0


def _print_stats(stats, folder, days: int | None) -> None:
    span = "in all" if days is None else f"over the last {days} day(s)"
    if not stats.total:
        print(f"no question counted {span} (the counts live in {folder})")
        return
    print(f"{stats.total:,} question(s) {span}; {stats.not_recognised:,} not recognised "
          f"({stats.share_not_recognised:.0%})")
    print("per day (questions, not recognised):")
    for day, n, missed in stats.per_day:
        print(f"  {day}  {n:>6,}  {missed:>6,}  {missed / n:.0%}")
    print("most asked objects (times recognised):")
    for instance, n in stats.top_objects[:10]:
        print(f"  {n:>6,}  {instance}")
    for title, counts in (("confidence", stats.bands), ("languages", stats.languages), ("sources", stats.sources)):
        print(f"{title}: " + ", ".join(f"{k or 'unknown'} {v:,}" for k, v in counts.items() if v))


def _add_stats(sub: argparse._SubParsersAction) -> None:
    s = sub.add_parser("stats", help="what visitors asked about: questions per day, not recognised, objects",
                       description="The anonymous counts the kiosk and serve keep of visitors' questions "
                                   "(per hour: the object or none, verdict, confidence band, language, source).")
    s.add_argument("index", type=Path)
    _add_visitors_folder(s)
    s.add_argument("--days", type=_int_in(1, 100_000), default=None, metavar="N", help="only the last N days")
    s.add_argument("--json", action="store_true", help="print the figures as JSON")
    s.add_argument("--csv", type=Path, default=None, metavar="FILE",
                   help="write the counts per hour as CSV (a new file: an existing one is refused)")
    s.set_defaults(func=cmd_stats)


#: The subcommands in the order ``--help`` lists them, each added by its own function.
_COMMANDS = (_add_index, _add_import, _add_update, _add_upgrade, _add_query, _add_evaluate, _add_info,
             _add_backbones, _add_gui, _add_demo, _add_serve, _add_review, _add_stats)


def build_parser() -> argparse.ArgumentParser:
    """The command line's parser: the global options, then each subcommand (one ``_add_*`` function each)."""
    p = argparse.ArgumentParser(prog=PROG, description="Instance search in museum and heritage collections.")
    p.add_argument("--version", action="version", version=f"{PROG} {__version__}")
    p.add_argument("-v", "--verbose", action="store_true", help="log details to stderr")
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for add in _COMMANDS:
        add(sub)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; Ctrl-C at any moment (even while the libraries load) exits 130 with one line."""
    previous, sys.unraisablehook = sys.unraisablehook, _keep_interrupts
    try:
        return _main(argv)
    except KeyboardInterrupt:
        try:
            print(f"{PROG}: {_interrupted_text()}", file=sys.stderr)
        except KeyboardInterrupt:
            pass
        _forget_interrupt()
        return 130
    finally:
        sys.unraisablehook = previous
        if argv is None:  # the program itself (not a call with arguments): see _ignore_late_interrupts
            _ignore_late_interrupts()


def _ignore_late_interrupts() -> None:
    """Once the command has ended, a Ctrl-C changes nothing: it is ignored, so the exit code stays
    the command's (a SIGINT while the interpreter finalizes, its handler reset, killed the process
    after a finished run: -2 instead of 0)."""
    import signal

    try:
        signal.signal(signal.SIGINT, signal.SIG_IGN)
    except ValueError:  # not the main thread
        pass


def _keep_interrupts(unraisable: Any) -> None:
    """``sys.unraisablehook`` while a command runs: a Ctrl-C that lands where Python cannot raise it
    (a weakref callback of the import system, a ``__del__``) would be printed as "Exception ignored"
    and lost, and the command would go on to its end: it is raised again in the main thread, from
    another thread a moment later (raised at once, it would land in the same place again)."""
    if isinstance(unraisable.exc_value, KeyboardInterrupt):
        import _thread
        import threading

        threading.Timer(0.01, _thread.interrupt_main).start()
    else:
        sys.__unraisablehook__(unraisable)


def _forget_interrupt() -> None:
    """Make the handled Ctrl-C end in exit code 130. A KeyboardInterrupt that ended code run by a
    string ``exec`` (numpy and scipy import with one) leaves CPython's "unhandled interrupt" flag
    set even once caught, and ``python -m museum_search`` then dies by SIGINT after exiting; each
    string ``exec`` clears the flag first (CPython's run_eval_code_obj), so one does here."""
    exec("None", {})


def _interrupted_text() -> str:
    """What Ctrl-C did: nothing, or (if it came after an index's commit) the index was saved."""
    committed = []
    if "museum_search.core.index._store" in sys.modules:  # nothing was written if core never loaded
        from museum_search.core.index import committed_in_this_process

        committed = committed_in_this_process()
    if committed:
        where = ", ".join(dict.fromkeys(str(p) for p in committed))
        return (f"interrupted after the index was saved; {where} holds the new index (files of the "
                "previous one that remain are removed by the next update)")
    return "cancelled; nothing was changed"


def _main(argv: Sequence[str] | None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING,
                        format=f"{PROG}: %(message)s")
    from museum_search.core.errors import MuseumSearchError

    try:
        return int(args.func(args) or 0)
    except MuseumSearchError as exc:
        print(f"{PROG}: error: {exc}", file=sys.stderr)
        return 1
    except BrokenPipeError:  # the reader of the output went away (| head): stop quietly
        _drop_stdout()
        return 1
    except (OSError, ValueError) as exc:
        if args.verbose:
            raise
        print(f"{PROG}: error: {exc}", file=sys.stderr)
        return 1
    except Exception as exc:  # a bug: still one line and exit 1 (the README's codes); -v shows where
        if args.verbose:
            raise
        print(f"{PROG}: error: unexpected {type(exc).__name__}: {exc} (a bug; run again with -v for the "
              "details and report them)", file=sys.stderr)
        return 1


def _drop_stdout() -> None:
    """Point stdout at the null device, so the exit's flush of what is still buffered does not fail
    again ("Exception ignored ... BrokenPipeError") after the reader closed the pipe."""
    import os

    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError):  # no file descriptor (captured output): nothing to flush there
        pass
