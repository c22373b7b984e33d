"""Structured (one JSON object per line) logging for the gateway and uvicorn."""

from __future__ import annotations

import logging
import logging.config
from datetime import UTC, datetime
from typing import Any

import orjson

_STANDARD = set(logging.makeLogRecord({}).__dict__) | {"message", "asctime", "color_message"}


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, Any] = {
            "ts": datetime.fromtimestamp(record.created, UTC).isoformat().replace("+00:00", "Z"),
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
        }
        for key, value in record.__dict__.items():
            if key not in _STANDARD and not key.startswith("_"):
                entry[key] = value
        if record.exc_info:
            entry["exc"] = self.formatException(record.exc_info)
        return orjson.dumps(entry, default=str).decode()


def config(level: str = "info") -> dict[str, Any]:
    """A logging dictConfig, also handed to uvicorn so its own lines are JSON too."""
    upper = level.upper()
    return {
        "version": 1,
        "disable_existing_loggers": False,
        "formatters": {"json": {"()": JsonFormatter}},
        "handlers": {
            "stderr": {
                "class": "logging.StreamHandler",
                "formatter": "json",
                "stream": "ext://sys.stderr",
            }
        },
        "loggers": {
            "jsgw": {"level": upper, "handlers": ["stderr"], "propagate": False},
            "uvicorn": {"level": upper, "handlers": ["stderr"], "propagate": False},
            "uvicorn.access": {"level": "WARNING", "handlers": ["stderr"], "propagate": False},
        },
        "root": {"level": "WARNING", "handlers": ["stderr"]},
    }


def setup(level: str = "info") -> None:
    logging.config.dictConfig(config(level))
