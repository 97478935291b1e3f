"""``ShardSource``: the part of a model one rank keeps, as a :class:`WeightSource` (chapter 11).

A rank of a tensor-parallel (``tp``) or pipeline-parallel (``pp``) run loads an ordinary
:class:`~llmrs_core.model.LlamaModel` from a ``ShardSource``: the full source seen
through a window. Its :attr:`config` is the rank's own architecture — its pipeline stage's
layers (renumbered from ``blk.0``), ``n_heads / tp`` query heads, ``n_kv_heads / tp`` KV
heads, ``intermediate_size / tp`` MLP features — so the model code, its KV caches and the
backends' kernels work unchanged on the smaller matrices. The vocabulary size stays the
model's (token ids are checked against it); with ``vocab_parallel`` the embedding table
(and untied output head) hold only this rank's ``vocab_size / tp`` rows.

Quantised tensors stay quantised: :meth:`blocks` hands out the rank's whole blocks.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from ..config import ConfigError, ModelConfig
from ..family_config import family_features
from ..formats.source import WeightSource
from ..quant.types import GGMLType, type_by_name, type_traits
from . import sharding

if TYPE_CHECKING:
    from ..tokenizer import Tokenizer


@dataclass(frozen=True)
class ShardSpec:
    """Which part of the model a rank keeps: tensor-parallel rank ``tp_rank`` of ``tp`` within
    pipeline stage ``pp_rank`` of ``pp``. ``vocab_parallel``: split the embedding table and the
    output head by vocabulary rows (else every rank keeps them whole)."""

    tp: int = 1
    pp: int = 1
    tp_rank: int = 0
    pp_rank: int = 0
    vocab_parallel: bool = True


@dataclass(frozen=True)
class ShardTensorInfo:
    """A tensor as the shard presents it (see :class:`~llmrs_core.formats.source.TensorInfo`)."""

    shape: tuple[int, ...]
    type_name: str
    n_bytes: int
    n_elements: int


# how each per-layer tensor is split across tensor-parallel ranks, by its suffix
_LAYER_SPLIT = {
    "attn_q.weight": "q_rows", "attn_k.weight": "kv_rows", "attn_v.weight": "kv_rows",
    "attn_output.weight": "q_cols", "ffn_gate.weight": "ff_rows", "ffn_up.weight": "ff_rows",
    "ffn_down.weight": "ff_cols", "attn_norm.weight": "whole", "ffn_norm.weight": "whole",
}
ROW_PARALLEL = ("attn_output.weight", "ffn_down.weight")


def weight_block_size(source: WeightSource) -> int:
    """The largest ggml block size among the row-parallel matrices (1 for float weights)."""
    sizes = [1]
    for name, info in source.tensors.items():
        if name.endswith(ROW_PARALLEL):
            try:
                sizes.append(type_traits(type_by_name(info.type_name)).block_size)
            except ValueError:
                pass  # a float dtype name of a safetensors source: block size 1
    return max(sizes)


class ShardSource(WeightSource):
    """The tensors rank ``spec`` keeps of ``source``, under the names a one-process model reads."""

    def __init__(self, source: WeightSource, spec: ShardSpec):
        full = source.config
        features = family_features(full, source.tensors)
        if features:  # the shards split Llama's tensors; a family's own are not split yet
            raise ConfigError(f"{source.path}: tensor and pipeline parallelism run the llama family without "
                              f"extras; this {full.architecture} model has {', '.join(features)}")
        sharding.check_tp(full, spec.tp, weight_block_size(source))
        self.layers = sharding.stage_layers(full.n_layers, spec.pp, spec.pp_rank)
        self.source, self.spec = source, spec
        self.path, self.metadata, self.file_size = source.path, source.metadata, source.file_size
        self.rope_layout = source.rope_layout
        self.full_config = full
        self._config = dataclasses.replace(
            full, n_layers=len(self.layers), n_heads=full.n_heads // spec.tp,
            n_kv_heads=full.n_kv_heads // spec.tp, intermediate_size=full.intermediate_size // spec.tp,
        )
        heads = sharding.kv_head_assignment(full.n_heads, full.n_kv_heads, spec.tp)[spec.tp_rank]
        hd = full.head_dim
        self._ranges = {
            "q_rows": (0, heads[0].start * hd, heads[0].stop * hd),
            "kv_rows": (0, heads[1].start * hd, heads[1].stop * hd),
            "q_cols": (1, heads[0].start * hd, heads[0].stop * hd),
            "ff_rows": (0, *sharding.even_range(full.intermediate_size, spec.tp, spec.tp_rank)),
            "ff_cols": (1, *sharding.even_range(full.intermediate_size, spec.tp, spec.tp_rank)),
            "vocab_rows": (0, *sharding.vocab_range(full.vocab_size, spec.tp, spec.tp_rank)),
        }
        #: local name -> (name in the full source, how it is split)
        self._map: dict[str, tuple[str, str]] = {}
        for j, i in enumerate(self.layers):
            for suffix, how in _LAYER_SPLIT.items():
                self._map[f"blk.{j}.{suffix}"] = (f"blk.{i}.{suffix}", how)
        vocab = "vocab_rows" if spec.vocab_parallel and spec.tp > 1 else "whole"
        self._map["token_embd.weight"] = ("token_embd.weight", vocab)
        self._map["output_norm.weight"] = ("output_norm.weight", "whole")
        if "output.weight" in source.tensors:
            self._map["output.weight"] = ("output.weight", vocab)
        self.tensors = {local: self._info(glob, how) for local, (glob, how) in self._map.items()}

    @property
    def config(self) -> ModelConfig:
        """This rank's architecture (its layers, heads and MLP features; the full vocabulary size)."""
        return self._config

    @property
    def vocab_rows(self) -> tuple[int, int]:
        """Token ids ``[lo, hi)`` of this rank's embedding rows."""
        if self._map["token_embd.weight"][1] == "whole":
            return 0, self.full_config.vocab_size
        return self._ranges["vocab_rows"][1:]

    def _cut(self, shape: tuple[int, ...], how: str) -> tuple[int, ...]:
        if how == "whole":
            return shape
        axis, lo, hi = self._ranges[how]
        return tuple(hi - lo if a == axis else s for a, s in enumerate(shape))

    def _info(self, name: str, how: str) -> ShardTensorInfo:
        info = self.source.tensors[name]
        shape = self._cut(info.shape, how)
        n = int(np.prod(shape))
        return ShardTensorInfo(shape, info.type_name, info.n_bytes * n // max(info.n_elements, 1), n)

    def float32(self, name: str) -> np.ndarray:
        glob, how = self._lookup(name)
        a = self.source.float32(glob)
        if how == "whole":
            return a
        axis, lo, hi = self._ranges[how]
        return np.ascontiguousarray(a[lo:hi] if axis == 0 else a[:, lo:hi])

    def blocks(self, name: str) -> tuple[np.ndarray, GGMLType] | None:
        glob, how = self._lookup(name)
        stored = self.source.blocks(glob)
        if stored is None or how == "whole":
            return stored
        raw, t = stored
        shape = self.source.tensors[glob].shape
        axis, lo, hi = self._ranges[how]
        cut = sharding.block_rows if axis == 0 else sharding.block_cols
        return cut(raw, t, shape, lo, hi), t

    def _lookup(self, name: str) -> tuple[str, str]:
        try:
            return self._map[name]
        except KeyError:
            raise KeyError(f"no tensor named {name!r} in this shard of {self.path}") from None

    def tokenizer(self) -> Tokenizer | None:
        return self.source.tokenizer()

    def describe(self) -> dict[str, Any]:
        """What this rank holds, for reports."""
        s = self.spec
        return {"tp_rank": s.tp_rank, "tp": s.tp, "pp_rank": s.pp_rank, "pp": s.pp,
                "layers": [self.layers.start, self.layers.stop], "vocab_rows": list(self.vocab_rows),
                "n_heads": self._config.n_heads, "n_kv_heads": self._config.n_kv_heads,
                "intermediate_size": self._config.intermediate_size}


__all__ = ["ShardSource", "ShardSpec", "ShardTensorInfo", "weight_block_size"]
