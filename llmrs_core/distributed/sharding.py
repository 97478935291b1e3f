"""Weight sharding for tensor parallelism: which slice of each matrix a rank keeps (chapter 11).

Weights are stored ``[out, in]`` (llama.cpp's and PyTorch's order: ``y = x @ W.T``).
Megatron's names are for the ``[in, out]`` matrix, so:

* **column-parallel** (Q, K, V, gate, up; the vocab-parallel head): each rank keeps a
  band of *output features*, i.e. a band of our **rows** ``W[lo:hi, :]``, and computes
  its own slice of ``y`` — no communication;
* **row-parallel** (o_proj, down): each rank keeps a band of *input features*, our
  **columns** ``W[:, lo:hi]``; it multiplies the matching slice of ``x`` and gets a
  partial sum of the whole ``y``, which an all-reduce completes.

A ggml block format (Q4_1, Q8_0: 32 weights per block, Q4_K/Q6_K: 256) stores each row
as whole blocks, so a column split must cut rows on block boundaries: the band width
``in / tp`` must be a multiple of the block size. Row splits work for any row count.
"""

from __future__ import annotations

from math import gcd

import numpy as np

from ..config import ModelConfig
from ..quant.types import GGMLType, type_traits


def even_range(n: int, parts: int, index: int, what: str = "items") -> tuple[int, int]:
    """``[lo, hi)`` of part ``index`` when ``n`` is cut into ``parts`` equal bands."""
    if parts < 1 or not 0 <= index < parts:
        raise ValueError(f"part {index} of {parts} does not exist")
    if n % parts:
        raise ValueError(f"{n} {what} do not split into {parts} equal parts")
    size = n // parts
    return index * size, (index + 1) * size


def split_rows(w: np.ndarray, parts: int, index: int) -> np.ndarray:
    """Column-parallel shard ``index`` of ``parts`` of a float ``w [out, in]``: its rows
    ``[lo, hi)`` -> ``[out/parts, in]``."""
    lo, hi = even_range(w.shape[0], parts, index, "rows")
    return np.ascontiguousarray(w[lo:hi])


def split_cols(w: np.ndarray, parts: int, index: int) -> np.ndarray:
    """Row-parallel shard ``index`` of ``parts`` of a float ``w [out, in]``: its columns
    ``[lo, hi)`` -> ``[out, in/parts]``."""
    lo, hi = even_range(w.shape[1], parts, index, "columns")
    return np.ascontiguousarray(w[:, lo:hi])


def _as_blocks(raw: np.ndarray, ggml_type: GGMLType, shape: tuple[int, ...]) -> np.ndarray:
    """Stored bytes of ``[rows, cols]`` as ``uint8 [rows, blocks per row, bytes per block]``."""
    t = type_traits(ggml_type)
    rows, cols = shape
    if cols % t.block_size:
        raise ValueError(f"a {GGMLType(ggml_type).name} row holds whole blocks of {t.block_size}; got {cols} columns")
    nb = cols // t.block_size
    if raw.size != rows * nb * t.type_size:
        raise ValueError(f"a [{rows}, {cols}] {GGMLType(ggml_type).name} matrix is {rows * nb * t.type_size} "
                         f"bytes; got {raw.size}")
    return raw.reshape(rows, nb, t.type_size)


def block_rows(raw: np.ndarray, ggml_type: GGMLType, shape: tuple[int, ...], lo: int, hi: int) -> np.ndarray:
    """Rows ``[lo, hi)`` of a ``[rows, cols]`` matrix stored in a ggml type (its stored bytes
    ``raw``), still quantised: the blocks are copied, never re-quantised."""
    return np.ascontiguousarray(_as_blocks(raw, ggml_type, shape)[lo:hi]).reshape(-1)


