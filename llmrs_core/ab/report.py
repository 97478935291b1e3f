"""``llmrs ab report``: an offline evaluation of A/B variants, decided with stated statistics (section 12.4).

For each variant (a model file and backend, :class:`~llmrs_core.ab.variants.VariantSpec`)
and, when given, the router's request log (:mod:`.record`):

=========  =====================================================  ==============================
quality    log-likelihood per token of the held-out text          paired bootstrap CI (tokens)
           top-1 agreement with transformers' greedy tokens       paired bootstrap CI (tokens)
           exact greedy answers (4 prompts)                        paired bootstrap CI (prompts)
latency    TTFT, TPOT of streamed requests (the router's log)      Mann-Whitney U + bootstrap CI
                                                                   of the median difference
cost       tokens/s per request (completion tokens / E2E)          Mann-Whitney U + bootstrap CI
=========  =====================================================  ==============================

Every comparison is B minus A, A being the first variant (the baseline), and
says "not enough data" when the data cannot decide (:func:`~llmrs_core.bench.stats.compare`):
fewer than :data:`~llmrs_core.bench.stats.MIN_N` observations, or no significant difference with
fewer observations than it takes to detect the effect of interest. Quality is
deterministic for a given model and text; its CI says how much the difference
would move on other text like this one (tokens treated as independent, which
they are not quite: the interval is somewhat too narrow).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from ..bench.stats import compare
from .quality import GOLDEN, HELDOUT, default_path, greedy_agreement, load_golden, text_logprobs
from .record import RequestRecord
from .variants import VariantSpec

#: the smallest differences worth detecting, in each metric's units (latency: relative to A's median)
EFFECTS = {"loglik": 0.01, "agreement": 0.02, "latency": 0.10}


def evaluate_quality(spec: VariantSpec, text: str, golden: list) -> dict:
    """Load ``spec``'s model and measure its quality; arrays as lists (JSON)."""
    from ..loader import load

    model = load(spec.model, backend=spec.backend)
    t0 = time.perf_counter()
    lp = text_logprobs(model, text)
    agreement = greedy_agreement(model, golden)
    return {"logprobs": lp.tolist(), "top1": agreement.top1.astype(int).tolist(),
            "exact": agreement.exact.astype(int).tolist(), "prefix": agreement.prefix.tolist(),
            "lengths": agreement.lengths.tolist(), "seconds": time.perf_counter() - t0}


def latency_samples(records: Sequence[RequestRecord], variant: str) -> dict[str, list[float]]:
    """TTFT, TPOT and tokens/s of ``variant``'s successful streamed requests in the log."""
    ok = [r for r in records if r.variant == variant and r.status == 200 and r.error is None and r.stream]
    return {"ttft_s": [r.ttft_s for r in ok if r.ttft_s is not None],
            "tpot_s": [r.tpot_s for r in ok if r.tpot_s is not None],
            "tokens_per_s": [r.completion_tokens / r.e2e_s for r in ok if r.completion_tokens and r.e2e_s]}


