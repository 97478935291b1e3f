"""Chapter 1's tests name each known mistake: proven by planting it.

As for chapter 3 (test_diagnose_ch03.py): each mistake is planted in a copy of
the solution — a method of the engine's ``ModelConfig``, recompiled from its
source with one edit (:func:`llmrs_core.testing.with_methods`) — and the
chapter 1 test that should catch it must fail with the message that names the
mistake. A stale edit (the engine's code changed) fails loudly.

Exercise 1.6's likely mistakes, per method: ``param_counts`` counts the tied
embedding twice, or an untied output head not at all, sizes GQA's W_k and W_v
like W_q, forgets the norms or the final one; ``from_gguf`` takes head_dim from
the KV heads; ``from_hf_config`` ignores ``num_key_value_heads``;
``kv_bytes_per_token`` counts the query heads, or K only; ``flops_per_token``
leaves out the (tied) output head; ``weight_bytes`` stores the norms in ``fmt`` too.
"""

from __future__ import annotations

import json

import pytest

from llmrs_core.config import ModelConfig
from llmrs_core.testing import chapter_tests, solution_with, with_methods
from llmrs_core.testing import failure_message as failure

T16 = chapter_tests(1, "test_ex1_6_model_config.py")
HF_CONFIG = json.loads((T16.GOLDEN / "smollm2_hf_config.json").read_text())

PER_LAYER = "per_layer_attn = d * q_out + 2 * d * kv_out + q_out * d"
OUTPUT = '"output": 0 if self.tie_embeddings else self.vocab_size * d'
NORMS = '"norms": self.n_layers * per_layer_norms + d'
HEAD_DIM = 'head_dim = opt_int(f"{arch}.attention.key_length", hidden // n_heads)'
HEAD_DIM_FROM_KV = 'head_dim = opt_int(f"{arch}.attention.key_length", hidden // opt_int(f"{arch}.attention.head_count_kv", n_heads))'
KV_ELEMENTS = "elements = 2 * self.n_layers * self.n_kv_heads * self.head_dim"
FLOP_PARAMS = 'matmul_params = counts["attention"] + counts["mlp"] + self.vocab_size * self.hidden_size'


def planted(**edits) -> object:
    """Chapter 1's solution with ModelConfig's methods carrying the edits."""
    return solution_with(1, ModelConfig=with_methods(ModelConfig, **edits))


PARAM_COUNT_MISTAKES = {
    "tied embedding counted twice": ((OUTPUT, '"output": self.vocab_size * d'), True,
                                     "the tied output head is counted as a second matrix"),
    "untied output head not counted": ((OUTPUT, '"output": 0'), False, "the output head is not counted"),
    "GQA K and V sized like Q": ((PER_LAYER, "per_layer_attn = d * q_out + 2 * d * q_out + q_out * d"), True,
                                 "W_k and W_v are sized like W_q"),
    "norms forgotten": ((NORMS, '"norms": 0'), True, "the norms are not counted"),
    "final norm forgotten": ((NORMS, '"norms": self.n_layers * per_layer_norms'), False, "the final norm is not counted"),
}


@pytest.mark.parametrize("mistake", PARAM_COUNT_MISTAKES)
def test_each_param_count_mistake_gets_its_own_message(mistake, tmp_path):
    edit, tied, message = PARAM_COUNT_MISTAKES[mistake]
    text = failure(T16.test_ex1_6_param_counts_of_a_tiny_model, planted(param_counts=[edit]), tmp_path, tied)
    assert message in text, text


def test_n_params_not_the_sum_is_blamed_alone(tmp_path):
    """A right param_counts with a wrong n_params: the message names n_params."""
    Wrong = type("ModelConfig", (ModelConfig,), {"n_params": property(lambda self: self.param_counts()["mlp"])})
    text = failure(T16.test_ex1_6_param_counts_of_a_tiny_model, solution_with(1, ModelConfig=Wrong), tmp_path, True)
    assert "param_counts() (right) sums to" in text and "n_params is that sum" in text, text


