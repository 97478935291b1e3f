"""The router's request log (chapter 12, section 12.4): one JSON line per proxied request.

A line::

    {"event": "ab_request", "time": 1764590000.123, "variant": "q8_0", "user_hash": "3f2a9c0e5d1b7a64",
     "endpoint": "chat", "stream": true, "status": 200, "prompt_tokens": 31, "completion_tokens": 12,
     "ttft_s": 0.0412, "tpot_s": 0.0215, "e2e_s": 0.3127, "error": null}

``user_hash`` is a pseudonym of the request's ``user`` (``null`` without one, and
then the assignment was not sticky: :mod:`.assign`); ``ttft_s`` (arrival at the
router to the first content) and ``tpot_s`` ((last content - first content) /
(tokens - 1), vLLM's TPOT) are measured on streamed answers only and ``null``
otherwise. ``llmrs ab report`` reads these lines (:func:`read_records`).
"""

from __future__ import annotations

import json
import sys
import threading
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TextIO


@dataclass
class RequestRecord:
    variant: str
    user_hash: str | None
    endpoint: str  # "chat" or "completions"
    stream: bool
    time: float = 0.0
    status: int = 0
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    ttft_s: float | None = None
    tpot_s: float | None = None
    e2e_s: float | None = None
    error: str | None = None

    def as_line(self) -> str:
        d = {"event": "ab_request", **asdict(self)}
        for k in ("ttft_s", "tpot_s", "e2e_s"):
            if d[k] is not None:
                d[k] = round(d[k], 6)
        d["time"] = round(d["time"], 3)
        return json.dumps(d, ensure_ascii=False)


class RecordWriter:
    """Appends records to a text stream, one line each (thread-safe); a broken stream disables it."""

    def __init__(self, stream: TextIO | None):
        self.stream = stream
        self._lock = threading.Lock()

    def write(self, record: RequestRecord) -> None:
        if self.stream is None:
            return
        with self._lock:
            try:
                self.stream.write(record.as_line() + "\n")
                self.stream.flush()
            except (OSError, ValueError) as e:
                self.stream = None
                print(f"llmrs ab: request log disabled, writing it failed: {type(e).__name__}: {e}", file=sys.stderr)


def read_records(path: str | Path) -> list[RequestRecord]:
    """Every ``ab_request`` line of the log at ``path`` (other lines are skipped); errors name the line."""
    records = []
    fields = set(RequestRecord.__dataclass_fields__)
    with open(path, encoding="utf-8") as f:
        for i, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                d = json.loads(line)
            except ValueError as e:
                raise ValueError(f"{path}, line {i}: not JSON ({e})") from None
            if not isinstance(d, dict) or d.get("event") != "ab_request":
                continue
            missing = {"variant", "endpoint", "stream"} - set(d)
            if missing:
                raise ValueError(f"{path}, line {i}: an ab_request line without {sorted(missing)}")
            records.append(RequestRecord(**{k: v for k, v in d.items() if k in fields}))
    return records


__all__ = ["RecordWriter", "RequestRecord", "read_records"]
