"""Hand-written kernels: ``cpu`` (Numba, chapter 8); ``gpu`` (chapter 9) comes later."""
