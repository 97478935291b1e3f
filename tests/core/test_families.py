"""Every model family against transformers and llama.cpp (issue 28), on tiny random models.

The fixtures in tests/golden/families/ were made by scripts/make_family_models.py: a tiny
random model of each family saved by transformers' own classes (``hf/``), converted by
llama.cpp's own ``convert_hf_to_gguf.py`` (``model.gguf``), and the logits and greedy
tokens of both references on fixed ids (``golden.npz``). Nothing here needs either
reference installed.

Tolerances: the references and the engine all compute in float32, over a few layers of
width 64-128, so the logits agree to a few float32 roundings of their size: a normalised
error ``max|ours - ref| / max|ref|`` of 1e-5 is ~100 ulps of headroom (measured: 1e-7-3e-6).
Gemma against llama.cpp is the stated exception: ggml's CPU GELU reads an fp16 table
(relative error ~1e-3 per activation), measured 3-5e-4 on these models, so 2e-3 there.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

import llmrs_core as llmrs
from llmrs_core.config import ConfigError, ModelConfig
from llmrs_core.rope import Rotary

ROOT = Path(__file__).resolve().parents[1] / "golden" / "families"
FAMILIES = sorted(p.name for p in ROOT.iterdir() if (p / "golden.npz").exists()) if ROOT.exists() else []
TOLERANCE = 1e-5
GGML_GELU_TOLERANCE = 2e-3  # Gemma vs llama.cpp: ggml's fp16 GELU table (see the module docstring)


def normalised_error(got: np.ndarray, want: np.ndarray) -> float:
    return float(np.abs(got - want).max() / np.abs(want).max())


def golden(name: str) -> dict[str, np.ndarray]:
    with np.load(ROOT / name / "golden.npz") as g:
        return dict(g)


@pytest.fixture(scope="module", params=FAMILIES)
def family(request):
    return request.param


def source(name: str, kind: str) -> Path:
    path = ROOT / name / ("hf" if kind == "hf" else "model.gguf")
    if not path.exists():
        pytest.skip(f"{name} has no {kind} fixture (run scripts/make_family_models.py)")
    return path


@pytest.mark.parametrize("kind", ["gguf", "hf"])
@pytest.mark.parametrize("backend", ["numpy", "numba"])
def test_logits_match_transformers(family, kind, backend):
    g = golden(family)
    model = llmrs.load(source(family, kind), backend=backend)
    err = normalised_error(model.logits(g["ids"]), g["hf_logits"])
    assert err <= TOLERANCE, f"{family} ({kind}, {backend}): logits differ from transformers by {err:.2e}"


@pytest.mark.parametrize("backend", ["numpy", "numba"])
def test_logits_match_llamacpp(family, backend):
    g = golden(family)
    if "llamacpp_logits" not in g:
        pytest.skip(f"{family}: no llama.cpp logits in the fixture")
    model = llmrs.load(source(family, "gguf"), backend=backend)
    bound = GGML_GELU_TOLERANCE if family.startswith("gemma") else TOLERANCE
    err = normalised_error(model.logits(g["ids"]), g["llamacpp_logits"])
    assert err <= bound, f"{family} ({backend}): logits differ from llama.cpp's by {err:.2e}"


@pytest.mark.parametrize("reference", ["hf", "llamacpp"])
def test_greedy_tokens_match_the_references(family, reference):
    """32 greedy tokens from the same prompt as transformers' ``generate`` and llama.cpp's."""
    g = golden(family)
    if f"{reference}_greedy" not in g:
        pytest.skip(f"{family}: no {reference} greedy tokens in the fixture")
    model = llmrs.load(source(family, "gguf"), backend="numba")
    prompt = [int(i) for i in g["hf_prompt"]]
    want = [int(i) for i in g[f"{reference}_greedy"]]
    got = model.generate(prompt, max_tokens=len(want)).token_ids
    assert got == want[:len(got)], f"{family}: greedy tokens differ from {reference}'s at step " \
        f"{next(i for i, (a, b) in enumerate(zip(got, want)) if a != b)}"
    if len(got) < len(want):  # stopped early: only at an end-of-generation token
        assert want[len(got)] in model._stop_token_ids()


def test_a_batch_of_three_equals_each_alone(family):
    g = golden(family)
    model = llmrs.load(source(family, "gguf"), backend="numba")
    ids = [int(i) for i in g["ids"]]
    prompts = [ids[:5], ids[3:20], ids[1:12]]
    alone = [model.generate(p, max_tokens=6).token_ids for p in prompts]
    together = [c.token_ids for c in model.generate(prompts, max_tokens=6)]
    assert together == alone


def test_the_hf_directory_and_the_gguf_give_one_config(family):
    from_hf = llmrs.load(source(family, "hf")).config
    from_gguf = llmrs.load(source(family, "gguf")).config
    # the converter writes the vocabulary's length and its own context; the rest must agree
    assert from_hf == from_gguf or {
        k: (getattr(from_hf, k), getattr(from_gguf, k))
        for k in ModelConfig.__dataclass_fields__ if getattr(from_hf, k) != getattr(from_gguf, k)
    } == {}


# -- RoPE at long positions (Llama 3's factors change nothing measurable below 8,192) -------


def rotary_cases(name: str, net, config) -> list[tuple[str, Rotary]]:
    """(key prefix in rope_<name>.npz, our Rotary it must match)."""
    glob = net.layers[0].rotary if not config.swa_layers else next(
        layer.rotary for i, layer in enumerate(net.layers) if i not in config.swa_layers)
    if name == "llama3":
        return [("", glob)]
    if name == "phi3":
        return [("short_", glob), ("long_", glob.long)]
    local = next(layer.rotary for i, layer in enumerate(net.layers) if i in config.swa_layers)
    return [("full_attention_", glob), ("sliding_attention_", local)]


@pytest.mark.parametrize("name", ["llama3", "phi3", "gemma3"])
def test_rope_matches_transformers_rotary_embedding(name):
    """cos and sin of our Rotary against transformers' rotary embedding of the same config, at
    positions up to 100,000: Llama 3's factors act only past 8,192, Phi-3's long factors only
    past the original context."""
    path = ROOT / f"rope_{name}.npz"
    if not path.exists():
        pytest.skip(f"no {path.name}")
    ref = dict(np.load(path))
    model = llmrs.load(source(name, "gguf"), backend="numpy")
    for prefix, rotary in rotary_cases(name, model.network, model.config):
        positions = ref.get(prefix + "positions", ref.get("positions"))
        angles = np.outer(positions.astype(np.float64), rotary.freqs)
        for fn in ("cos", "sin"):
            got = getattr(np, fn)(angles) * rotary.mscale
            want = ref[prefix + fn][:, : got.shape[-1]]  # transformers repeats the D/2 values twice
            # transformers forms its angles in float32: at position p the angle is off by up to
            # p * 2**-24 radians (6e-3 at 100,000); ours are float64
            bound = 4 * float(positions.max()) * 2.0**-24 + 1e-6
            err = float(np.abs(got - want).max())
            assert err <= bound, f"{name} {prefix}{fn}: differs from transformers' by {err:.2e} (bound {bound:.1e})"


# -- what each family's switch costs when it is wrong (appendix B's figures) ----------------


def test_every_family_flag_matters():
    """Each quirk of the fixtures changes the logits: a fixture without its quirk could not
    catch an engine that ignores it (golden.json's quirk_off_cost, measured in transformers)."""
    figures = json.loads((ROOT / "golden.json").read_text())["families"]
    for name, info in figures.items():
        for quirk, cost in info.get("quirk_off_cost", {}).items():
            assert cost > 100 * TOLERANCE, f"{name}: switching off {quirk!r} changes the logits by only {cost:.1e}"


# -- bad input ------------------------------------------------------------------------------


def test_an_unsupported_rope_scaling_is_refused(tmp_path):
    from llmrs_core.formats.gguf_writer import write_gguf
    from llmrs_core.testing import TINY_LLAMA, tiny_llama_metadata, tiny_llama_tensors

    md = tiny_llama_metadata(**TINY_LLAMA) | {"llama.rope.scaling.type": "yarn", "llama.rope.scaling.factor": 4.0}
    path = tmp_path / "yarn.gguf"
    write_gguf(path, md, tiny_llama_tensors(**TINY_LLAMA))
    with pytest.raises(ConfigError, match="RoPE scaling 'yarn' is not supported"):
        llmrs.load(path)


def test_tensor_parallel_refuses_a_family_it_does_not_shard(family):
    from llmrs_core.distributed.communicator import run_local

    if family in ("llama2-linear",):
        pytest.skip("linear scaling shards like Llama")
    with pytest.raises(Exception, match="tensor and pipeline parallelism run the llama family without extras"):
        run_local(2, lambda comm: llmrs.load(source(family, "gguf"), tp=2, comm=comm))


def test_a_model_bigger_than_memory_is_refused_with_the_numbers(monkeypatch):
    from llmrs_core import memory

    monkeypatch.setattr(memory, "available_host_bytes", lambda: 1000)
    model = llmrs.load(source(FAMILIES[0], "gguf"), backend="numpy")
    with pytest.raises(ValueError, match=r"needs .* GiB, but this machine has .* available"):
        _ = model.network


def test_rotary_plain_is_chapter_3s_rope():
    assert Rotary(1e4, 64).plain
    assert not Rotary(1e4, 64, scale=2.0).plain
    np.testing.assert_allclose(Rotary(1e4, 8, factors=np.full(4, 2.0)).freqs, Rotary(1e4, 8).freqs / 2)
