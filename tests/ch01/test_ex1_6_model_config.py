"""Exercise 1.6 — Building a Model Config.

References no one here wrote: the SmolLM2 GGUF file itself (its metadata and
tensor shapes) and the config Hugging Face transformers builds from it
(tests/golden/smollm2_hf_config.json, captured by scripts/capture_golden.py).
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from llmrs_core.formats.gguf import read_gguf
from llmrs_core.testing import TINY_LLAMA, write_tiny_llama

GOLDEN = Path(__file__).resolve().parents[1] / "golden"
SMOLLM2_PARAMS = 134_515_008


@pytest.fixture(scope="module")
def hf_config() -> dict:
    return json.loads((GOLDEN / "smollm2_hf_config.json").read_text())


def built(ex, who: str, build):
    """``build()``, a constructor on a valid model: a ConfigError from it is the learner's mistake."""
    try:
        return build()
    except ex.ConfigError as e:
        hint = (
            " That is about head_dim: it is embedding_length // head_count (hidden_size // the query heads), "
            "not // head_count_kv" if "head_dim" in str(e) else ""
        )
        raise AssertionError(f"{who} refused a valid model with ConfigError: {e}.{hint}") from e


def smollm2_config(ex, smollm2_gguf):
    return built(ex, "from_gguf", lambda: ex.ModelConfig.from_gguf(smollm2_gguf))


def expected_fields(hf_config: dict) -> dict:
    """The config fields transformers reads from SmolLM2's file (the golden config.json)."""
    return {
        "vocab_size": hf_config["vocab_size"],
        "hidden_size": hf_config["hidden_size"],
        "intermediate_size": hf_config["intermediate_size"],
        "n_layers": hf_config["num_hidden_layers"],
        "n_heads": hf_config["num_attention_heads"],
        "n_kv_heads": hf_config["num_key_value_heads"],
        "head_dim": hf_config["head_dim"],
        "context_length": hf_config["max_position_embeddings"],
        "tie_embeddings": hf_config["tie_word_embeddings"],
        "architecture": "llama",
    }


def golden_config(ex, hf_config: dict):
    """SmolLM2's config built with the constructor from transformers' values: the size tests
    judge param_counts & co. alone, whatever from_gguf and from_hf_config do."""
    return ex.ModelConfig(
        **expected_fields(hf_config),
        rope_theta=float(hf_config["rope_parameters"]["rope_theta"]),
        rms_norm_eps=float(hf_config["rms_norm_eps"]),
    )


def check_fields(cfg, want: dict, who: str) -> None:
    """Each field of ``cfg`` against transformers' reading; head_dim's usual slip is named."""
    for field, value in want.items():
        got = getattr(cfg, field)
        if field == "head_dim" and got != value and got == want["hidden_size"] // want["n_kv_heads"]:
            raise AssertionError(
                f"{who}: head_dim is {got} = hidden_size // n_kv_heads; it is hidden_size // n_heads "
                f"= {want['hidden_size']} // {want['n_heads']} = {value}: every query head has head_dim "
                "dims, and the KV heads are fewer heads of the same size"
            )
        assert got == value, f"{who}: {field} is {got!r}, but transformers reads {value!r} from this file"


def good_config(ex, **changes):
    fields = dict(
        vocab_size=64, hidden_size=32, intermediate_size=64, n_layers=2, n_heads=4,
        n_kv_heads=2, head_dim=8, context_length=128, rope_theta=10000.0,
        rms_norm_eps=1e-5, tie_embeddings=True,
    )
    return ex.ModelConfig(**{**fields, **changes})


def component_of(tensor_name: str) -> str:
    """Which param_counts() component a llama.cpp tensor belongs to."""
    if tensor_name == "token_embd.weight":
        return "embedding"
    if tensor_name == "output.weight":
        return "output"
    if "norm" in tensor_name:
        return "norms"
    if ".attn_" in tensor_name:
        return "attention"
    if ".ffn_" in tensor_name:
        return "mlp"
    raise AssertionError(f"unexpected tensor {tensor_name}")


