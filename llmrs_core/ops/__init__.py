"""Operations tooling: what runs around the engine, never inside it (chapters 11, 12).

* :mod:`.entrypoint` — the container's entrypoint: check the environment, fail fast, then
  ``llmrs serve`` (``python -m llmrs_core.ops.entrypoint``; chapter 12's Dockerfile);
* :mod:`.observe` — ``make observe``: a real Prometheus scrapes ``llmrs serve`` and agrees
  with its responses (``python -m llmrs_core.ops.observe``);
* :mod:`.profile` — a split model's per-rank timeline under ``mpiexec``
  (``python -m llmrs_core.ops.profile``; ``bench all``'s ``dist`` runs it);
* :mod:`.timeline` — the communicator wrapper that records each operation's time.

The room's rule: the engine (``load()``, ``Engine``, the server app) imports nothing from
here; these import the engine. The ``llmrs`` command itself is :mod:`llmrs_core.cli`.
Nothing is imported here: use the modules.
"""
