"""The cuda backend: the forward pass on an NVIDIA GPU, with numba.cuda kernels (chapter 9).

Weights stay packed on the device (Q4_1 and Q8_0 blocks: about 110 MB for SmolLM2; other
ggml types are dequantised to float32 at load), and activations and KV caches live in the
device's array module (:attr:`xp`: CuPy on a GPU). A step of up to
:data:`FUSED_MAX_TOKENS` tokens (decode, and a batch of decoding sequences) multiplies
straight from the blocks with the fused dequantise-and-matvec kernels; a longer step
(prefill) dequantises each matrix on the device and lets ``xp.matmul`` multiply (cuBLAS
on a GPU). RMSNorm, RoPE and SwiGLU are single kernels; attention is the paged decode
kernel for one query and the tiled online-softmax kernel for a prompt; sampling runs on
the device (greedy as an argmax kernel, the rest of the chain in CuPy operations): one integer
per token comes back, not the logits.

Without a GPU the same kernels run in numba-cuda's CUDA simulator when it is enabled
(``NUMBA_ENABLE_CUDASIM=1``, or ``kernels.gpu.runtime.enable_simulator()`` before
anything imports ``numba.cuda``): ``xp`` is then NumPy. Slow: tiny models only. With
neither, creating the backend raises ``CudaUnavailableError`` saying what to do.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from ..attention import PLAIN, AttentionOptions
from ..kernels.gpu import runtime
from ..quant.types import GGMLType
from ..sampling import SamplingParams
from .base import Backend

if TYPE_CHECKING:
    from ..formats.source import WeightSource
    from ..kernels.gpu.matvec import DeviceMatrix

#: steps of at most this many tokens multiply with the fused kernels; longer ones through xp.matmul
FUSED_MAX_TOKENS = 8
#: ggml types the fused kernels read straight from their blocks
PACKED_TYPES = (GGMLType.Q4_1, GGMLType.Q8_0)


class DeviceGreedy:
    """Greedy sampling with the argmax taken on the device (``sampler(logits, history) -> id``)."""

    def __call__(self, logits: Any, history: Sequence[int] = ()) -> int:
        from ..kernels.gpu.sampling import greedy

        return int(greedy(logits)[0])


class DeviceSampler:
    """Any other sampling chain (penalties, temperature, top-k, top-p, min-p) on the device
    (``kernels.gpu.sampling.sample``): the same tokens as :class:`~llmrs_core.sampling.Sampler`
    for the same seed, and only the chosen id comes back."""

    def __init__(self, params: SamplingParams):
        self.params = params
        self.rng = np.random.default_rng(params.seed)

    def __call__(self, logits: Any, history: Sequence[int] = ()) -> int:
        from ..kernels.gpu.sampling import sample

        return sample(logits, self.params, self.rng, history)


class CudaBackend(Backend):
    name = "cuda"
    #: a fused-kernel step and a prefill step reach every kernel (numba.cuda compiles on first launch)
    warm_up_sizes = (1, FUSED_MAX_TOKENS + 1)

    def __init__(self) -> None:
        runtime.require_cuda()
        # the kernel modules import numba.cuda: only now, once the target is settled
        from ..kernels.gpu import arrays, attention, elementwise, matvec

        self._arrays, self._attention, self._elementwise, self._matvec = arrays, attention, elementwise, matvec
        self.xp = arrays.xp()
        self._scratch: Any = None  # a dequantised matrix for prefill's GEMM, reused across calls

    def prepare(self, source: WeightSource) -> None:
        """Refuse the families' extras: this backend's kernels are Llama's (chapter 9)."""
        from ..config import ConfigError
        from ..family_config import family_features

        features = family_features(source.config, source.tensors)
        if features:
            raise ConfigError(f"{source.path}: the cuda backend runs the llama family without extras; this "
                              f"{source.config.architecture} model has {', '.join(features)} (use numba or numpy)")
        super().prepare(source)

    # -- weights -----------------------------------------------------------------

    def load_matrix(self, source: WeightSource, name: str) -> DeviceMatrix:
        shape = source.tensors[name].shape
        stored = source.blocks(name)
        if stored is not None and len(shape) == 2 and stored[1] in PACKED_TYPES:
            return self._matvec.pack(stored[0], stored[1], shape)
        return self._matvec.pack(None, None, shape, dense=source.float32(name))

    def load_matrices(self, source: WeightSource, names: list[str]) -> list[DeviceMatrix]:
        # Q, K and V (gate and up) stacked: one launch for all of them at decode, where the
        # step is bound by launches (9.5)
        parts = [self.load_matrix(source, name) for name in names]
        return self._matvec.stack(parts) or parts

    def matmul_many(self, x: Any, ws: list[DeviceMatrix]) -> list[Any]:
        whole = ws[0].fused
        if whole is not None and all(w.fused is whole for w in ws) and sum(w.rows for w in ws) == whole.rows:
            y = self.matmul(x, whole)
            return [y[:, w.first_row : w.first_row + w.rows] for w in ws]
        return [self.matmul(x, w) for w in ws]

    def load_vector(self, source: WeightSource, name: str) -> Any:
        return self._arrays.to_device(super().load_vector(source, name))

    # -- operations --------------------------------------------------------------

    def embed(self, table: DeviceMatrix, ids: np.ndarray) -> Any:
        return self._matvec.embed(table, ids)

    def matmul(self, x: Any, w: DeviceMatrix) -> Any:
        if x.shape[0] <= FUSED_MAX_TOKENS:
            return self._matvec.matvec(x, w)
        if w.kind == "f32":
            return self.xp.matmul(x, w.qs.T)
        if self._scratch is None or self._scratch.size < w.rows * w.cols:
            self._scratch = self.xp.empty(w.rows * w.cols, np.float32)
        dense = self._matvec.dequantize_into(w, self._scratch[: w.rows * w.cols].reshape(w.rows, w.cols))
        return self.xp.matmul(self.xp.ascontiguousarray(x, dtype=np.float32), dense.T)

    def rms_norm(self, x: Any, weight: Any, eps: float) -> Any:
        return self._elementwise.rms_norm_rows(x, weight, eps)

    def swiglu(self, gate: Any, up: Any) -> Any:
        return self._elementwise.swiglu_rows(gate, up)

    def rope(self, x: Any, positions: np.ndarray, theta: float) -> Any:
        return self._elementwise.rope_rotate(x, positions, theta, interleaved=self.rope_layout == "interleaved")

    def attention(self, q: Any, k: Any, v: Any, options: AttentionOptions = PLAIN) -> Any:
        # options are always PLAIN here: prepare() refuses the families that set them
        if q.shape[0] == 1:
            # The decode kernel reads keys through a block table. The model hands over the
            # sequence's keys gathered ([Tk, Hkv, D]): as a pool of Tk one-token blocks, in order.
            tk, hkv, d = k.shape
            pool_k = self.xp.ascontiguousarray(k, dtype=np.float32).reshape(tk, hkv, 1, d)
            pool_v = self.xp.ascontiguousarray(v, dtype=np.float32).reshape(tk, hkv, 1, d)
            table = self.xp.arange(tk, dtype=np.int32)
            return self._attention.paged_attention(q, pool_k, pool_v, table, tk)
        return self._attention.contiguous_attention(q, k, v)

    def sampler(self, params: SamplingParams) -> Callable[..., int]:
        neutral = params.repetition_penalty == 1.0 and params.presence_penalty == 0.0 and params.frequency_penalty == 0.0
        if params.greedy and neutral:
            return DeviceGreedy()
        return DeviceSampler(params)

    def describe(self) -> str:
        if runtime.simulator_enabled():
            return "cuda (numba-cuda's CUDA simulator, on the CPU)"
        device = runtime.cuda().get_current_device()
        return f"cuda ({device.name.decode() if isinstance(device.name, bytes) else device.name})"


__all__ = ["FUSED_MAX_TOKENS", "CudaBackend", "DeviceGreedy", "DeviceSampler"]
