"""The one-time ONNX export, run in a child process (:func:`._engines.export_apart`).

The export loads torch and the torch model, traces it and checks the graph against it: about
1 GB resident at its peak, which the application's process would otherwise keep as its peak for
the rest of the session (its heap does not shrink back). Here it is a process of its own that
ends when the export is written.

Protocol: a JSON request on stdin (``config``: the :class:`BackboneConfig` fields, ``download``,
``out``: where to write the model bytes); one JSON line on stdout: ``{"meta": ...}`` (the exported
model's meta, :meth:`BackboneMeta.to_dict`) or ``{"error": kind, "message": ...}``.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path


def main() -> int:
    from museum_search.core.errors import MuseumSearchError, WeightsUnavailableError
    from museum_search.core.inference._backbones import BackboneConfig
    from museum_search.core.inference._engines import ExportMismatch, export

    request = json.loads(sys.stdin.read())
    try:
        fields = dict(request["config"])
        fields["scales"] = tuple(fields.get("scales") or (1.0,))
        meta, data = export(BackboneConfig(**fields), download=bool(request.get("download", True)))
        Path(request["out"]).write_bytes(data)
        answer: dict = {"meta": meta.to_dict()}
    except BaseException as exc:  # said to the parent, which decides (as for an export in its own process)
        kind = ("mismatch" if isinstance(exc, ExportMismatch) else "weights" if isinstance(exc, WeightsUnavailableError)
                else "museum" if isinstance(exc, MuseumSearchError) else "other")
        answer = {"error": kind, "message": f"{type(exc).__name__}: {exc}" if kind == "other" else str(exc)}
    sys.stdout.write(json.dumps(answer) + "\n")
    sys.stdout.flush()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
