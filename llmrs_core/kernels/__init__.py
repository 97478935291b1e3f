"""Hand-written kernels: ``cpu`` (Numba, chapter 8); ``gpu`` (chapter 9: numba.cuda, on a GPU or the CUDA simulator)."""
