"""Quantised weight formats (chapter 4 reads them; chapter 6 teaches them in depth).

    floats       FP32/FP16/BF16/FP8 (E4M3, E5M2): encode and decode with round-to-nearest-even
    integer      INT8/INT4, symmetric or asymmetric, per tensor / channel / group; nibble packing
    dequant      GGML block formats -> float32, vectorised with NumPy
    ggml_blocks  float32 -> Q8_0 / Q4_0 / Q4_1 (bit-exact with llama.cpp); matvec from blocks
    kquants      the K-quant super-blocks Q4_K and Q6_K
    registry     every ggml type's dequantiser and quantiser (None where unsupported): one table
    requantize   a whole GGUF model into another format (``llmrs quantize``)
"""

from .dequant import dequantize, dequantize_all, dequantize_tensor
from .ggml_blocks import matvec, quantize

__all__ = ["dequantize", "dequantize_all", "dequantize_tensor", "matvec", "quantize"]
