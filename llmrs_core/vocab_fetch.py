"""Fetching llama.cpp's vocabulary test files (tooling for chapter 2's tests; not the engine).

llama.cpp keeps vocab-only GGUF files with test vectors in ``models/``:
``ggml-vocab-X.gguf`` (a tokenizer and no weights), ``X.gguf.inp`` (inputs
joined by ``"\\n__ggml_vocab_test__\\n"``) and ``X.gguf.out`` (one line of ids
per input). They are third-party data, so they are not committed: this module
downloads the llama-cpp-python sdist (which vendors llama.cpp) with
``pip download --no-deps --no-binary :all:``, checks its sha256 against the
pinned value and extracts only those files into the cache,
``$LLMRS_VOCAB_DIR`` or ``.cache/llama-vocab/`` in the checkout (git ignores it).

Run ``make fetch-vocab`` (``python -m llmrs_core.vocab_fetch``). A second run
finds the stamp of the pinned sdist and every file present and does nothing.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tarfile
import tempfile
from pathlib import Path

from .fetch import FetchError, repo_root, sha256_of

PACKAGE = "llama-cpp-python"
VERSION = "0.3.36"
SDIST = "llama_cpp_python-0.3.36.tar.gz"
SDIST_SHA256 = "832db0699007f1be95a7e41ef12e88926b02ba836461e36a36372db2760c1a2e"
MEMBER_DIR = "llama_cpp_python-0.3.36/vendor/llama.cpp/models/"
STAMP = ".sdist-sha256"
FETCH_COMMAND = "make fetch-vocab"

# the vocabularies whose vectors the tests check (the file name between "ggml-vocab-" and ".gguf")
VOCABS = ("llama-bpe", "qwen2", "qwen35", "gpt-2", "starcoder", "refact", "command-r",
          "deepseek-coder", "deepseek-llm", "falcon", "mpt", "llama-spm", "phi-3")


def vocab_dir() -> Path:
    """Where the vocab files live: ``$LLMRS_VOCAB_DIR``, else ``.cache/llama-vocab`` in the
    checkout, else ``~/.cache/llmrs/llama-vocab``."""
    if os.environ.get("LLMRS_VOCAB_DIR"):
        return Path(os.environ["LLMRS_VOCAB_DIR"]).expanduser()
    root = repo_root()
    return (root / ".cache" if root is not None else Path.home() / ".cache" / "llmrs") / "llama-vocab"


def _wanted(name: str) -> bool:
    base = name.rsplit("/", 1)[-1]
    return base.startswith("ggml-vocab-") and base.endswith((".gguf", ".gguf.inp", ".gguf.out"))


def is_complete(directory: Path | None = None) -> bool:
    """True when the cache holds the pinned sdist's extraction, every checked vocabulary included."""
    directory = vocab_dir() if directory is None else directory
    stamp = directory / STAMP
    return (stamp.exists() and stamp.read_text().strip() == SDIST_SHA256
            and all((directory / f"ggml-vocab-{v}.gguf{ext}").exists() for v in VOCABS for ext in ("", ".inp", ".out")))


def vocab_vectors(name: str, directory: Path | None = None) -> list[tuple[str, list[int]]]:
    """llama.cpp's test vectors of ``ggml-vocab-{name}.gguf``: ``[(text, ids), ...]``.

    ``.inp`` holds the inputs joined by ``"\\n__ggml_vocab_test__\\n"`` (the last, empty
    piece dropped), ``.out`` one line of ids per input; ``ValueError`` naming the file
    if the two do not pair up.
    """
    stem = (vocab_dir() if directory is None else directory) / f"ggml-vocab-{name}.gguf"
    inputs = stem.with_name(stem.name + ".inp").read_text(encoding="utf-8").split("\n__ggml_vocab_test__\n")[:-1]
    lines = stem.with_name(stem.name + ".out").read_text(encoding="utf-8").split("\n")[: len(inputs)]
    if len(lines) != len(inputs):
        raise ValueError(f"{stem}: {len(inputs)} inputs in .inp, {len(lines)} lines of ids in .out")
    return [(text, [int(x) for x in line.split()]) for text, line in zip(inputs, lines)]


def download_sdist(dest: Path) -> Path:
    """``pip download`` the pinned sdist into ``dest``; its path."""
    import subprocess

    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:",
           "--disable-pip-version-check", "-q", "-d", str(dest), f"{PACKAGE}=={VERSION}"]
    print(f"downloading {PACKAGE}=={VERSION} (sdist, 76 MB) for llama.cpp's vocab test files ...", file=sys.stderr)
    proc = subprocess.run(cmd, capture_output=True, text=True)
    path = dest / SDIST
    if proc.returncode != 0 or not path.exists():
        tail = "\n".join((proc.stderr or proc.stdout).strip().splitlines()[-3:])
        raise FetchError(f"could not download {PACKAGE}=={VERSION} with pip (offline?):\n{tail}\n"
                         f"Alternative: python -m llmrs_core.vocab_fetch --sdist PATH with {SDIST} "
                         "copied from another machine")
    return path


def extract_vocab(sdist: Path, directory: Path) -> list[Path]:
    """Check ``sdist``'s sha256 and extract its ``models/ggml-vocab-*`` files into ``directory``."""
    digest = sha256_of(sdist)
    if digest != SDIST_SHA256:
        raise FetchError(f"{sdist}: sha256 {digest}, expected {SDIST_SHA256} ({PACKAGE}=={VERSION}); "
                         "nothing was extracted")
    directory.mkdir(parents=True, exist_ok=True)
    written = []
    with tarfile.open(sdist, "r:gz") as tar:
        for member in tar:
            name = member.name
            if not (member.isfile() and name.startswith(MEMBER_DIR) and _wanted(name)
                    and "/" not in name[len(MEMBER_DIR):]):
                continue
            target = directory / name[len(MEMBER_DIR):]
            partial = target.with_name(target.name + ".partial")
            src = tar.extractfile(member)
            assert src is not None  # a regular file always has a stream
            with src, open(partial, "wb") as dst:
                shutil.copyfileobj(src, dst)
            os.replace(partial, target)
            written.append(target)
    (directory / STAMP).write_text(SDIST_SHA256 + "\n")
    return written


def fetch_vocab(sdist: Path | None = None, directory: Path | None = None, force: bool = False) -> Path:
    """Make sure the vocab files are in the cache (:func:`vocab_dir`); the cache's path."""
    directory = vocab_dir() if directory is None else directory
    if is_complete(directory) and not force:
        return directory
    if sdist is not None:
        extract_vocab(sdist, directory)
    else:
        tmp = Path(tempfile.mkdtemp(prefix="llmrs-vocab-"))
        try:
            extract_vocab(download_sdist(tmp), directory)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    if not is_complete(directory):
        raise FetchError(f"{SDIST} did not hold every expected vocab file ({', '.join(VOCABS)})")
    return directory


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m llmrs_core.vocab_fetch", description=__doc__.splitlines()[0])
    parser.add_argument("--sdist", type=Path, help=f"use this {SDIST} instead of downloading it")
    parser.add_argument("--force", action="store_true", help="extract again even if the cache is complete")
    args = parser.parse_args(argv)
    try:
        path = fetch_vocab(args.sdist, force=args.force)
    except FetchError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    print(f"llama.cpp vocab files in {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
