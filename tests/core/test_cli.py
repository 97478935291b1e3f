"""The `llmrs` command line and the `llmrs_core.load` front door."""

from __future__ import annotations

import json

import pytest

import llmrs_core as llmrs
from llmrs_core.cli import main
from llmrs_core.testing import write_tiny_llama


def test_info_json_on_tiny_model(tmp_path, capsys):
    path = tmp_path / "tiny.gguf"
    params = write_tiny_llama(path)
    assert main(["info", str(path), "--json"]) == 0
    info = json.loads(capsys.readouterr().out)
    assert info["config"]["n_layers"] == params["n_layers"]
    assert info["params"]["total"] == info["stored_params"]
    assert info["file_bytes"] == path.stat().st_size
    assert list(info["tensor_types"]) == ["F32"], "the tiny model stores float32 weights only"


@pytest.mark.model
def test_info_text_on_smollm2(model_path, capsys):
    assert main(["info", str(model_path)]) == 0
    out = capsys.readouterr().out
    for fact in ("30 layers", "9 query heads, 3 KV heads", "134,515,008", "23,040 bytes per token",
                 "210 Q4_1", "1 Q8_0", "98,362,432 bytes"):
        assert fact in out, f"`llmrs info` should say {fact!r}:\n{out}"


def test_info_on_missing_file(tmp_path, capsys):
    assert main(["info", str(tmp_path / "nope.gguf")]) == 1
    err = capsys.readouterr().err
    assert "llmrs info: error:" in err and "not found" in err


def test_info_on_truncated_file(tmp_path, capsys):
    path = tmp_path / "tiny.gguf"
    write_tiny_llama(path)
    path.write_bytes(path.read_bytes()[:1000])
    assert main(["info", str(path)]) == 1
    assert "truncated" in capsys.readouterr().err


def test_no_command_prints_help(capsys):
    assert main([]) == 2
    assert "fetch" in capsys.readouterr().out


def test_load_front_door(tmp_path):
    path = tmp_path / "tiny.gguf"
    write_tiny_llama(path, n_layers=3)
    model = llmrs.load(path)
    assert model.config.n_layers == 3 and model.backend_name == "numba"  # the default since chapter 8
    assert "params" in repr(model)
    with pytest.raises(ValueError, match="unknown backend 'tpu'"):
        llmrs.load(path, backend="tpu")
    with pytest.raises(FileNotFoundError, match="no config.json"):
        llmrs.load(tmp_path)  # a directory is read as a Hugging Face model (chapter 10)
    with pytest.raises(FileNotFoundError):
        llmrs.load(tmp_path / "missing.gguf")


@pytest.mark.model
def test_load_default_model(model_path, monkeypatch):
    monkeypatch.setenv("LLMRS_MODEL_DIR", str(model_path.parent))
    model = llmrs.load()
    assert model.path == model_path
    assert model.config.n_params == model.stored_params() == 134_515_008


def test_bench_speed_reports_pp_and_tg(tmp_path, capsys):
    path = tmp_path / "tiny.gguf"
    write_tiny_llama(path, weight_type="q4_1", hidden_size=64, intermediate_size=128)
    out = tmp_path / "bench.json"
    assert main(["bench", "speed", "--model", str(path), "--pp", "16", "--tg", "4", "--repetitions", "2",
                 "--backend", "numba,numpy", "--threads", "1", "--no-compare", "--json", "--output", str(out)]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result == json.loads(out.read_text())
    assert list(result["backends"]) == ["numba", "numpy"] and result["threads"] == 1
    for backend in ("numba", "numpy"):
        for kind in ("pp", "tg"):
            s = result["backends"][backend][kind]
            assert s["runs"] == 2 and s["min"] <= s["tokens_per_s"] <= s["max"]
    assert "1 threads" in result["backends"]["numba"]["describe"]
    assert result["llama_cpp"] is None and "ratio" not in result
    assert result["llama_cpp_note"].startswith("skipped")


@pytest.mark.parametrize("args,message", [
    (["--threads", "0"], "--threads must be at least 1"),
    (["--pp", "0"], "--pp must be at least 1"),
    (["--backend", "numba,tpu"], "unknown backend 'tpu'"),
])
def test_bench_speed_refuses_impossible_settings(tmp_path, capsys, args, message):
    path = tmp_path / "tiny.gguf"
    write_tiny_llama(path)
    assert main(["bench", "speed", "--model", str(path), "--no-compare", *args]) != 0
    assert message in capsys.readouterr().err


