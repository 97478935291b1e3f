"""``llmrs ab report`` on tiny models (chapter 12, section 12.4): the quality measurements agree with
the model's own forward pass, a variant agrees with a reference made from its own greedy output,
latencies come from the request log, and a log too small says "not enough data".
"""

from __future__ import annotations

import json

import numpy as np
import pytest

from llmrs_core import load
from llmrs_core.ab.quality import greedy_agreement, text_logprobs
from llmrs_core.ab.record import RecordWriter, RequestRecord, read_records
from llmrs_core.ab.report import build_report, format_report
from llmrs_core.ab.variants import VariantSpec
from llmrs_core.logprobs import log_softmax
from llmrs_core.testing import write_tiny_llama

TEXT = "The bridge has three low arches. In a dry summer you can walk under the middle one."


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    d = tmp_path_factory.mktemp("abr")
    paths = []
    for seed in (1, 2):
        write_tiny_llama(d / f"t{seed}.gguf", byte_tokenizer=True, seed=seed)
        paths.append(str(d / f"t{seed}.gguf"))
    model = load(paths[0], backend="numpy")
    prompts = [model.tokenizer.encode(p) for p in ("Hello", "A bridge", "three arches")]
    golden = d / "golden.npz"
    arrays = {}
    for i, ids in enumerate(prompts):  # the reference: model 1's own greedy continuations
        arrays[f"ids_{i}"] = np.array(ids)
        arrays[f"greedy_{i}"] = np.array(model.generate(ids, max_tokens=6, temperature=0.0).token_ids)
    np.savez(golden, **arrays)
    return paths, golden, d


def test_text_logprobs_are_the_forward_pass_log_softmax(tiny):
    model = load(tiny[0][0], backend="numpy")
    lp = text_logprobs(model, TEXT)
    ids = model.tokenizer.encode(TEXT)
    logits = model.logits(ids)
    assert lp.shape == (len(ids) - 1,)
    assert lp[3] == log_softmax(logits[3])[ids[4]] and (lp < 0).all()


def test_a_model_agrees_with_its_own_greedy_reference(tiny):
    paths, golden, _ = tiny
    from llmrs_core.ab.quality import load_golden

    ref = load_golden(golden)
    a = greedy_agreement(load(paths[0], backend="numpy"), ref)
    assert a.top1.all() and a.exact.all() and (a.prefix == a.lengths).all()
    b = greedy_agreement(load(paths[1], backend="numpy"), ref)
    assert not b.top1.all(), "another random model does not reproduce the reference"


def write_log(path, rng, n_a, n_b, shift=0.0):
    with open(path, "w") as f:
        w = RecordWriter(f)
        for name, n, s in (("a", n_a, 0.0), ("b", n_b, shift)):
            for _ in range(n):
                ttft = float(rng.lognormal(-2 + s, 0.2))
                w.write(RequestRecord(name, "h", "chat", True, 0.0, 200, 5, 8, ttft, ttft / 4, ttft * 3))
        w.write(RequestRecord("a", None, "chat", True, 0.0, 502, error="variant 'a' is unavailable"))


def test_report_decides_latency_from_the_log_and_says_not_enough_data(tiny):
    paths, golden, d = tiny
    variants = [VariantSpec("a", paths[0], "numpy"), VariantSpec("b", paths[1], "numpy")]
    rng = np.random.default_rng(0)
    write_log(d / "small.jsonl", rng, 4, 5)
    small = build_report(variants, read_records(d / "small.jsonl"), text=TEXT, golden_path=golden)
    rows = {r["metric"]: r for r in small["comparisons"][0]["rows"]}
    assert rows["ttft_s"]["verdict"] == "not enough data"
    assert rows["exact_answers"]["verdict"] == "not enough data", "three prompts cannot decide"
    assert small["variants"]["a"]["latency"]["requests"] == 4, "the failed request is not a latency sample"
    write_log(d / "big.jsonl", rng, 60, 60, shift=0.5)
    big = build_report(variants, read_records(d / "big.jsonl"), text=TEXT, golden_path=golden)
    rows = {r["metric"]: r for r in big["comparisons"][0]["rows"]}
    assert rows["ttft_s"]["verdict"] == "B higher" and rows["ttft_s"]["p_value"] < 0.05
    assert rows["tokens_per_s"]["verdict"] == "B lower"
    assert big["variants"]["a"]["quality"]["top1_agreement"] == 1.0
    json.dumps(big)  # the report is JSON
    table = format_report(big)
    assert "b - a:" in table and "ttft_s" in table


def test_report_needs_two_variants_and_a_readable_log(tiny):
    paths, golden, d = tiny
    with pytest.raises(ValueError, match="at least two"):
        build_report([VariantSpec("a", paths[0])], text=TEXT, golden_path=golden)
    (d / "bad.jsonl").write_text('{"event": "ab_request", "variant": "a"}\n')
    with pytest.raises(ValueError, match="line 1"):
        read_records(d / "bad.jsonl")
