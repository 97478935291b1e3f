"""Encode speed of our tokenizer against the reference (chapter 2): ``make bench-tokenizer``.

    python -m llmrs_core.bench.tokenizer [--json] [--repeats N]

Measures tokens per second on a long mixed text (prose, code, numbers,
non-Latin scripts) and milliseconds for one short prompt, with an empty word
cache (every word merged from scratch) and a warm one, and Hugging Face
``tokenizers`` on the same text in the same run. Median of the repeats.
"""

from __future__ import annotations

import argparse
import json
import statistics

from .common import timings

SAMPLE = (
    "The quick brown fox jumps over the lazy dog. Tokenizers turn text into numbers; "
    "a model never sees letters, only ids. In 2024, 15% of 1,000,000 requests were retried.\n"
    "def attention(q, k, v):\n    scores = q @ k.T / math.sqrt(q.shape[-1])\n    return softmax(scores) @ v\n"
    "Ça va? Où est l'hôtel? 日本語のテキスト。 Привет, мир! 🦀🐍 👨‍👩‍👧\n"
)


def run(repeats: int = 7, copies: int = 50) -> dict:
    import llmrs_core as llmrs
    from llmrs_core.tokenizer.reference import reference_tokenizer

    model = llmrs.load()
    text = SAMPLE * copies
    ours = model.tokenizer
    ref = reference_tokenizer(ours)
    n_tokens = len(ours.encode(text))
    assert ours.encode(text) == ref.encode(text).ids, "our ids differ from the reference"

    short = SAMPLE
    n_short = len(ours.encode(short))

    def short_cold():
        ours._cache.clear()  # every word goes through BPE merging again
        ours.encode(short)

    result = {
        "text_tokens": n_tokens,
        "ours_tok_s": n_tokens / statistics.median(timings(lambda: ours.encode(text), repeats)),
        "reference_tok_s": n_tokens / statistics.median(timings(lambda: ref.encode(text), repeats)),
        "short_prompt_tokens": n_short,
        "ours_short_cold_ms": 1e3 * statistics.median(timings(short_cold, repeats * 20)),
        "ours_short_warm_ms": 1e3 * statistics.median(timings(lambda: ours.encode(short), repeats * 20)),
        "reference_short_ms": 1e3 * statistics.median(timings(lambda: ref.encode(short), repeats * 20)),
        "repeats": repeats,
    }
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--repeats", type=int, default=7)
    args = parser.parse_args()
    r = run(args.repeats)
    if args.json:
        print(json.dumps(r, indent=2))
        return
    print(f"long text, {r['text_tokens']:,} tokens (median of {r['repeats']} runs):")
    print(f"  ours       {r['ours_tok_s']:>12,.0f} tokens/s")
    print(f"  reference  {r['reference_tok_s']:>12,.0f} tokens/s  (Hugging Face tokenizers, Rust)")
    print(f"short prompt, {r['short_prompt_tokens']} tokens:")
    print(f"  ours, cold word cache  {r['ours_short_cold_ms']:.3f} ms")
    print(f"  ours, warm word cache  {r['ours_short_warm_ms']:.3f} ms")
    print(f"  reference              {r['reference_short_ms']:.3f} ms")


if __name__ == "__main__":
    main()