# -- from_gguf / from_hf_config ----------------------------------------------


@pytest.mark.model
def test_ex1_6_from_gguf_reads_smollm2(ex, smollm2_gguf, hf_config):
    cfg = smollm2_config(ex, smollm2_gguf)
    check_fields(cfg, expected_fields(hf_config), "from_gguf")
    assert cfg.rope_theta == pytest.approx(1e5), (
        f"rope_theta is {cfg.rope_theta}; SmolLM2 uses 1e5 (llama.rope.freq_base), not the usual 1e4"
    )
    assert cfg.rms_norm_eps == pytest.approx(1e-5, rel=1e-6)


@pytest.mark.model
def test_ex1_6_from_hf_config_equals_from_gguf(ex, smollm2_gguf, hf_config):
    from_hf = built(ex, "from_hf_config", lambda: ex.ModelConfig.from_hf_config(hf_config))
    check_fields(from_hf, expected_fields(hf_config), "from_hf_config")  # blame it alone first
    from_gguf = smollm2_config(ex, smollm2_gguf)
    check_fields(from_gguf, expected_fields(hf_config), "from_gguf")
    diffs = {
        f.name: (getattr(from_hf, f.name), getattr(from_gguf, f.name))
        for f in dataclasses.fields(from_gguf)
        if getattr(from_hf, f.name) != getattr(from_gguf, f.name)
    }
    assert not diffs, (
        "from_hf_config and from_gguf disagree on SmolLM2 (field: (hf, gguf)): "
        f"{diffs}. Did you round rope_theta and rms_norm_eps to float32 in both?"
    )


def test_ex1_6_from_hf_config_defaults(ex):
    minimal = {
        "vocab_size": 100, "hidden_size": 64, "intermediate_size": 128,
        "num_hidden_layers": 2, "num_attention_heads": 4,
    }
    cfg = ex.ModelConfig.from_hf_config(minimal)
    assert cfg.n_kv_heads == 4, "without num_key_value_heads, every query head has its own KV head"
    assert cfg.head_dim == 16, "head_dim defaults to hidden_size // num_attention_heads"
    assert cfg.rope_theta == 10000.0, "rope_theta defaults to 10000"
    assert cfg.tie_embeddings is False, "tie_word_embeddings defaults to False in transformers"
    assert cfg.context_length == 2048
    with_params = ex.ModelConfig.from_hf_config({**minimal, "rope_parameters": {"rope_theta": 5e5}})
    assert with_params.rope_theta == 5e5, "transformers >= 5 keeps rope_theta in rope_parameters"


def test_ex1_6_from_hf_config_missing_key_is_named(ex):
    with pytest.raises(ex.ConfigError, match="num_hidden_layers"):
        ex.ModelConfig.from_hf_config({
            "vocab_size": 100, "hidden_size": 64, "intermediate_size": 128, "num_attention_heads": 4,
        })


