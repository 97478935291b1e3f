"""The Markdown report and plots of a ``bench all`` run, and ``bench compare`` of two runs (appendix A).

:func:`write_outputs` puts into one folder (``build/bench/`` by default):

* ``results.json`` — the whole result document (:func:`.suite.run_all`);
* ``report.md`` — the environment, then one table per benchmark: median, 95%
  interval, coefficient of variation, repetitions, and "noisy" where it applies; and the
  benchmark's own table where it gives one (``raw["table"]``: the quantisation table);
* ``ratios.png`` — every ratio figure with its interval (1 = parity);
* ``distributions.png`` — each figure's repetitions over its median: the
  spread a single number hides.

:func:`compare_results` matches the figures of two result files by key.
"""

from __future__ import annotations

import json
from pathlib import Path

from .environment import describe
from .stats import NOISY_CV, Change, Figure, compare_samples


def _value(x: float, unit: str) -> str:
    if unit == "s":
        return f"{x * 1e3:.1f} ms"
    if unit == "ratio":
        return f"{x:.2f}×"
    return f"{x:,.1f}" if x < 1e4 else f"{x:,.0f}"


def figure_row(f: Figure) -> str:
    unit = "" if f.unit in ("s", "ratio") else f" {f.unit}"
    mark = " **noisy**" if f.noisy else ""
    return (f"| {f.title} | {_value(f.median, f.unit)}{unit} | {_value(f.ci_low, f.unit)} – "
            f"{_value(f.ci_high, f.unit)} | {100 * f.cv:.1f}%{mark} | {len(f.samples)} |")


def raw_table(table: dict) -> list[str]:
    """A benchmark's own table (``raw["table"] = {"columns": [...], "rows": [[...]]}``, display
    strings) as Markdown lines; ``ValueError`` when a row's length is not the columns'."""
    columns, rows = table["columns"], table["rows"]
    for i, row in enumerate(rows):
        if len(row) != len(columns):
            raise ValueError(f"table row {i} has {len(row)} cells for {len(columns)} columns")

    def line(cells) -> str:
        return "| " + " | ".join(str(c).replace("|", "\\|") for c in cells) + " |"
    return [line(columns), "|" + "---|" * len(columns), *map(line, rows)]


def markdown(result: dict) -> str:
    """The report of one result document."""
    from .suite import figures_of

    env, plan = result["environment"], result["plan"]
    git = env["git"]
    lines = [f"# llmrs bench all ({plan['name']})", "",
             f"- **measured** {env['time_utc']} on {describe(env)}",
             f"- **software** Python {env['python']}, " + ", ".join(f"{k} {v}" for k, v in env["packages"].items()),
             f"- **threads** {env['threads']}; Numba threading layer {env['numba_threading_layer']}; BLAS "
             + ", ".join(f"{b['internal_api']} {b['version']} ({b.get('architecture') or '?'})"
                         for b in env["blas"] if b["user_api"] == "blas"),
             f"- **code** commit {(git['commit'] or 'unknown')[:12]}" + (" (with uncommitted changes)" if git["dirty"]
                                                                         else ""),
             f"- **statistics** median of {plan['repetitions']} repetitions after a warm-up; 95% bootstrap "
             f"interval of the median; noisy: coefficient of variation above {100 * NOISY_CV:.0f}%"]
    if result["busy"]["busy"]:
        lines.append(f"- **the machine was busy** when the run started ({result['busy']['why']}): expect slower, "
                     "noisier figures than on a quiet machine")
    figures = figures_of(result)
    for b in result["benchmarks"].values():
        lines += ["", f"## {b['title']}", ""]
        if "skipped" in b:
            lines.append(f"Skipped: {b['skipped']}")
            continue
        if b["figures"]:
            lines += ["| figure | median | 95% interval | CV | n |", "|---|---|---|---|---|"]
            lines += [figure_row(figures[k]) for k in b["figures"]]
        table = b["raw"].get("table")
        if table:
            lines += [""] if b["figures"] else []
            lines += raw_table(table)
        if b["notes"]:
            lines.append("")
            lines += [f"- {note}" for note in b["notes"]]
        lines.append(f"\n({b['seconds']:.0f} s)")
    return "\n".join(lines) + "\n"


def plot_ratios(result: dict, path: Path) -> bool:
    """``ratios.png``: every ratio figure, median and interval; False when there is none."""
    from .suite import figures_of

    ratios = [f for f in figures_of(result).values() if f.unit == "ratio"]
    if not ratios:
        return False
    import matplotlib.ticker
    from matplotlib.figure import Figure as Canvas  # no pyplot: the caller's backend stays as it is

    fig = Canvas(figsize=(7.5, 0.45 * len(ratios) + 1.2))
    ax = fig.subplots()
    for i, f in enumerate(ratios):
        ax.errorbar(f.median, i, xerr=[[f.median - f.ci_low], [f.ci_high - f.median]], fmt="o",
                    color="C3" if f.noisy else "C0", capsize=3)
    ax.axvline(1.0, color="grey", linewidth=0.8, linestyle="--")
    ax.set_yticks(range(len(ratios)), [f.title for f in ratios], fontsize=8)
    ax.set_xscale("log")
    ax.xaxis.set_major_formatter(matplotlib.ticker.FuncFormatter(lambda v, _: f"{v:g}×"))
    ax.xaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())
    ax.set_xlabel("ratio (median, 95% interval; red: noisy)")
    ax.invert_yaxis()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    return True


