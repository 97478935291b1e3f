"""Chapter 9 — GPU Acceleration with CUDA and ROCm: your exercises.

Exercise 9.7  Writing a CUDA Kernel                     (ch09_gpu.ipynb, section 9.7)
Exercise 9.8  A Dequantize-and-Matvec Kernel            (ch09_gpu.ipynb, section 9.8)
Exercise 9.9  GPU Memory Pool                           (ch09_gpu.ipynb, section 9.9)

Your kernels run on an NVIDIA GPU when there is one, and otherwise in numba-cuda's CUDA
simulator (on the CPU, slowly: the tests use tiny shapes). Check your work with
``make test-chapter 9`` (or ``make test-exercise E=9.8``).
"""

from __future__ import annotations

# -- Exercise 9.7: a first CUDA kernel ------------------------------------------------

# -- Exercise 9.8: dequantize-and-matvec ----------------------------------------------

# -- Exercise 9.9: a GPU memory pool --------------------------------------------------
