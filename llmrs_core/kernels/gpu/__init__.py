"""GPU kernels (chapter 9): numba.cuda kernels that run on an NVIDIA GPU or in numba-cuda's simulator.

Import numba.cuda only through :func:`llmrs_core.kernels.gpu.runtime.cuda`, which decides
once per process whether the kernels run on a real GPU or in the simulator.
"""