def test_ex1_6_from_gguf_tiny_model_tied_and_untied(ex, tmp_path):
    tied_path, untied_path = tmp_path / "tied.gguf", tmp_path / "untied.gguf"
    params = write_tiny_llama(tied_path, tie_embeddings=True)
    write_tiny_llama(untied_path, tie_embeddings=False)
    with read_gguf(tied_path) as g:
        tied = built(ex, "from_gguf", lambda: ex.ModelConfig.from_gguf(g))
    with read_gguf(untied_path) as g:
        untied = built(ex, "from_gguf", lambda: ex.ModelConfig.from_gguf(g))
    assert tied.tie_embeddings is True, "a GGUF without an output.weight tensor has tied embeddings"
    assert untied.tie_embeddings is False, "a GGUF with an output.weight tensor has its own output head"
    assert tied.n_kv_heads == params["n_kv_heads"] and tied.n_layers == params["n_layers"]
    sizes = ("vocab_size", "hidden_size", "intermediate_size", "n_layers", "n_heads", "n_kv_heads")
    check_fields(tied, {**{k: params[k] for k in sizes}, "head_dim": params["hidden_size"] // params["n_heads"]},
                 "from_gguf on a tiny model")


def test_ex1_6_from_gguf_missing_key_is_named(ex, tmp_path):
    path = tmp_path / "no_block_count.gguf"
    write_tiny_llama(path, drop_keys=("llama.block_count",))
    with read_gguf(path) as g, pytest.raises(ex.ConfigError, match="block_count"):
        ex.ModelConfig.from_gguf(g)


def test_ex1_6_from_gguf_vocab_size_from_tokens(ex, tmp_path):
    """Without llama.vocab_size, the vocabulary is the length of tokenizer.ggml.tokens."""
    from llmrs_core.formats.gguf_writer import write_gguf
    from llmrs_core.testing import tiny_llama_metadata, tiny_llama_tensors

    md = {k: v for k, v in tiny_llama_metadata(**TINY_LLAMA).items() if k != "llama.vocab_size"}
    md["tokenizer.ggml.tokens"] = [f"t{i}" for i in range(TINY_LLAMA["vocab_size"])]
    path = tmp_path / "tokens.gguf"
    write_gguf(path, md, tiny_llama_tensors(**TINY_LLAMA))
    with read_gguf(path) as g:
        assert ex.ModelConfig.from_gguf(g).vocab_size == TINY_LLAMA["vocab_size"]


# -- validate ---------------------------------------------------------------


def test_ex1_6_validate_accepts_a_good_config(ex):
    assert good_config(ex).validate() is None


@pytest.mark.parametrize(
    "changes, why",
    [
        (dict(n_heads=5, head_dim=6), "hidden_size 32 is not divisible by 5 heads"),
        (dict(head_dim=0), "a head of no dimensions"),
        (dict(n_kv_heads=3), "4 query heads cannot be shared by 3 KV heads"),
        (dict(n_layers=0), "a model needs at least one layer"),
        (dict(vocab_size=-5), "a negative vocabulary"),
        (dict(hidden_size=30, n_heads=2, head_dim=15, n_kv_heads=1), "odd head_dim: RoPE rotates pairs"),
        (dict(rope_theta=0.0), "rope_theta must be positive"),
        (dict(rms_norm_eps=0.0), "rms_norm_eps must be positive"),
    ],
)
def test_ex1_6_validate_rejects_impossible_configs(ex, changes, why):
    cfg = good_config(ex, **changes)
    with pytest.raises(ex.ConfigError):
        cfg.validate()
        pytest.fail(f"validate() accepted an impossible config ({why}): {changes}")


def test_ex1_6_from_hf_config_rejects_heads_not_dividing_width(ex):
    bad = {
        "vocab_size": 100, "hidden_size": 64, "intermediate_size": 128,
        "num_hidden_layers": 2, "num_attention_heads": 5,
    }
    with pytest.raises(ex.ConfigError, match="divisible"):
        ex.ModelConfig.from_hf_config(bad)


def test_ex1_6_config_is_immutable(ex):
    cfg = good_config(ex)
    with pytest.raises(dataclasses.FrozenInstanceError):
        cfg.n_layers = 3  # a config shared by the whole engine must not change under it
    cfg.validate()


# -- sizes ------------------------------------------------------------------


COMPONENTS = ("embedding", "attention", "mlp", "norms", "output")


def stored_counts(gguf) -> dict[str, int]:
    """Values per param_counts() component, summed over the file's own tensor shapes."""
    from_file = dict.fromkeys(COMPONENTS, 0)
    for info in gguf.tensors.values():
        from_file[component_of(info.name)] += info.n_elements
    return from_file


def count_mistakes(cfg, stored: dict[str, int]) -> list[tuple[str, dict[str, int]]]:
    """The file's counts as the usual slips would give them: ``(what went wrong, counts)``."""
    d, hd = cfg.hidden_size, cfg.head_dim
    head = cfg.vocab_size * d
    kv_like_q = 2 * cfg.n_layers * (cfg.n_heads - cfg.n_kv_heads) * hd * d
    mistakes = [
        ("the tied output head is counted as a second matrix: with tied embeddings the LM head is "
         "token_embd itself, so count it once ('output' is 0)", {**stored, "output": head})
        if cfg.tie_embeddings else
        ("the output head is not counted: this model is untied (it has an output.weight tensor), so its "
         f"LM head is a vocab_size x hidden_size matrix of its own ({head:,} values)", {**stored, "output": 0}),
        ("the norms are not counted: RMSNorm weights are parameters too, hidden_size values each, "
         "two per layer plus the final one", {**stored, "norms": 0}),
        ("the final norm is not counted: two RMSNorm weights per layer, plus one more before the output head",
         {**stored, "norms": stored["norms"] - d}),
    ]
    if kv_like_q:
        mistakes.append((
            f"W_k and W_v are sized like W_q: with grouped-query attention they have n_kv_heads * head_dim = "
            f"{cfg.n_kv_heads * hd} rows, not n_heads * head_dim = {cfg.n_heads * hd}",
            {**stored, "attention": stored["attention"] + kv_like_q},
        ))
    return mistakes


def check_param_counts(cfg, stored: dict[str, int]) -> None:
    """param_counts() against the file's tensors, naming a known slip; then n_params, alone."""
    counts = cfg.param_counts()
    assert set(counts) == set(COMPONENTS), (
        f"param_counts() keys are {sorted(counts)}; expected embedding, attention, mlp, norms, output"
    )
    if counts != stored:
        for why, wrong in count_mistakes(cfg, stored):
            if counts == wrong:
                raise AssertionError(f"param_counts(): {why}")
        for component in COMPONENTS:
            assert counts[component] == stored[component], (
                f"param_counts()[{component!r}] = {counts[component]:,}, but the GGUF's "
                f"{component} tensors hold {stored[component]:,} values"
            )
    assert cfg.n_params == sum(stored.values()), (
        f"n_params = {cfg.n_params:,}, but param_counts() (right) sums to {sum(stored.values()):,}: "
        "n_params is that sum"
    )


def tiny_config(ex, params: dict):
    """The config of a write_tiny_llama model, built with the constructor (not from_gguf)."""
    return ex.ModelConfig(**params, head_dim=params["hidden_size"] // params["n_heads"])


@pytest.mark.model
def test_ex1_6_param_counts_equal_the_tensor_shapes(ex, smollm2_gguf, hf_config):
    cfg = golden_config(ex, hf_config)
    stored = stored_counts(smollm2_gguf)
    check_param_counts(cfg, stored)
    assert cfg.n_params == SMOLLM2_PARAMS == sum(stored.values()), (
        f"n_params = {cfg.n_params:,}; SmolLM2-135M has {SMOLLM2_PARAMS:,} (tied embeddings are counted once)"
    )


@pytest.mark.parametrize("tied", [True, False], ids=["tied", "untied"])
def test_ex1_6_param_counts_of_a_tiny_model(ex, tmp_path, tied):
    """A tiny GQA model (4 query heads, 2 KV heads), with and without its own output head."""
    path = tmp_path / "tiny.gguf"
    params = write_tiny_llama(path, tie_embeddings=tied)
    with read_gguf(path) as g:
        stored = stored_counts(g)
    check_param_counts(tiny_config(ex, params), stored)


@pytest.mark.model
def test_ex1_6_weight_bytes(ex, smollm2_gguf, hf_config):
    cfg = golden_config(ex, hf_config)
    norms = cfg.param_counts()["norms"]
    matrices = cfg.n_params - norms
    assert cfg.weight_bytes("f32") == 4 * cfg.n_params, "in f32 every parameter takes 4 bytes"
    f16 = cfg.weight_bytes("f16")
    assert f16 != 2 * cfg.n_params, (
        f"weight_bytes('f16') = {f16:,}: the norms are in f16 too. Only the matrices take fmt; the RMSNorm "
        "weights stay f32 (4 bytes each), as in every GGUF file"
    )
    assert f16 == 2 * matrices + 4 * norms, f"weight_bytes('f16') = {f16:,}: expected f16 matrices, f32 norms"
    # The file stores token_embd in Q8_0 (34 bytes / 32 weights), every other
    # matrix in Q4_1 (20 / 32) and the norms in F32: its tensor bytes must agree.
    embedding = cfg.param_counts()["embedding"]
    expected_file = cfg.weight_bytes("q4_1") - embedding * 20 // 32 + embedding * 34 // 32
    stored = sum(t.n_bytes for t in smollm2_gguf.tensors.values())
    assert expected_file == stored, (
        f"weight_bytes('q4_1') implies {expected_file:,} bytes of tensors in this file, "
        f"which stores {stored:,}. Q4_1 packs 32 weights into 20 bytes."
    )
    with pytest.raises(ValueError):
        cfg.weight_bytes("q3_banana")


def test_ex1_6_kv_cache_bytes(ex, hf_config):
    cfg = golden_config(ex, hf_config)
    per_token = 2 * cfg.n_layers * cfg.n_kv_heads * cfg.head_dim  # K and V values per token
    got = cfg.kv_bytes_per_token("f32")
    slips = {
        2 * cfg.n_layers * cfg.n_heads * cfg.head_dim * 4: "counted for the 9 query heads (n_heads); the cache "
        "holds K and V of the 3 KV heads only (n_kv_heads: grouped-query attention)",
        per_token * 2: "counted K only: every layer caches K and V, a factor 2",
    }
    assert got == per_token * 4 == 46_080, (
        f"kv_bytes_per_token('f32') = {got:,}: " + slips.get(
            got, "one token caches K and V (2) x 30 layers x 3 KV heads x 64 dims, 4 bytes each in f32")
    )
    assert cfg.kv_bytes_per_token("f16") == per_token * 2
    assert cfg.kv_bytes_per_token() == per_token * 2, "the default dtype is f16"
    assert cfg.kv_bytes_per_token("fp8") == per_token
    assert cfg.kv_cache_bytes(8192) == 8192 * per_token * 2
    assert cfg.kv_cache_bytes(100, "f32", batch_size=8) == 8 * 100 * per_token * 4
    assert cfg.kv_cache_bytes(0) == 0
    with pytest.raises(ex.ConfigError):
        cfg.kv_bytes_per_token("f7")
    with pytest.raises(ex.ConfigError):
        cfg.kv_cache_bytes(-1)


@pytest.mark.model
def test_ex1_6_flops_per_token(ex, smollm2_gguf, hf_config):
    cfg = golden_config(ex, hf_config)
    # Every 2-D tensor of this tied model is used once per token as a matrix
    # (token_embd.weight as the output head): 2 FLOPs per weight.
    matrix_weights = sum(t.n_elements for t in smollm2_gguf.tensors.values() if len(t.shape) == 2)
    head = cfg.vocab_size * cfg.hidden_size
    got = cfg.flops_per_token(0)
    why = {
        2 * (matrix_weights - head): "the output head is left out: tied or not, every token goes through the "
        "vocab_size x hidden_size LM head (here token_embd.weight, used as a matrix)",
        matrix_weights: "1 FLOP per weight: each weight is a multiply and an add, 2 FLOPs",
    }.get(got, "every matrix weight, including the output head, costs a multiply and an add")
    assert got == 2 * matrix_weights, f"flops_per_token(0) = {got:,}; expected 2 x {matrix_weights:,}: {why}"
    per_context_token = 4 * cfg.n_layers * cfg.n_heads * cfg.head_dim
    assert cfg.flops_per_token(1000) - cfg.flops_per_token(0) == 1000 * per_context_token, (
        "each earlier token adds q.k and p.v per head: 4 * n_layers * n_heads * head_dim FLOPs"
    )
