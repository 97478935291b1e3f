"""The chapter labs: code that teaches, which the engine never imports (``load()``, the backends, the server).

    naive             chapter 8: the naive row-at-a-time Q4 matvec, the baseline the fast kernels beat
    memory_pool       chapter 9 (9.4, Exercise 9.9): a caching GPU allocator after PyTorch's
    fake_device       chapter 9: a pretend device and its events, so the pool runs without a GPU
    memory_workload   chapter 9: a synthetic decode loop's allocation trace, replayed on a pool
    memory_pool_cupy  chapter 9: the pool behind CuPy's arrays on a real GPU (``scripts/gpu_check.py``)
    fusion            chapter 9 (9.6): trace a chain of elementwise ops; count what fusing saves
    fusion_codegen    chapter 9: one numba.cuda (or CuPy) kernel generated from a traced graph
    fusion_check      chapter 9: the fused kernels against eager CuPy on a real GPU (``scripts/gpu_check.py``)
    ring              chapter 11: ring all-reduce over send/recv (the engine calls its communicator's)

A lab may import the engine (its kernels, its layers); nothing in the engine imports a lab.
"""