def test_head_dim_from_the_kv_heads_is_named(tmp_path):
    """head_dim = hidden // n_kv_heads passes validate() (heads may have a size of their own,
    as Qwen3's do); the test names the mistake from the numbers."""
    ex = planted(from_gguf=[(HEAD_DIM, HEAD_DIM_FROM_KV)])
    text = failure(T16.test_ex1_6_from_gguf_tiny_model_tied_and_untied, ex, tmp_path)
    assert "head_dim is 16 = hidden_size // n_kv_heads" in text, text


def test_head_dim_from_the_kv_heads_refused_by_an_older_validate_is_named(tmp_path):
    """A learner whose validate() still insists on n_heads * head_dim == hidden_size refuses the
    config it built; the test says why, in the learner's terms."""
    ex = planted(from_gguf=[(HEAD_DIM, HEAD_DIM_FROM_KV), (
        "    config.validate()\n    return config",
        "    if config.n_heads * config.head_dim != config.hidden_size:\n"
        "        raise ConfigError('n_heads * head_dim != hidden_size')\n    return config")])
    text = failure(T16.test_ex1_6_from_gguf_tiny_model_tied_and_untied, ex, tmp_path)
    assert "from_gguf refused a valid model" in text and "not // head_count_kv" in text, text


def test_head_dim_from_the_kv_heads_without_validate_is_named(tmp_path):
    ex = planted(from_gguf=[(HEAD_DIM, HEAD_DIM_FROM_KV), ("    config.validate()\n    return config", "    return config")])
    text = failure(T16.test_ex1_6_from_gguf_tiny_model_tied_and_untied, ex, tmp_path)
    assert "head_dim is 16 = hidden_size // n_kv_heads; it is hidden_size // n_heads = 32 // 4 = 8" in text, text


def test_from_hf_config_ignoring_the_kv_heads_is_blamed_alone():
    """The test comparing both constructors blames from_hf_config first, before from_gguf is even run."""
    ex = planted(from_hf_config=[("n_kv_heads=opt_int(\"num_key_value_heads\", n_heads) or n_heads",
                                  "n_kv_heads=n_heads")])
    text = failure(T16.test_ex1_6_from_hf_config_equals_from_gguf, ex, None, HF_CONFIG)
    assert "from_hf_config: n_kv_heads is 9, but transformers reads 3" in text, text


KV_MISTAKES = {
    "query heads instead of KV heads": (KV_ELEMENTS.replace("n_kv_heads", "n_heads"), "counted for the 9 query heads"),
    "K only, not K and V": (KV_ELEMENTS.replace("2 * ", ""), "counted K only"),
}


@pytest.mark.parametrize("mistake", KV_MISTAKES)
def test_each_kv_bytes_mistake_gets_its_own_message(mistake):
    new, message = KV_MISTAKES[mistake]
    text = failure(T16.test_ex1_6_kv_cache_bytes, planted(kv_bytes_per_token=[(KV_ELEMENTS, new)]), HF_CONFIG)
    assert message in text, text


@pytest.mark.model
def test_flops_without_the_tied_output_head_is_named(smollm2_gguf):
    ex = planted(flops_per_token=[(FLOP_PARAMS, 'matmul_params = counts["attention"] + counts["mlp"]')])
    text = failure(T16.test_ex1_6_flops_per_token, ex, smollm2_gguf, HF_CONFIG)
    assert "the output head is left out" in text, text


@pytest.mark.model
def test_norms_in_the_matrix_format_are_named(smollm2_gguf):
    ex = planted(weight_bytes=[("return matrices * traits.type_size // traits.block_size + norm_bytes",
                                "return self.n_params * traits.type_size // traits.block_size")])
    text = failure(T16.test_ex1_6_weight_bytes, ex, smollm2_gguf, HF_CONFIG)
    assert "the norms are in f16 too" in text, text


def test_the_solution_passes_the_diagnosing_tests(tmp_path):
    ex = solution_with(1)
    for tied in (True, False):
        T16.test_ex1_6_param_counts_of_a_tiny_model(ex, tmp_path, tied)
    T16.test_ex1_6_from_gguf_tiny_model_tied_and_untied(ex, tmp_path)
    T16.test_ex1_6_kv_cache_bytes(ex, HF_CONFIG)