def block_cols(raw: np.ndarray, ggml_type: GGMLType, shape: tuple[int, ...], lo: int, hi: int) -> np.ndarray:
    """Columns ``[lo, hi)`` of a matrix stored in a ggml type, as whole blocks: ``ValueError``
    when ``lo`` or ``hi`` is not on a block boundary (a block cannot be cut)."""
    bs = type_traits(ggml_type).block_size
    if lo % bs or hi % bs:
        raise ValueError(
            f"a row-parallel shard needs whole {GGMLType(ggml_type).name} blocks of {bs} weights; "
            f"columns {lo}..{hi} cut a block"
        )
    return np.ascontiguousarray(_as_blocks(raw, ggml_type, shape)[:, lo // bs: hi // bs]).reshape(-1)


def kv_head_assignment(n_heads: int, n_kv_heads: int, tp: int) -> list[tuple[range, range]]:
    """For each rank, ``(query heads, KV heads)`` it keeps. Query head ``h`` reads KV head
    ``h // (n_heads // n_kv_heads)`` (grouped-query attention), so a rank with a contiguous band
    of ``n_kv_heads / tp`` KV heads has exactly their query heads: attention needs no
    communication. ``ValueError`` when ``tp`` does not divide ``n_kv_heads`` (the KV heads would
    have to be replicated, which this engine does not do)."""
    if n_heads % n_kv_heads:
        raise ValueError(f"{n_heads} query heads are not a whole number of groups of {n_kv_heads} KV heads")
    if tp < 1 or n_kv_heads % tp:
        raise ValueError(f"{n_kv_heads} KV heads do not split over {tp} ranks")
    q, kv = n_heads // tp, n_kv_heads // tp
    return [(range(r * q, (r + 1) * q), range(r * kv, (r + 1) * kv)) for r in range(tp)]


def vocab_range(vocab_size: int, tp: int, rank: int) -> tuple[int, int]:
    """Token ids ``[lo, hi)`` whose embedding rows (and logits) rank ``rank`` keeps."""
    return even_range(vocab_size, tp, rank, "vocabulary rows")


def tp_problem(config: ModelConfig, tp: int, block_size: int = 32) -> str | None:
    """Why ``tp`` ranks cannot split ``config`` (weights in ``block_size`` blocks), or ``None``."""
    c = config
    if tp < 1:
        return "the tensor-parallel size must be at least 1"
    if c.n_kv_heads % tp:
        return f"{c.n_kv_heads} KV heads do not split over {tp} ranks (KV heads are not replicated)"
    if c.n_heads % tp:
        return f"{c.n_heads} query heads do not split over {tp} ranks"
    if (c.n_heads // tp * c.head_dim) % block_size or (c.intermediate_size // tp) % block_size:
        return (f"the row-parallel bands ({c.n_heads // tp * c.head_dim} attention and "
                f"{c.intermediate_size / tp:g} MLP columns) are not whole {block_size}-weight blocks")
    if c.vocab_size % tp:
        return f"the vocabulary ({c.vocab_size}) does not split into {tp} equal parts"
    return None


def valid_tp_sizes(config: ModelConfig, block_size: int = 32) -> list[int]:
    """Every tensor-parallel size that splits ``config`` evenly: divisors of
    ``gcd(n_heads, n_kv_heads)`` whose row-parallel bands are whole blocks. SmolLM2 (9 heads,
    3 KV heads): ``[1, 3]``."""
    g = gcd(config.n_heads, config.n_kv_heads)
    return [t for t in range(1, g + 1) if g % t == 0 and tp_problem(config, t, block_size) is None]


def check_tp(config: ModelConfig, tp: int, block_size: int = 32) -> None:
    """``ValueError`` naming the problem and the sizes that work when ``tp`` cannot split ``config``."""
    problem = tp_problem(config, tp, block_size)
    if problem is not None:
        sizes = ", ".join(map(str, valid_tp_sizes(config, block_size)))
        raise ValueError(f"--tp {tp} cannot split this model: {problem}. Tensor-parallel sizes that work: {sizes}")


def stage_layers(n_layers: int, pp: int, stage: int) -> range:
    """The layers pipeline stage ``stage`` of ``pp`` runs: contiguous, as equal as possible
    (SmolLM2's 30 over 2 stages: 0-14 and 15-29)."""
    if pp < 1 or pp > n_layers:
        raise ValueError(f"--pp {pp} cannot split {n_layers} layers (1 to {n_layers} stages work)")
    if not 0 <= stage < pp:
        raise ValueError(f"stage {stage} of {pp} does not exist")
    bounds = [n_layers * s // pp for s in range(pp + 1)]
    return range(bounds[stage], bounds[stage + 1])


__all__ = [
    "block_cols", "block_rows", "check_tp", "even_range", "kv_head_assignment", "split_cols",
    "split_rows", "stage_layers", "tp_problem", "valid_tp_sizes", "vocab_range",
]
