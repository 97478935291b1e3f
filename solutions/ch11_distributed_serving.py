"""Chapter 11 solutions: the engine's distributed layer and server (llmrs_core.distributed, llmrs_core.server)."""

from __future__ import annotations

# each exercise's region adds its names
__all__: list[str] = []

# -- Exercise 11.5 ----------------------------------------------------------------------

import numpy as np  # noqa: E402

from llmrs_core import attention, layers, rope  # noqa: E402
from llmrs_core.config import ModelConfig  # noqa: E402
from llmrs_core.distributed import Communicator  # noqa: E402
from llmrs_core.distributed.sharding import split_cols, split_rows  # noqa: E402

__all__ += ["parallel_block", "shard_block", "split_cols", "split_rows"]

_COLUMN_PARALLEL = ("wq", "wk", "wv", "w_gate", "w_up")
_ROW_PARALLEL = ("wo", "w_down")


def shard_block(w: dict[str, np.ndarray], rank: int, world_size: int) -> dict[str, np.ndarray]:
    """The engine's split (``llmrs_core.distributed.shard``) for one block's float weights."""
    out = {name: split_rows(w[name], world_size, rank) for name in _COLUMN_PARALLEL}
    out |= {name: split_cols(w[name], world_size, rank) for name in _ROW_PARALLEL}
    return out | {"attn_norm": w["attn_norm"], "ffn_norm": w["ffn_norm"]}


def parallel_block(x: np.ndarray, shard: dict[str, np.ndarray], comm: Communicator,
                   config: ModelConfig) -> np.ndarray:
    """A readable tensor-parallel block; the engine's is ``LlamaModel.forward_batch`` with a
    ``TensorParallel`` plan (``llmrs_core.distributed.plan``), which all-reduces at the same two points."""
    c, n = config, x.shape[0]
    hq, hkv = c.n_heads // comm.world_size, c.n_kv_heads // comm.world_size
    pos = np.arange(n)
    h = layers.rms_norm(x, shard["attn_norm"], c.rms_norm_eps)
    q = rope.apply_rope_interleaved(layers.linear(h, shard["wq"]).reshape(n, hq, c.head_dim), pos, c.rope_theta)
    k = rope.apply_rope_interleaved(layers.linear(h, shard["wk"]).reshape(n, hkv, c.head_dim), pos, c.rope_theta)
    v = layers.linear(h, shard["wv"]).reshape(n, hkv, c.head_dim)
    heads = attention.scaled_dot_product_attention(q, k, v, causal=True).reshape(n, hq * c.head_dim)
    x = x + comm.all_reduce(np.ascontiguousarray(layers.linear(heads, shard["wo"]), dtype=np.float32))
    h = layers.rms_norm(x, shard["ffn_norm"], c.rms_norm_eps)
    mlp = layers.swiglu(layers.linear(h, shard["w_gate"]), layers.linear(h, shard["w_up"]))
    return x + comm.all_reduce(np.ascontiguousarray(layers.linear(mlp, shard["w_down"]), dtype=np.float32))


# -- Exercise 11.6 ----------------------------------------------------------------------

from llmrs_core.server.sse import sse_event, sse_events  # noqa: E402

__all__ += ["sse_event", "sse_events"]
