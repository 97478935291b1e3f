"""Chapter 11 — Distributed Inference and Serving: your exercises.

Exercise 11.5  Building a Multi-GPU Engine (here: multi-process)  (ch11_distributed_serving.ipynb, section 11.5)
Exercise 11.6  Streaming API                                      (ch11_distributed_serving.ipynb, section 11.6)

Check your work with ``make test-chapter 11`` (or ``make test-exercise E=11.6``).
"""

from __future__ import annotations

# -- Exercise 11.5: a multi-process engine ------------------------------------------
# (section 11.5)

# -- Exercise 11.6: a streaming API --------------------------------------------------
# (section 11.6)
