"""Sticky weighted assignment and the variants' command-line syntax (chapter 12, section 12.4):
properties any correct split has (stable across processes, shares within binomial bounds, weight
0 never chosen), the fallback for requests without a user, and clear errors for bad input.
"""

from __future__ import annotations

import math
import random
import subprocess
import sys
from pathlib import Path

import pytest

from llmrs_core.ab.assign import assign, check_weights, pick, user_bucket
from llmrs_core.ab.variants import Upstream, VariantSpec, check_variants, parse_upstream, parse_variant


def test_buckets_are_the_same_in_another_process():
    code = "from llmrs_core.ab.assign import user_bucket; print([user_bucket(f'u{i}', 's') for i in range(20)])"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                         env={"PYTHONHASHSEED": "123"}, cwd=Path(__file__).resolve().parents[2])
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == str([user_bucket(f"u{i}", "s") for i in range(20)])


def test_shares_follow_the_weights_and_weight_zero_is_never_chosen():
    weights = {"a": 2.0, "off": 0.0, "b": 1.0}
    n = 6000
    counts = {k: 0 for k in weights}
    for i in range(n):
        counts[assign(f"user-{i}", weights, "exp")] += 1
    assert counts["off"] == 0
    for k, p in (("a", 2 / 3), ("b", 1 / 3)):
        sd = math.sqrt(n * p * (1 - p))
        assert abs(counts[k] - n * p) <= 5 * sd, counts


def test_pick_at_the_edges():
    w = {"zero": 0.0, "a": 1.0, "b": 1.0, "tail": 0.0}
    assert pick(0.0, w) == "a" and pick(0.4999, w) == "a" and pick(0.5, w) == "b"
    assert pick(math.nextafter(1.0, 0.0), w) == "b"


def test_requests_without_a_user_are_drawn_by_weight():
    rng = random.Random(0)
    n = 4000
    got = sum(assign(None, {"a": 1.0, "b": 3.0}, rng=rng) == "b" for _ in range(n))
    assert abs(got - 0.75 * n) <= 5 * math.sqrt(n * 0.75 * 0.25)


@pytest.mark.parametrize("weights, match", [({}, "at least one"), ({"a": 0, "b": 0.0}, "sum to more than 0"),
                                            ({"a": -1.0}, ">= 0"), ({"a": float("nan")}, "finite"),
                                            ({"a": "1"}, "number"), ({"": 1.0}, "non-empty")])
def test_bad_weights_are_named(weights, match):
    with pytest.raises(ValueError, match=match):
        check_weights(weights)


def test_user_must_be_text():
    with pytest.raises(ValueError, match="user must be a string"):
        assign(42, {"a": 1.0})  # type: ignore[arg-type]


def test_variant_and_upstream_syntax(tmp_path):
    model = tmp_path / "m:odd.gguf"  # a ':' in the path is not a backend
    model.write_bytes(b"")
    assert parse_variant(f"q8={model}") == VariantSpec("q8", str(model), None, 1.0)
    assert parse_variant(f"q8={model}:numpy@2.5") == VariantSpec("q8", str(model), "numpy", 2.5)
    assert parse_upstream("a=http://127.0.0.1:8001/v1/@0") == Upstream("a", "http://127.0.0.1:8001", 0.0)


@pytest.mark.parametrize("text, match", [("noequals", "NAME=MODEL"), ("a b=x", "name"), ("a=missing.gguf", "does not exist"),
                                         ("a=x.gguf@heavy", "must be a number"), ("a=x.gguf@-1", ">= 0")])
def test_bad_variants_are_named(text, match):
    with pytest.raises(ValueError, match=match):
        parse_variant(text)


def test_bad_upstreams_and_duplicates_are_named():
    with pytest.raises(ValueError, match="http://"):
        parse_upstream("a=127.0.0.1:8000")
    with pytest.raises(ValueError, match="given twice"):
        check_variants([Upstream("a", "http://x"), Upstream("a", "http://y")])
    with pytest.raises(ValueError, match="sum to more than 0"):
        check_variants([Upstream("a", "http://x", 0.0), Upstream("b", "http://y", 0.0)])


@pytest.mark.parametrize("argv, message", [
    (["ab", "serve"], "give the variants"),
    (["ab", "serve", "--variant", "a=nope.gguf"], "the model file 'nope.gguf' does not exist"),
    (["ab", "serve", "--upstream", "a=http://127.0.0.1:1@0"], "sum to more than 0"),
    (["ab", "report", "--variant", "a=nope.gguf"], "does not exist"),
])
def test_cli_errors_are_one_line(argv, message, capsys):
    from llmrs_core.cli import main

    assert main(argv) == 1
    err = capsys.readouterr().err.strip()
    assert message in err and "\n" not in err, err
