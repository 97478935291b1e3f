"""``llmrs_core.quant.evaluate`` (chapter 6, §6.5): size, perplexity and KL divergence of a
re-quantised model, on a tiny random model.

References: perplexity and KL are recomputed here from logits with a log-sum-exp written in the
test; a scheme that quantises every matrix is compared with the same model *stored* in that type
by the GGUF writer and read back by the loader; sizes are counted from ggml's block structs
(``block_q8_0``: an fp16 scale and 32 int8 codes = 34 bytes per 32 weights; ``block_q4_0``: an
fp16 scale and 16 bytes of nibbles = 18; ``block_q4_1``: two fp16 and 16 bytes = 20).
"""

from __future__ import annotations

import numpy as np
import pytest

import llmrs_core as llmrs
from llmrs_core.quant.evaluate import GGML, SCHEMES, Float32, Integer, Scheme, evaluate, reference, table
from llmrs_core.testing import write_tiny_llama

#: bytes per block of 32 weights, from ggml's structs (see the module docstring)
GGML_BLOCK_BYTES = {"q8_0": 2 + 32, "q4_0": 2 + 16, "q4_1": 2 + 2 + 16}
EPS64 = np.finfo(np.float64).eps


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    path = tmp_path_factory.mktemp("quant") / "tiny.gguf"
    write_tiny_llama(path, seed=7, n_layers=2, vocab_size=96)
    model = llmrs.load(path, backend="numpy")
    ids = np.random.default_rng(0).integers(0, 96, 49)
    return path, model, ids


def nll_by_hand(logits: np.ndarray, targets: np.ndarray) -> np.ndarray:
    """-log softmax(logits)[target] per row, as log-sum-exp minus the target's logit (float64)."""
    z = logits.astype(np.float64)
    m = z.max(axis=1)
    lse = m + np.log(np.exp(z - m[:, None]).sum(axis=1))
    return lse - z[np.arange(len(targets)), targets]


def log_probs_by_hand(logits: np.ndarray) -> np.ndarray:
    z = logits.astype(np.float64)
    m = z.max(axis=1, keepdims=True)
    return z - m - np.log(np.exp(z - m).sum(axis=1, keepdims=True))


def rounding_bound(logits: np.ndarray) -> float:
    """What two float64 log-sum-exps over a row may differ by: one rounding per term of the sum
    and of the shift, relative to the largest magnitude involved."""
    return logits.shape[1] * EPS64 * (1 + float(np.abs(logits).max()))


def test_the_model_against_itself_has_kl_exactly_zero(tiny):
    _, model, ids = tiny
    r = evaluate(model, ids, Float32())
    assert r["kl"] == 0.0, "the same weights must give the same distributions, bit for bit"
    assert r["top1"] == 1.0


def test_perplexity_is_exp_of_the_mean_nll_of_the_logits(tiny):
    _, model, ids = tiny
    logits = model.network.forward(ids[:-1])
    nll = nll_by_hand(logits, ids[1:])
    got = evaluate(model, ids, Float32())["ppl"]
    assert abs(np.log(got) - nll.mean()) <= rounding_bound(logits)
    assert reference(model, ids).ppl == pytest.approx(got, rel=rounding_bound(logits))


def test_a_scheme_equals_the_model_stored_in_that_type(tiny, tmp_path):
    """Q8_0 on every matrix and the embedding == write the GGUF in Q8_0 and load it."""
    path, model, ids = tiny
    stored = tmp_path / "tiny_q8_0.gguf"
    write_tiny_llama(stored, seed=7, n_layers=2, vocab_size=96, weight_type="q8_0")
    other = llmrs.load(stored, backend="numpy")
    want_logits = other.network.forward(ids[:-1])
    ref_logits = model.network.forward(ids[:-1])
    r = evaluate(model, ids, GGML("q8_0", embedding_too=True))
    bound = rounding_bound(want_logits) + rounding_bound(ref_logits)
    assert abs(np.log(r["ppl"]) - nll_by_hand(want_logits, ids[1:]).mean()) <= bound
    ref, lq = log_probs_by_hand(ref_logits), log_probs_by_hand(want_logits)
    kl = np.mean(np.sum(np.exp(ref) * (ref - lq), axis=1))
    assert r["kl"] == pytest.approx(kl, rel=1e-9, abs=bound)
    top1 = np.mean(want_logits.argmax(axis=1) == ref_logits.argmax(axis=1))
    assert r["top1"] == top1
    assert r["bytes"] == sum(info.n_bytes for info in other.source.tensors.values()), \
        "the size must be the stored size of the same model written in Q8_0"