def plot_distributions(result: dict, path: Path) -> None:
    """``distributions.png``: each figure's repetitions divided by its median."""
    from .suite import figures_of

    figures = [f for f in figures_of(result).values() if f.median]
    import numpy as np
    from matplotlib.figure import Figure as Canvas

    fig = Canvas(figsize=(7.5, 0.32 * len(figures) + 1.2))
    ax = fig.subplots()
    for i, f in enumerate(figures):
        rel = np.asarray(f.samples) / f.median
        ax.scatter(rel, np.full(rel.shape, i) + np.linspace(-0.15, 0.15, rel.size), s=10,
                   color="C3" if f.noisy else "C0")
    ax.axvline(1.0, color="grey", linewidth=0.8)
    ax.set_yticks(range(len(figures)), [f.title for f in figures], fontsize=7)
    ax.set_xlabel("each repetition / the median (red: noisy)")
    ax.invert_yaxis()
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def write_outputs(result: dict, folder: str | Path) -> Path:
    """Write results.json, report.md and the plots into ``folder``; returns the report's path."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "results.json").write_text(json.dumps(result, indent=1) + "\n")
    report = folder / "report.md"
    text = markdown(result)
    if plot_ratios(result, folder / "ratios.png"):
        text += "\n![ratios](ratios.png)\n"
    if result["figures"]:
        plot_distributions(result, folder / "distributions.png")
        text += "\n![distributions](distributions.png)\n"
    report.write_text(text)
    return report


def read_result(path: str | Path) -> dict:
    """A ``results.json`` from ``bench all``, checked enough to say what is wrong with a bad one."""
    path = Path(path)
    try:
        result = json.loads(path.read_text())
    except OSError as e:
        raise ValueError(f"cannot read {path}: {e.strerror}") from None
    except json.JSONDecodeError as e:
        raise ValueError(f"{path} is not JSON ({e.msg}, line {e.lineno}): give a results.json of bench all") from None
    if not isinstance(result, dict) or not isinstance(result.get("figures"), list):
        raise ValueError(f"{path} is not a bench all result (it has no list of figures)")
    for i, d in enumerate(result["figures"]):
        if not isinstance(d, dict) or not {"key", "samples", "unit"} <= d.keys():
            raise ValueError(f"{path}: figure {i} lacks key, samples or unit")
    return result


#: the plan's fields that a benchmark's workload depends on beyond what its figures' keys say (speed's
#: pp and tg are in its keys): two runs whose fields differ measured different things
WORKLOAD_FIELDS = {"tokenizer": ("tokenizer_copies",),
                   "throughput": ("throughput_requests", "throughput_max_prompt", "throughput_max_output",
                                  "max_num_seqs"),
                   "serve": ("serve_prompts", "serve_input_len", "serve_output_len"),
                   "dist": ("dist_tokens",)}


def _workload_differs(old: dict, new: dict, key: str) -> str | None:
    """Why figure ``key`` of the two runs measured different workloads (a sentence), or None."""
    a, b = old.get("plan", {}), new.get("plan", {})
    fields = ("threads", *WORKLOAD_FIELDS.get(key.split(".", 1)[0], ()))
    changed = [f"{f} {a.get(f)} -> {b.get(f)}" for f in fields if a.get(f) != b.get(f)]
    return ", ".join(changed) or None


def compare_results(old: dict, new: dict) -> tuple[list[tuple[Figure, Figure, Change]], list[str]]:
    """The figures both results have and measured alike, with their change; and a line for each
    figure that only one has, or whose workload differs between the two plans (not compared)."""
    from .suite import figures_of

    a, b = figures_of(old), figures_of(new)
    both, only = [], []
    for k in a:
        if k not in b:
            only.append(f"only in the old run: {k}")
        elif (why := _workload_differs(old, new, k)) is not None:
            only.append(f"not compared, the workload differs ({why}): {k}")
        else:
            both.append((a[k], b[k], compare_samples(a[k], b[k])))
    only += [f"only in the new run: {k}" for k in b if k not in a]
    return both, only


def format_comparison(rows: list[tuple[Figure, Figure, Change]], only: list[str]) -> str:
    lines = [f"{'figure':<44} {'old':>11} {'new':>11} {'new/old':>8} {'95% interval':>15} {'p':>6}  verdict"]
    for old, new, c in rows:
        verdict = "no significant change" if not c.significant else ("better" if c.better else "WORSE")
        lines.append(f"{old.title[:44]:<44} {_value(old.median, old.unit):>11} {_value(new.median, new.unit):>11} "
                     f"{c.ratio:>7.3f}× {c.ci_low:>6.3f}–{c.ci_high:<6.3f}  {c.p_value:>6.3f}  {verdict}")
    lines += only
    lines.append("(Mann-Whitney U on the repetitions, two-sided, 5% level; the interval is a bootstrap of the "
                 "ratio of medians)")
    return "\n".join(lines)


__all__ = ["compare_results", "figure_row", "format_comparison", "markdown", "raw_table", "read_result",
           "write_outputs"]