def build_report(variants: Sequence[VariantSpec], records: Sequence[RequestRecord] | None = None, *,
                 text: str | None = None, golden_path: str | Path | None = None, alpha: float = 0.05,
                 power: float = 0.8, effects: dict[str, float] | None = None, seed: int = 0) -> dict:
    """The report as a dict (JSON): per variant its figures and samples, and B - A comparisons."""
    if len(variants) < 2:
        raise ValueError(f"an A/B report compares at least two variants; got {len(variants)}")
    effects = {**EFFECTS, **(effects or {})}
    text = text if text is not None else default_path(HELDOUT).read_text(encoding="utf-8")
    golden = load_golden(golden_path or default_path(GOLDEN))
    records = list(records or [])
    unknown = sorted({r.variant for r in records} - {v.name for v in variants})
    per: dict[str, dict] = {}
    for spec in variants:
        q = evaluate_quality(spec, text, golden)
        lat = latency_samples(records, spec.name)
        lp = np.array(q["logprobs"])
        per[spec.name] = {
            "model": spec.model, "backend": spec.backend or "default",
            "quality": {"tokens": lp.size, "loglik_per_token": float(lp.mean()), "perplexity": float(np.exp(-lp.mean())),
                        "top1_agreement": float(np.mean(q["top1"])), "reference_tokens": len(q["top1"]),
                        "exact_answers": int(sum(q["exact"])), "prompts": len(q["exact"]),
                        "common_prefix": q["prefix"], "reference_lengths": q["lengths"], "seconds": q["seconds"]},
            "latency": {"requests": len(lat["ttft_s"]),
                        **{f"{k}_median": float(np.median(v)) if v else None for k, v in lat.items()}},
            "samples": {"logprobs": q["logprobs"], "top1": q["top1"], "exact": q["exact"], **lat},
        }
    base = variants[0].name
    comparisons = []
    for spec in variants[1:]:
        a, b = per[base]["samples"], per[spec.name]["samples"]
        pair = {"a": base, "b": spec.name}
        rows = [compare("loglik_per_token", a["logprobs"], b["logprobs"], paired=True, stat=np.mean,
                        effect_of_interest=effects["loglik"], alpha=alpha, power=power, seed=seed),
                compare("top1_agreement", a["top1"], b["top1"], paired=True, stat=np.mean,
                        effect_of_interest=effects["agreement"], alpha=alpha, power=power, seed=seed),
                compare("exact_answers", a["exact"], b["exact"], paired=True, stat=np.mean,
                        effect_of_interest=effects["agreement"], alpha=alpha, power=power, seed=seed)]
        for metric in ("ttft_s", "tpot_s", "tokens_per_s"):
            if not a[metric] or not b[metric]:
                rows.append({"metric": metric, "verdict": "not enough data",
                             "reason": "no streamed requests of one variant in the request log"
                             if records else "no request log given (--log)"})
                continue
            effect = effects["latency"] * float(np.median(a[metric]))
            rows.append(compare(metric, a[metric], b[metric], effect_of_interest=effect, alpha=alpha, power=power,
                                seed=seed))
        comparisons.append({**pair, "rows": [r if isinstance(r, dict) else r.as_dict() for r in rows]})
    return {
        "measured_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "method": {"difference": "B minus A, A the first variant", "alpha": alpha, "power": power,
                   "effects_of_interest": effects,
                   "quality": "paired percentile bootstrap (2,000 resamples) of the mean difference",
                   "latency": "two-sided Mann-Whitney U (normal approximation, tie-corrected) and a percentile "
                              "bootstrap CI of the difference of medians",
                   "sample_size": "normal approximation; for Mann-Whitney divided by its efficiency 3/pi",
                   "held_out_text": str(HELDOUT), "reference": f"{GOLDEN} (transformers, float32)"},
        "requests_logged": len(records),
        "unknown_variants_in_log": unknown,
        "variants": per,
        "comparisons": comparisons,
    }


def _fmt(x: float | None, digits: int = 4) -> str:
    return "-" if x is None else f"{x:.{digits}g}"


def format_report(report: dict) -> str:
    """A readable table of :func:`build_report`'s dict."""
    lines = ["variant        ppl      loglik/tok  top-1 agree  exact  requests  TTFT p50   TPOT p50   tok/s p50"]
    for name, v in report["variants"].items():
        q, lat = v["quality"], v["latency"]
        lines.append(f"{name:<14} {q['perplexity']:<8.3f} {q['loglik_per_token']:<11.4f} "
                     f"{q['top1_agreement']:<12.3f} {q['exact_answers']}/{q['prompts']:<4} {lat['requests']:<9} "
                     f"{_fmt(lat['ttft_s_median']):<10} {_fmt(lat['tpot_s_median']):<10} "
                     f"{_fmt(lat['tokens_per_s_median'])}")
    for c in report["comparisons"]:
        lines += ["", f"{c['b']} - {c['a']}:"]
        for r in c["rows"]:
            d = r.get("difference")
            ci = f"{_fmt(d['estimate'])} [{_fmt(d['low'])}, {_fmt(d['high'])}]" if d else "-"
            p = f"p={r['p_value']:.3g}" if r.get("p_value") is not None else ""
            lines.append(f"  {r['metric']:<18} {ci:<34} {p:<9} {r['verdict']}: {r['reason']}")
    if report["unknown_variants_in_log"]:
        lines.append(f"\nnote: the log has requests of variants not evaluated: {report['unknown_variants_in_log']}")
    return "\n".join(lines)


__all__ = ["EFFECTS", "build_report", "evaluate_quality", "format_report", "latency_samples"]
