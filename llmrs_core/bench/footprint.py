"""What an engine holds once it has loaded a model file, and the decode speed the memory bus allows (issue 30).

* :func:`footprint`: each engine measured in a fresh process of its own (a child running this
  module), so that neither sees the other's pages. The child loads the file and evaluates a
  3-token prompt: llama.cpp maps its weights and pages them in at its first evaluation, so both
  figures are taken after the first token. It reports ``VmRSS`` (and its anonymous and
  file-backed parts) in MiB, and the seconds from the call that loads to the first token's logits.
* :func:`decode_bytes` / :func:`roofline`: every decode step reads every weight matrix once (the
  layers' and the output head; an embedding only for its one row), so ``bytes / bandwidth`` is the
  shortest a step can take, and ``tokens/s * bytes / bandwidth`` the fraction of that roof reached.
  The bandwidth is the machine's STREAM triad (:func:`.environment.stream_triad_gb_s`).
"""

from __future__ import annotations

import json
import subprocess
import sys
import time

#: the matrices of a decoder block (``model.LayerWeights``): a fused one stands in place of its parts
MATRIX_FIELDS = ("wq", "wk", "wv", "wo", "w_gate", "w_up", "w_down", "wqkv", "w_gate_up")
ENGINES = ("numba", "llama.cpp")
PROMPT = [1, 2, 3]


def decode_bytes(network) -> int:
    """Bytes of the weights one decode step reads: each layer's matrices and the output head, as
    the backend holds them (``nbytes``: the numba backend's int8 copies on its int8 path)."""
    mats = {id(m): m for layer in network.layers for f in MATRIX_FIELDS if (m := getattr(layer, f)) is not None}
    mats[id(network.output)] = network.output
    return sum(int(m.nbytes) for m in mats.values())


def roofline(network, tg_tokens_per_s: float, stream_gb_s: float) -> dict:
    """``{"bytes_per_token", "stream_gb_s", "roof_tokens_per_s", "fraction"}`` of a decode rate."""
    step = decode_bytes(network)
    roof = stream_gb_s * 1e9 / step
    return {"bytes_per_token": step, "stream_gb_s": stream_gb_s, "roof_tokens_per_s": roof,
            "fraction": tg_tokens_per_s / roof}


def _rss_mib() -> dict:
    fields = {"VmRSS": "rss_mib", "RssAnon": "anon_mib", "RssFile": "file_mib"}
    out = {}
    with open("/proc/self/status") as f:
        for line in f:
            key = line.split(":")[0]
            if key in fields:
                out[fields[key]] = int(line.split()[1]) / 1024
    return out


def _first_token(engine: str, path: str, threads: int) -> object:
    """Load ``path`` on ``engine`` and evaluate :data:`PROMPT` (in the child); returns the loaded
    model, which must stay alive while its memory is measured."""
    if engine == "numba":
        from ..loader import load

        model = load(path, backend="numba", threads=threads)
        model.network.forward(PROMPT, last_only=True)
        return model
    from llama_cpp import Llama

    llm = Llama(model_path=path, n_ctx=64, n_threads=threads, n_threads_batch=threads, verbose=False)
    llm.eval(PROMPT)
    return llm


def measure(engine: str, path: str, threads: int) -> dict:
    """In this process: ``{"rss_mib", "anon_mib", "file_mib", "load_s"}`` after the first token."""
    start = time.perf_counter()
    model = _first_token(engine, path, threads)
    seconds = time.perf_counter() - start
    rss = _rss_mib()
    del model
    return {**rss, "load_s": seconds}


def footprint(path, engine: str, threads: int, timeout: float = 600) -> dict:
    """:func:`measure` in a fresh child process; ``{"error": ...}`` if it failed (e.g. llama.cpp
    not installed), so that a benchmark reports the rest."""
    if engine not in ENGINES:
        raise ValueError(f"unknown engine {engine!r}; known: {', '.join(ENGINES)}")
    proc = subprocess.run([sys.executable, "-m", __name__, engine, str(path), str(threads)],
                          capture_output=True, text=True, timeout=timeout)
    if proc.returncode != 0:
        lines = (proc.stderr.strip() or proc.stdout.strip() or "no output").splitlines()
        return {"error": f"{engine} exited with {proc.returncode}: {lines[-1]}"}
    return json.loads(proc.stdout.strip().splitlines()[-1])


if __name__ == "__main__":
    print(json.dumps(measure(sys.argv[1], sys.argv[2], int(sys.argv[3]))))
