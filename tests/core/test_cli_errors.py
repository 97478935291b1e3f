"""`llmrs` on bad input: one line on stderr, `llmrs <command>: error: ...`, a non-zero exit, no traceback."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

import llmrs_core
from llmrs_core.cli import main
from llmrs_core.testing import write_tiny_llama

ROOT = Path(llmrs_core.__file__).resolve().parents[1]  # the tree under test, for subprocesses


@pytest.fixture
def tiny(tmp_path):
    path = tmp_path / "tiny.gguf"
    write_tiny_llama(path)
    return path


def one_error_line(capsys, command: str) -> str:
    err = capsys.readouterr().err
    lines = err.strip().splitlines()
    assert len(lines) == 1, f"expected one line on stderr, got:\n{err}"
    assert lines[0].startswith(f"llmrs {command}: error: "), lines[0]
    assert "Traceback" not in err
    return lines[0]


def run_cli(argv, capsys, command):
    """``main(argv)`` in-process: its exit status must be non-zero; returns the one error line."""
    rc = main(argv)
    assert rc != 0
    return one_error_line(capsys, command)


@pytest.mark.skipif(os.geteuid() == 0, reason="root reads files whatever their permissions")
def test_an_unreadable_model_file(tiny, capsys):
    tiny.chmod(0)
    try:
        line = run_cli(["info", str(tiny)], capsys, "info")
    finally:
        tiny.chmod(0o644)
    assert "Permission denied" in line and str(tiny) in line


def test_a_permission_error_is_one_line(tiny, capsys, monkeypatch):
    """The same as above where the tests run as root: opening the file raises PermissionError."""
    import builtins

    import llmrs_core.formats.gguf as gguf

    def denied(path, *args, **kwargs):
        if Path(path) == tiny:
            raise PermissionError(13, "Permission denied", str(path))
        return builtins.open(path, *args, **kwargs)

    monkeypatch.setattr(gguf, "open", denied, raising=False)
    line = run_cli(["info", str(tiny)], capsys, "info")
    assert "Permission denied" in line and str(tiny) in line


def test_a_symlink_loop(tmp_path, capsys):
    a, b = tmp_path / "a.gguf", tmp_path / "b.gguf"
    os.symlink(a, b)
    os.symlink(b, a)
    line = run_cli(["info", str(a)], capsys, "info")
    assert "symbolic links" in line and str(a) in line


def test_a_path_through_a_file(tiny, capsys):
    line = run_cli(["info", str(tiny / "model.gguf")], capsys, "info")
    assert "Not a directory" in line


def test_bench_throughput_with_zero_requests(tiny, capsys):
    line = run_cli(["bench", "throughput", "--requests", "0", "--model", str(tiny)],
                   capsys, "bench")
    assert "--requests must be at least 1, got 0" in line


def test_quantize_into_a_directory_leaves_no_partial_file(tiny, tmp_path, capsys):
    out = tmp_path / "out"
    out.mkdir()
    for target in (str(out), str(out) + os.sep):
        line = run_cli(["quantize", str(tiny), target, "--type", "q8_0"], capsys, "quantize")
        assert "is a directory" in line
        assert not list(tmp_path.rglob("*.partial")), "a failed write must leave no partial file"
        assert list(out.iterdir()) == []


def test_generate_with_max_tokens_zero(tiny, capsys):
    line = run_cli(["generate", "x", "--max-tokens", "0", "--model", str(tiny), "--backend", "numpy"],
                   capsys, "generate")
    assert "max_tokens must be at least 1, got 0" in line


@pytest.mark.model
def test_a_broken_pipe_exits_quietly(model_path):
    """`llmrs generate ... | head -c3`: the reader leaves after 3 bytes."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OPENBLAS_NUM_THREADS": "1"}
    proc = subprocess.Popen(
        [sys.executable, "-m", "llmrs_core.cli", "generate", "Once upon a time", "--max-tokens", "48",
         "--backend", "numpy", "--model", str(model_path)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env, cwd=ROOT,
    )
    assert len(proc.stdout.read(3)) == 3
    proc.stdout.close()
    err = proc.stderr.read().decode()
    rc = proc.wait(timeout=120)
    assert "Traceback" not in err and "BrokenPipeError" not in err, err
    assert rc != 0


@pytest.mark.model
def test_chat_refuses_a_message_over_the_context_and_keeps_the_conversation(model_path, capsys, monkeypatch):
    import llmrs_core.loader as loader

    sent = []
    real_chat = loader.Model.chat

    def chat(self, messages, **kwargs):
        sent.append([dict(m) for m in messages])
        return real_chat(self, messages, **kwargs)

    monkeypatch.setattr(loader.Model, "chat", chat)
    lines = iter(["hello " * 9000, "Hi", ""])  # ~9,000 tokens: over SmolLM2's 8,192
    monkeypatch.setattr("builtins.input", lambda prompt="": next(lines))
    rc = main(["chat", "--model", str(model_path), "--backend", "numpy", "--max-tokens", "4"])
    out, err = capsys.readouterr()
    assert rc == 0, err
    assert "Traceback" not in err
    assert "not sent" in err and "exceeds the model's context length 8192" in err and "kept" in err
    assert sent[-1] == [{"role": "user", "content": "Hi"}], "the refused message must leave the conversation"
    assert out.strip(), "the short message gets an answer"


def test_bench_takes_impl_or_backend_not_both(capsys):
    line = run_cli(["bench", "throughput", "--impl", "learner", "--backend", "numpy"], capsys, "bench")
    assert "--impl or --backend, not both" in line


def test_bench_throughput_impl_learner_shows_who_computes_what(tmp_path, capsys):
    path = tmp_path / "tiny.gguf"
    write_tiny_llama(path, byte_tokenizer=True, seed=5, context_length=1024)  # the prefix workload is ~600 tokens
    assert main(["bench", "throughput", "--impl", "learner", "--model", str(path), "--requests", "2",
                 "--max-num-seqs", "2"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("backend 'learner'") and "scheduler (Exercise 7.6)" in out and "requests/s" in out
