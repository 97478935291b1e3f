"""Re-run notebooks in place so their stored outputs (and plots) match the code.

    .venv/bin/python scripts/refresh_notebooks.py                    # every chapter
    .venv/bin/python scripts/refresh_notebooks.py chapters/ch01_transformer/ch01_transformer.ipynb

Runs with LLMRS_IMPL=solutions (as CI does), from each notebook's folder,
and drops per-cell execution timestamps so a re-run changes only what changed.
`make notebooks` calls this.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import nbformat
from nbclient import NotebookClient

ROOT = Path(__file__).resolve().parents[1]


def refresh(path: Path) -> None:
    nb = nbformat.read(path, as_version=4)
    start = time.perf_counter()
    NotebookClient(
        nb, timeout=600, kernel_name="python3", resources={"metadata": {"path": str(path.parent)}}
    ).execute()
    for cell in nb.cells:
        cell.metadata.pop("execution", None)
    nbformat.write(nb, path)
    print(f"{path.relative_to(ROOT)}: {time.perf_counter() - start:.1f} s, {path.stat().st_size / 1024:.0f} KiB")


def main(argv: list[str]) -> int:
    os.environ["LLMRS_IMPL"] = "solutions"
    # one BLAS thread: steady and fast for the NumPy backend's small matrices (see the Makefile)
    for var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ.setdefault(var, "1")
    paths = [Path(a).resolve() for a in argv] or sorted((ROOT / "chapters").glob("*/*.ipynb"))
    for path in paths:
        refresh(path)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
