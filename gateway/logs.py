"""The server's logging: one line format for every logger (uvicorn's included), text or JSON.

Every line is ``TIMESTAMP LEVEL LOGGER: MESSAGE`` (``--log-format text``, the
default) or one JSON object ``{"ts", "level", "logger", "msg", ...}`` (``--log-format
json``), where ``...`` are the record's extra fields (``request_id``, ``tenant``,
``status``, ...) and, for a line written while a request is handled, the fields
noted for that request (`note_request`). The timestamp is ISO-8601 in local time
with milliseconds and the UTC offset (``2026-12-05T11:12:32.696+00:00``).

`configure_logging` installs the one handler on the root logger, routes Python
warnings and transformers' own handler through it, and turns progress bars off when
stderr is not a terminal. `uvicorn_log_config` is uvicorn's ``log_config``: its
loggers keep no handlers of their own and propagate to that one.
"""

from __future__ import annotations

import contextvars
import datetime
import logging
import os
import sys
from typing import Any, TextIO

import orjson
from huggingface_hub.utils import disable_progress_bars
from transformers.utils import logging as hf_logging

LOG_FORMATS = ("text", "json")
LOG_LEVELS = ("debug", "info", "warning", "error")
UVICORN_LOGGERS = ("uvicorn", "uvicorn.error", "uvicorn.access", "uvicorn.asgi")
# slicegate's own loggers: at the level asked for; other libraries' at INFO or above
OWN_LOGGERS = ("gateway", "scheduler", "models", "executors", "loadgen", "benchmarks")

# NOTE: one mutable dict per HTTP request, set by the outermost middleware
# (gateway/accesslog.py) and shared with everything that request runs (its tasks copy the
# context, not the dict), so a route can note its tenant for the access line.
_REQUEST: contextvars.ContextVar[dict[str, Any] | None] = contextvars.ContextVar(
    "slicegate_request_log_fields", default=None)

ERROR_FIELD = "_error"  # among a request's fields: the exception its 500 came from

# attributes every LogRecord has: anything else on a record is an extra field
_STANDARD = frozenset(vars(logging.LogRecord("", 0, "", 0, "", (), None))) | {
    "message", "asctime", "taskName", "color_message"}  # NOTE: uvicorn's ANSI-coloured copy


def begin_request() -> tuple[dict[str, Any], contextvars.Token[dict[str, Any] | None]]:
    """A fresh field dict for the HTTP request now starting (and the token to end it)."""
    fields: dict[str, Any] = {}
    return fields, _REQUEST.set(fields)


def end_request(token: contextvars.Token[dict[str, Any] | None]) -> None:
    _REQUEST.reset(token)


def note_request(**fields: Any) -> bool:
    """Attach `fields` (e.g. ``tenant="ide"``) to the HTTP request being handled, if any
    (returns whether there is one): its access line and the JSON lines written while it
    runs carry them."""
    current = _REQUEST.get()
    if current is not None:
        current.update(fields)
    return current is not None


def note_error(exc: BaseException) -> None:
    """The exception the HTTP request being handled ended in (its access line's traceback)."""
    note_request(**{ERROR_FIELD: exc})


def request_fields() -> dict[str, Any]:
    """The fields noted for the HTTP request being handled (empty outside one)."""
    return dict(_REQUEST.get() or {})


def timestamp(created: float) -> str:
    """ISO-8601, local time with its UTC offset, to the millisecond."""
    moment = datetime.datetime.fromtimestamp(created).astimezone()
    return moment.isoformat(timespec="milliseconds")


class TextFormatter(logging.Formatter):
    """``TIMESTAMP LEVEL LOGGER: MESSAGE`` (a traceback, if any, on the lines below)."""

    def __init__(self) -> None:
        super().__init__("%(asctime)s %(levelname)s %(name)s: %(message)s")

    def formatTime(self, record: logging.LogRecord, datefmt: str | None = None) -> str:
        return timestamp(record.created)


class JsonFormatter(logging.Formatter):
    """One JSON object per line: ts, level, logger, msg, the extra fields, exc (a traceback)."""

    def format(self, record: logging.LogRecord) -> str:
        line: dict[str, Any] = {"ts": timestamp(record.created), "level": record.levelname,
                                "logger": record.name, "msg": record.getMessage()}
        for key, value in vars(record).items():
            if key not in _STANDARD and not key.startswith("_"):
                line.setdefault(key, value)
        if record.exc_info:
            line["exc"] = self.formatException(record.exc_info)
        elif record.exc_text:
            line["exc"] = record.exc_text
        return orjson.dumps(line, default=str).decode()


class RequestFields(logging.Filter):
    """Adds the current HTTP request's noted fields to each record (those it lacks)."""

    def filter(self, record: logging.LogRecord) -> bool:
        for key, value in (_REQUEST.get() or {}).items():
            if not hasattr(record, key):
                setattr(record, key, value)
        return True


def make_formatter(log_format: str) -> logging.Formatter:
    if log_format not in LOG_FORMATS:
        raise ValueError(f"log format {log_format!r}: use one of {', '.join(LOG_FORMATS)}")
    return JsonFormatter() if log_format == "json" else TextFormatter()


class _GatewayHandler(logging.StreamHandler):
    """The handler `configure_logging` installs (so a second call replaces it)."""


def configure_logging(level: str = "info", log_format: str = "text",
                      stream: TextIO | None = None) -> logging.Handler:
    """Send every logger's records, in `log_format`, to `stream` (default stderr), at
    `level` and above (other libraries' DEBUG lines stay off); returns the handler.
    Progress bars go off unless `stream` is a terminal."""
    stream = stream if stream is not None else sys.stderr
    handler = _GatewayHandler(stream)
    handler.setFormatter(make_formatter(log_format))
    handler.addFilter(RequestFields())
    root = logging.getLogger()
    for old in [h for h in root.handlers if isinstance(h, _GatewayHandler)]:
        root.removeHandler(old)
    root.addHandler(handler)
    threshold = logging.getLevelName(level.upper())
    root.setLevel(max(threshold, logging.INFO))
    for name in OWN_LOGGERS:
        logging.getLogger(name).setLevel(threshold)
    logging.captureWarnings(True)
    # NOTE: transformers writes through a handler of its own, without a timestamp
    hf_logging.disable_default_handler()
    hf_logging.enable_propagation()
    if not _is_terminal(stream):
        quiet_progress_bars()
    return handler


def _is_terminal(stream: TextIO) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError):
        return False


def quiet_progress_bars() -> None:
    """No progress bars (carriage returns in a log file): transformers', the hub's, and
    tqdm's in processes started from here (tqdm reads its environment when imported)."""
    os.environ["TQDM_DISABLE"] = "1"
    os.environ["HF_HUB_DISABLE_PROGRESS_BARS"] = "1"
    hf_logging.disable_progress_bar()
    disable_progress_bars()


def uvicorn_log_config() -> dict[str, Any]:
    """uvicorn's ``log_config``: its loggers without handlers of their own, propagating
    to the root logger's (`configure_logging`), so their lines share its format."""
    loggers = {name: {"handlers": [], "propagate": True} for name in UVICORN_LOGGERS}
    return {"version": 1, "disable_existing_loggers": False, "loggers": loggers}
