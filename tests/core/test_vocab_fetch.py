"""make fetch-vocab (llmrs_core.vocab_fetch): pinned, checked, idempotent."""

from __future__ import annotations

import pytest

from llmrs_core import vocab_fetch
from llmrs_core.fetch import FetchError


def test_a_wrong_sdist_is_refused_and_nothing_extracted(tmp_path):
    fake = tmp_path / vocab_fetch.SDIST
    fake.write_bytes(b"not the sdist")
    with pytest.raises(FetchError, match=r"sha256 .* expected 832db069.*nothing was extracted"):
        vocab_fetch.extract_vocab(fake, tmp_path / "cache")
    assert not (tmp_path / "cache").exists()


def test_a_complete_cache_is_not_fetched_again(tmp_path, monkeypatch):
    cache = tmp_path / "cache"
    cache.mkdir()
    for v in vocab_fetch.VOCABS:
        for ext in ("", ".inp", ".out"):
            (cache / f"ggml-vocab-{v}.gguf{ext}").write_text("x")
    monkeypatch.setattr(vocab_fetch, "download_sdist", lambda dest: pytest.fail("downloaded again"))
    assert not vocab_fetch.is_complete(cache), "no stamp yet: the files could be from another version"
    (cache / vocab_fetch.STAMP).write_text(vocab_fetch.SDIST_SHA256 + "\n")
    assert vocab_fetch.is_complete(cache)
    assert vocab_fetch.fetch_vocab(directory=cache) == cache
    (cache / "ggml-vocab-phi-3.gguf.out").unlink()
    assert not vocab_fetch.is_complete(cache)


def test_vocab_dir_follows_the_environment(tmp_path, monkeypatch):
    monkeypatch.setenv("LLMRS_VOCAB_DIR", str(tmp_path / "v"))
    assert vocab_fetch.vocab_dir() == tmp_path / "v"
