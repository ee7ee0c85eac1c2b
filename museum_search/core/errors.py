"""Errors a user can cause. Each message says what happened and what to do about it."""


class MuseumSearchError(Exception):
    """Base class for every error that is reported to the user as a one-line message."""


class ImageError(MuseumSearchError):
    """An image file could not be used (corrupt, truncated, empty, not an image, too large...)."""

    def __init__(self, path, reason: str):
        self.path = str(path)
        self.reason = reason
        super().__init__(f"{self.path}: {reason}")


class WeightsUnavailableError(MuseumSearchError):
    """Pretrained weights for a backbone are not available on this machine."""


class IndexFormatError(MuseumSearchError):
    """An index on disk is damaged, of another format version, or does not match the request."""


class LabelError(MuseumSearchError):
    """A collection or query set could not be labelled with the requested rule."""


class OutputFolderError(MuseumSearchError):
    """An index cannot be written to the folder given (it is the collection, holds other files...)."""


class IndexLockedError(MuseumSearchError):
    """Another process is writing the same index."""


class SettingsError(MuseumSearchError):
    """A query setting out of its range or of the wrong kind (``museum_search.core.answer._checks``);
    ``field`` names it (``k``, ``options.k_g``, ``verdict.min_inliers``, ``verdict.model_verified.weights``)."""

    def __init__(self, field: str, message: str) -> None:
        self.field = field
        self.message = message
        super().__init__(f"{field}: {message}")


def reraise_interrupt(exc: BaseException) -> None:
    """Raise KeyboardInterrupt if ``exc`` comes from one: a Ctrl-C while a native module loads
    (pybind11, e.g. ONNX Runtime's, reports it as ``ImportError("initialization failed")`` with the
    interrupt as its cause) must stop the program, not be taken for a failure that a fallback
    (torch instead of ONNX Runtime, float32 matching) quietly works around. Call it first in an
    ``except Exception`` around such a load."""
    seen: set[int] = set()
    cause: BaseException | None = exc
    while cause is not None and id(cause) not in seen:
        if isinstance(cause, KeyboardInterrupt):
            raise KeyboardInterrupt from exc
        seen.add(id(cause))
        cause = cause.__cause__ or cause.__context__
