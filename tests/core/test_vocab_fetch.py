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


def test_vectors_pair_inputs_with_lines_of_ids(tmp_path):
    sep = "\n__ggml_vocab_test__\n"
    (tmp_path / "ggml-vocab-x.gguf.inp").write_text("Hello" + sep + "" + sep + " a\nb" + sep, encoding="utf-8")
    (tmp_path / "ggml-vocab-x.gguf.out").write_text("1 2\n\n3 4 5\n", encoding="utf-8")
    assert vocab_fetch.vocab_vectors("x", tmp_path) == [("Hello", [1, 2]), ("", []), (" a\nb", [3, 4, 5])]


def test_vectors_that_do_not_pair_up_are_refused_naming_the_file(tmp_path):
    sep = "\n__ggml_vocab_test__\n"
    (tmp_path / "ggml-vocab-x.gguf.inp").write_text("a" + sep + "b" + sep, encoding="utf-8")
    (tmp_path / "ggml-vocab-x.gguf.out").write_text("1", encoding="utf-8")
    with pytest.raises(ValueError, match=r"ggml-vocab-x\.gguf: 2 inputs in \.inp, 1 lines of ids"):
        vocab_fetch.vocab_vectors("x", tmp_path)
