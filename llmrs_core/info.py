"""What the engine knows about a model, as data and as text (chapter 1; ``llmrs info``).

:func:`summary` gathers a loaded model's figures into one JSON-ready dict (its config,
parameters by component, bytes on disk and in each weight format, the KV cache per token and
for a context, FLOPs per token); :func:`format_summary` is its human-readable text.
``Model.summary()`` is :func:`summary` of that model.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING

from .family_config import family_features

if TYPE_CHECKING:
    from .loader import Model


def mib(n: int) -> str:
    return f"{n / 2**20:,.1f} MiB"


def summary(model: Model, context_length: int | None = None) -> dict:
    """Everything ``llmrs info`` prints, as a JSON-ready dict.

    KV-cache figures are for f16 K/V at ``context_length`` tokens
    (default: the model's trained context length).
    """
    cfg = model.config
    ctx = cfg.context_length if context_length is None else context_length
    return {
        "name": model.name,
        "path": str(model.path),
        "architecture": cfg.architecture,
        "family_features": family_features(cfg, model.source.tensors),
        "config": dataclasses.asdict(cfg),
        "params": {**cfg.param_counts(), "total": cfg.n_params},
        "stored_params": model.stored_params(),
        "file_bytes": model.file_bytes(),
        "tensor_bytes": sum(t.n_bytes for t in model.source.tensors.values()),
        "tensor_types": model.tensor_types(),
        "weight_bytes_by_format": {
            fmt: cfg.weight_bytes(fmt) for fmt in ("f32", "f16", "q8_0", "q4_1", "q4_0")
        },
        "kv_cache": {
            "dtype": "f16",
            "bytes_per_token": cfg.kv_bytes_per_token("f16"),
            "context_length": ctx,
            "bytes_for_context": cfg.kv_cache_bytes(ctx, "f16"),
        },
        "flops_per_token": {
            "context_0": cfg.flops_per_token(0),
            f"context_{ctx}": cfg.flops_per_token(ctx),
        },
    }


def format_summary(s: dict) -> str:
    """Human-readable text of :func:`summary`."""
    cfg = s["config"]
    p = s["params"]
    total = p["total"]
    lines = [
        f"{s['name']}  ({s['path']})",
        "",
        f"architecture      {s['architecture']}, {cfg['n_layers']} layers, "
        f"hidden size {cfg['hidden_size']}, MLP width {cfg['intermediate_size']}",
        f"attention         {cfg['n_heads']} query heads, {cfg['n_kv_heads']} KV heads "
        f"(GQA {cfg['n_heads'] // cfg['n_kv_heads']}:1), head_dim {cfg['head_dim']}",
        f"vocabulary        {cfg['vocab_size']:,} tokens, embeddings "
        f"{'tied to the output head' if cfg['tie_embeddings'] else 'separate from the output head'}",
        f"position          RoPE, theta {cfg['rope_theta']:g}, trained context {cfg['context_length']:,}",
        f"RMSNorm eps       {cfg['rms_norm_eps']:g}",
        f"family            {s['architecture']}: "
        + ("; ".join(s["family_features"]) if s["family_features"] else "Llama's path (no extras)"),
        "",
        "parameters by component",
    ]
    for key in ("embedding", "attention", "mlp", "norms", "output"):
        lines.append(f"  {key:<15} {p[key]:>13,}  {100 * p[key] / total:5.1f}%")
    lines.append(f"  {'total':<15} {total:>13,}")
    if s["stored_params"] != total:
        lines.append(f"  (the file stores {s['stored_params']:,})")
    types = ", ".join(f"{n} {t}" for t, n in s["tensor_types"].items())
    lines += [
        "",
        f"on disk           {s['file_bytes']:,} bytes ({mib(s['file_bytes'])}): tensor data "
        f"{mib(s['tensor_bytes'])} in {types}; header and metadata {mib(s['file_bytes'] - s['tensor_bytes'])}",
        "weights if stored as  "
        + ", ".join(f"{fmt} {mib(b)}" for fmt, b in s["weight_bytes_by_format"].items()),
        f"KV cache ({s['kv_cache']['dtype']})     {s['kv_cache']['bytes_per_token']:,} bytes per token; "
        f"{mib(s['kv_cache']['bytes_for_context'])} for {s['kv_cache']['context_length']:,} tokens",
        "FLOPs per token   "
        + ", ".join(f"{v / 1e6:,.0f} M at {k.replace('_', ' ')}" for k, v in s["flops_per_token"].items()),
    ]
    return "\n".join(lines)


__all__ = ["format_summary", "mib", "summary"]
