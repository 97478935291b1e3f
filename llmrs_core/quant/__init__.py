"""Quantised weight formats (chapter 4 reads them; chapter 6 teaches them in depth).

    types        the ggml type table: each GGMLType's block size and bytes per block (chapters 1, 6)
    floats       FP32/FP16/BF16/FP8 (E4M3, E5M2): encode and decode with round-to-nearest-even
    integer      INT8/INT4, symmetric or asymmetric, per tensor / channel / group; nibble packing
    dequant      GGML block formats -> float32, vectorised with NumPy
    ggml_blocks  float32 -> Q8_0 / Q4_0 / Q4_1 / Q5_0 / Q5_1 (bit-exact with llama.cpp); matvec from blocks
    kquants      the K-quant super-blocks Q4_K, Q5_K and Q6_K
    kquants_low  the low-bit K-quants Q2_K and Q3_K
    iq4          IQ4_NL and IQ4_XS: 4-bit codes on a non-uniform grid
    registry     every ggml type's dequantiser and quantiser (None where unsupported): one table;
                 check_computable refuses a model holding a type without a dequantiser
    requantize   a whole GGUF model into another format (``llmrs quantize``)
"""

from .dequant import dequantize, dequantize_all, dequantize_tensor
from .ggml_blocks import matvec, quantize

__all__ = ["dequantize", "dequantize_all", "dequantize_tensor", "matvec", "quantize"]
