"""Writing files so that a failure never leaves one behind that looks finished (or any at all).

Every file the engine writes (a quantised GGUF, safetensors, a benchmark's
JSON) goes to ``NAME.partial`` next to its target and is renamed into place
only when it is complete. On any failure — a full disk, a target that is a
directory, Ctrl-C — the partial file is removed and the error propagates.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from pathlib import Path
from typing import IO


@contextlib.contextmanager
def atomic_write(path: str | os.PathLike[str], mode: str = "wb") -> Iterator[IO]:
    """``with atomic_write(path) as f: f.write(...)``: ``path`` appears only if the block succeeds."""
    path = Path(path)
    if path.is_dir():
        raise IsADirectoryError(f"{path} is a directory; give a file name to write")
    if not path.parent.is_dir():
        raise FileNotFoundError(f"cannot write {path}: the folder {path.parent} does not exist")
    tmp = path.with_name(path.name + ".partial")
    try:
        with open(tmp, mode) as f:
            yield f
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise


__all__ = ["atomic_write"]