def test_more_bits_move_the_distributions_less(tiny):
    _, model, ids = tiny
    rows = table(model, ids, ["f32", "f16", "q8_0", "q4_0"])
    kl = {k: r["kl"] for k, r in rows.items()}
    assert kl["f32"] == 0.0 < kl["f16"] < kl["q8_0"] < kl["q4_0"], kl


def test_bytes_are_the_types_blocks_times_the_weights(tiny):
    _, model, ids = tiny
    infos = model.source.tensors
    matrices = [i for name, i in infos.items() if name.startswith("blk.") and len(i.shape) == 2]
    vectors = [i for i in infos.values() if len(i.shape) == 1]
    embedding = infos["token_embd.weight"]
    assert embedding.type_name == "F32" and len(matrices) == 2 * 7
    kept = 4 * sum(i.n_elements for i in vectors) + 4 * embedding.n_elements  # norms; the file's F32 embedding
    ref = reference(model, ids)
    for name, per_block in GGML_BLOCK_BYTES.items():
        want = kept + sum(i.n_elements // 32 * per_block for i in matrices)
        assert evaluate(model, ids, SCHEMES[name], ref)["bytes"] == want, name
    assert evaluate(model, ids, SCHEMES["f16"], ref)["bytes"] == kept + sum(2 * i.n_elements for i in matrices)
    channel = sum(i.n_elements + 4 * i.shape[0] for i in matrices)  # int8 codes + one float32 scale per row
    assert evaluate(model, ids, Integer(8, granularity="channel"), ref)["bytes"] == kept + channel
    group = sum(i.n_elements // 2 + 4 * (i.n_elements // 32) for i in matrices)  # packed nibbles + a scale per 32
    assert evaluate(model, ids, SCHEMES["int4 group 32"], ref)["bytes"] == kept + group
    # with the embedding: 4 bytes per weight of every tensor
    everything = 4 * sum(i.n_elements for i in infos.values())
    assert evaluate(model, ids, SCHEMES["f32"], ref)["bytes"] == everything


def test_k_quants_fall_back_to_q8_0_where_rows_do_not_fit(tiny):
    _, model, ids = tiny
    r = evaluate(model, ids, "q4_k")  # 32- and 64-wide rows: no 256-weight super-block fits
    assert r["stored_as"] == {"Q8_0": 14}
    assert r["kl"] == evaluate(model, ids, "q8_0")["kl"]


class Explodes(Scheme):
    """Quantises the first matrix to garbage, then fails: the model must come back whole."""

    def __init__(self):
        self.calls = 0

    def quantise(self, w):
        self.calls += 1
        if self.calls > 1:
            raise RuntimeError("planted failure")
        return np.full_like(w, 1e3), w.size

    def stored_as(self, shape):
        return "garbage"


def test_the_weights_are_restored_also_after_an_error(tiny):
    _, model, ids = tiny
    before = model.network.forward(ids[:-1])
    evaluate(model, ids, "q4_0")
    assert np.array_equal(model.network.forward(ids[:-1]), before)
    with pytest.raises(RuntimeError, match="planted failure"):
        evaluate(model, ids, Explodes())
    assert np.array_equal(model.network.forward(ids[:-1]), before)
    assert model.network.output is model.network.token_embd


def test_bad_input_is_named(tiny):
    path, model, ids = tiny
    with pytest.raises(ValueError, match="unknown quantisation scheme 'q3_x'; choose from: f32, f16"):
        evaluate(model, ids, "q3_x")
    with pytest.raises(ValueError, match="at least 2"):
        reference(model, ids[:1])
    with pytest.raises(ValueError, match="other token ids"):
        evaluate(model, ids, "q8_0", reference(model, ids[:10]))
    with pytest.raises(ValueError, match="backend='numpy'"):
        reference(llmrs.load(path, backend="numba", threads=1), ids)
    with pytest.raises(ValueError, match="unknown weight format 'q9'"):
        GGML("q9")
    with pytest.raises(ValueError, match="group_size"):
        Integer(4, granularity="group")
