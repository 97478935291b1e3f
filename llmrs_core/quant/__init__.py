"""Quantised weight formats (chapter 4 reads them; chapter 6 teaches them in depth).

    dequant   GGML block formats -> float32, vectorised with NumPy
"""

from .dequant import dequantize, dequantize_all, dequantize_tensor, load_float32

__all__ = ["dequantize", "dequantize_all", "dequantize_tensor", "load_float32"]
