"""Tiny random-weight models for tests and notebooks (no download needed).

``write_tiny_llama(path, ...)`` writes a GGUF file laid out exactly like a
llama.cpp Llama conversion (tensor names, metadata keys, NumPy-order shapes),
with small sizes and seeded random float32 weights.
"""

from __future__ import annotations

import math
import os
from typing import Any

import numpy as np

from ..formats.gguf import GGUFField, GGUFValueType
from ..formats.gguf_writer import write_gguf

TINY_LLAMA = dict(
    vocab_size=64,
    hidden_size=32,
    intermediate_size=64,
    n_layers=2,
    n_heads=4,
    n_kv_heads=2,
    context_length=128,
    rope_theta=10000.0,
    rms_norm_eps=1e-5,
)


def tiny_llama_tensors(
    hidden_size: int, intermediate_size: int, n_layers: int, n_heads: int, n_kv_heads: int,
    vocab_size: int, tie_embeddings: bool = True, seed: int = 0, **_: Any,
) -> dict[str, np.ndarray]:
    """Random float32 weights with llama.cpp's tensor names and NumPy-order shapes."""
    rng = np.random.default_rng(seed)
    d, hd = hidden_size, hidden_size // n_heads

    def w(*shape: int) -> np.ndarray:
        return (rng.standard_normal(shape) / np.sqrt(shape[-1])).astype(np.float32)

    tensors = {"token_embd.weight": w(vocab_size, d)}
    for i in range(n_layers):
        tensors |= {
            f"blk.{i}.attn_norm.weight": (1 + 0.1 * rng.standard_normal(d)).astype(np.float32),
            f"blk.{i}.attn_q.weight": w(n_heads * hd, d),
            f"blk.{i}.attn_k.weight": w(n_kv_heads * hd, d),
            f"blk.{i}.attn_v.weight": w(n_kv_heads * hd, d),
            f"blk.{i}.attn_output.weight": w(d, n_heads * hd),
            f"blk.{i}.ffn_norm.weight": (1 + 0.1 * rng.standard_normal(d)).astype(np.float32),
            f"blk.{i}.ffn_gate.weight": w(intermediate_size, d),
            f"blk.{i}.ffn_up.weight": w(intermediate_size, d),
            f"blk.{i}.ffn_down.weight": w(d, intermediate_size),
        }
    tensors["output_norm.weight"] = np.ones(d, dtype=np.float32)
    if not tie_embeddings:
        tensors["output.weight"] = w(vocab_size, d)
    return tensors


def tiny_llama_metadata(
    hidden_size: int, intermediate_size: int, n_layers: int, n_heads: int, n_kv_heads: int,
    vocab_size: int, context_length: int, rope_theta: float, rms_norm_eps: float, **_: Any,
) -> dict[str, Any]:
    """GGUF metadata with the keys llama.cpp writes for a Llama model."""
    return {
        "general.architecture": "llama",
        "general.name": "tiny-llama (random weights)",
        "llama.vocab_size": vocab_size,
        "llama.context_length": context_length,
        "llama.embedding_length": hidden_size,
        "llama.feed_forward_length": intermediate_size,
        "llama.block_count": n_layers,
        "llama.attention.head_count": n_heads,
        "llama.attention.head_count_kv": n_kv_heads,
        "llama.rope.dimension_count": hidden_size // n_heads,
        "llama.rope.freq_base": GGUFField(rope_theta, GGUFValueType.FLOAT32),
        "llama.attention.layer_norm_rms_epsilon": GGUFField(rms_norm_eps, GGUFValueType.FLOAT32),
    }


#: the hyper-parameters of a tiny model with :func:`byte_level_tokenizer_metadata`'s tokenizer:
#: 256 byte tokens and an end-of-text token
TINY_TEXT_LLAMA = {**TINY_LLAMA, "vocab_size": 257, "context_length": 512}

#: a small chat template with no special tokens (the tiny model's): ``<role>content`` lines
TINY_CHAT_TEMPLATE = (
    "{% for m in messages %}<{{ m['role'] }}>{{ m['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}<assistant>{% endif %}"
)


def byte_level_tokenizer_metadata() -> dict[str, Any]:
    """A real GGUF tokenizer for a tiny model: one token per byte (GPT-2's byte-to-character
    map), no merges, ``<|endoftext|>`` (id 256) as EOS and :data:`TINY_CHAT_TEMPLATE` — so text
    and chat work on token ids 0..255 (the model needs ``vocab_size=257``, :data:`TINY_TEXT_LLAMA`)."""
    from ..tokenizer.bytes_map import bytes_to_unicode

    chars = bytes_to_unicode()
    return {
        "tokenizer.ggml.model": "gpt2",
        "tokenizer.ggml.tokens": [chars[i] for i in range(256)] + ["<|endoftext|>"],
        "tokenizer.ggml.token_type": [1] * 256 + [3],
        "tokenizer.ggml.merges": [],
        "tokenizer.ggml.eos_token_id": 256,
        "tokenizer.chat_template": TINY_CHAT_TEMPLATE,
    }


def write_tiny_llama(
    path: str | os.PathLike[str],
    *,
    tie_embeddings: bool = True,
    seed: int = 0,
    drop_keys: tuple[str, ...] = (),
    weight_type: str | None = None,
    embedding_type: str | None = None,
    byte_tokenizer: bool = False,
    **overrides: Any,
) -> dict[str, Any]:
    """Write a tiny random Llama GGUF to ``path``; return the hyper-parameters used.

    ``overrides`` change entries of :data:`TINY_LLAMA`; ``drop_keys`` leaves
    metadata keys out (to test errors for missing keys); ``weight_type``
    (``"q4_1"``, ``"q8_0"`` ...) stores the weight matrices in that ggml
    format, as SmolLM2's file does (norms stay float32); ``embedding_type`` stores the token
    embedding in another (SmolLM2's Q4_1 file keeps it in ``"q8_0"``). ``byte_tokenizer``
    adds :func:`byte_level_tokenizer_metadata`'s tokenizer and takes
    :data:`TINY_TEXT_LLAMA`'s sizes as the defaults, so the model reads and writes text.
    """
    params = {**(TINY_TEXT_LLAMA if byte_tokenizer else TINY_LLAMA), **overrides}
    metadata = tiny_llama_metadata(**params)
    if byte_tokenizer:
        metadata |= byte_level_tokenizer_metadata()
    metadata = {k: v for k, v in metadata.items() if k not in drop_keys}
    tensors = tiny_llama_tensors(**params, tie_embeddings=tie_embeddings, seed=seed)
    if weight_type is not None:
        from ..formats.gguf_writer import TensorToWrite
        from ..quant.ggml_blocks import quantize
        from ..quant.types import type_by_name

        def stored(name: str, a: np.ndarray) -> Any:
            if a.ndim != 2:
                return a
            t = type_by_name(embedding_type if name == "token_embd.weight" and embedding_type else weight_type)
            return TensorToWrite(a.shape, t, quantize(a, t).tobytes())

        tensors = {name: stored(name, a) for name, a in tensors.items()}
    write_gguf(path, metadata, tensors)
    return {**params, "tie_embeddings": tie_embeddings}


def backend_with(**ops: Any):
    """A NumPy backend with some operations replaced, e.g. ``backend_with(attention=my_sdpa)``.

    Keys: ``matmul``, ``rms_norm``, ``swiglu``, ``rope``, ``attention``,
    ``embed`` — with the signatures of :class:`~llmrs_core.backends.base.Backend`.
    """
    from ..backends.numpy_backend import NumpyBackend

    unknown = set(ops) - {"matmul", "rms_norm", "swiglu", "rope", "attention", "embed"}
    if unknown:
        raise ValueError(f"unknown backend operations: {sorted(unknown)}")
    backend = NumpyBackend()
    for name, fn in ops.items():
        if name == "attention":  # chapter 3's (q, k, v): a family's options take the reference
            fn = _llama_attention(fn, backend)
        setattr(backend, name, fn)
    backend.name = "numpy+" + "+".join(sorted(ops))
    return backend


def _llama_attention(fn: Any, backend: Any) -> Any:
    """``fn(q, k, v)`` as a backend's ``attention(q, k, v, options)``: used for Llama's attention
    (no options), the reference for a family's window or soft-cap."""
    from ..attention import PLAIN
    from ..backends.numpy_backend import NumpyBackend

    def attention(q: Any, k: Any, v: Any, options: Any = PLAIN) -> Any:
        return fn(q, k, v) if options.plain else NumpyBackend.attention(backend, q, k, v, options)

    return attention


def naive_llama(w: dict, p: dict, ids: list[int]) -> tuple[np.ndarray, list[np.ndarray]]:
    """A Llama forward pass token by token, head by head, pair by pair, in float64.

    Slow and obvious, sharing no code with the engine: the reference the
    tests hold the engine's and the learner's forward passes to. ``w`` maps
    llama.cpp tensor names to arrays, ``p`` holds the hyper-parameters (as
    :data:`TINY_LLAMA`). Returns the logits ``[T, vocab]`` and the residual
    stream ``[T, d]`` after each layer.
    """
    d, n_h, n_kv = p["hidden_size"], p["n_heads"], p["n_kv_heads"]
    hd = d // n_h
    eps, theta = p["rms_norm_eps"], p["rope_theta"]

    def norm(x, g):
        return x / math.sqrt(float(np.mean(x.astype(np.float64) ** 2)) + eps) * g

    def rope(vec, pos):
        out = vec.copy()
        for i in range(hd // 2):
            a = pos * theta ** (-2 * i / hd)
            x0, x1 = vec[2 * i], vec[2 * i + 1]
            out[2 * i], out[2 * i + 1] = x0 * math.cos(a) - x1 * math.sin(a), x0 * math.sin(a) + x1 * math.cos(a)
        return out

    keys: list[list] = [[] for _ in range(p["n_layers"])]
    values = [[] for _ in range(p["n_layers"])]
    logits = []
    hidden: list[list] = [[] for _ in range(p["n_layers"])]
    for pos, tid in enumerate(ids):
        x = w["token_embd.weight"][tid].astype(np.float64)
        for layer in range(p["n_layers"]):
            def g(n: str, layer: int = layer) -> np.ndarray:
                return w[f"blk.{layer}.{n}.weight"].astype(np.float64)

            h = norm(x, g("attn_norm"))
            q = (g("attn_q") @ h).reshape(n_h, hd)
            k = (g("attn_k") @ h).reshape(n_kv, hd)
            v = (g("attn_v") @ h).reshape(n_kv, hd)
            keys[layer].append(np.stack([rope(k[j], pos) for j in range(n_kv)]))
            values[layer].append(v)
            heads = []
            for head in range(n_h):
                kv = head // (n_h // n_kv)
                qh = rope(q[head], pos)
                scores = np.array([qh @ kk[kv] for kk in keys[layer]]) / math.sqrt(hd)
                probs = np.exp(scores - scores.max())
                probs /= probs.sum()
                heads.append(sum(pr * vv[kv] for pr, vv in zip(probs, values[layer])))
            x = x + g("attn_output") @ np.concatenate(heads)
            h = norm(x, g("ffn_norm"))
            gate, up = g("ffn_gate") @ h, g("ffn_up") @ h
            x = x + g("ffn_down") @ (gate / (1 + np.exp(-gate)) * up)
            hidden[layer].append(x.copy())
        x = norm(x, w["output_norm.weight"].astype(np.float64))
        head = w.get("output.weight", w["token_embd.weight"]).astype(np.float64)
        logits.append(head @ x)
    return np.array(logits), [np.array(h) for h in hidden]


def tiny_llama_config(**overrides: Any):
    """The :class:`~llmrs_core.config.ModelConfig` of :func:`write_tiny_llama`'s model."""
    from ..config import ModelConfig

    p = {**TINY_LLAMA, **overrides}
    return ModelConfig(
        vocab_size=p["vocab_size"], hidden_size=p["hidden_size"], intermediate_size=p["intermediate_size"],
        n_layers=p["n_layers"], n_heads=p["n_heads"], n_kv_heads=p["n_kv_heads"],
        head_dim=p["hidden_size"] // p["n_heads"], context_length=p["context_length"],
        rope_theta=p["rope_theta"], rms_norm_eps=p["rms_norm_eps"], tie_embeddings=p.get("tie_embeddings", True),
    )


def first_difference(ours: list, theirs: list, show: Any = str) -> str:
    """Where two token lists part ways, for a test's failure message: position and both pieces."""
    i = next((k for k, (a, b) in enumerate(zip(ours, theirs)) if a != b), min(len(ours), len(theirs)))
    a = show(ours[i]) if i < len(ours) else "<end>"
    b = show(theirs[i]) if i < len(theirs) else "<end>"
    return f"first difference at position {i}: yours {a!r}, reference {b!r}"


class ByteTokenizer:
    """Just enough tokenizer for generation tests on tiny models: one byte per token id.

    Id 0 is the end-of-sequence token; text is UTF-8 bytes (a tiny model needs
    ``vocab_size=256`` for arbitrary text).
    """

    eos_token_id = 0
    stop_token_ids = [0]
    special_tokens: dict = {}

    def encode(self, text: str, allow_special: bool = True) -> list[int]:
        return list(text.encode())

    def encode_prompt(self, text: str, allow_special: bool = False) -> list[int]:
        return list(text.encode())  # no BOS token

    def min_token_count(self, text: str) -> int:
        return len(text.encode())  # one token per byte: exact

    def stream_decoder(self, skip_special: bool = False):
        import codecs

        decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")

        class _Decoder:
            def add(self, token_id: int) -> str:
                return decoder.decode(bytes([token_id]))

            def flush(self) -> str:
                return decoder.decode(b"", final=True)

        return _Decoder()


def longest_cached_prefix(stored: list[tuple[int, ...]], query: list[int], block_size: int) -> int:
    """The naive model of a prefix cache: the longest whole-block prefix of ``query`` that one
    of the ``stored`` sequences starts with, leaving at least the last token of ``query`` out."""
    limit = (len(query) - 1) // block_size * block_size
    best = 0
    for s in stored:
        n = 0
        while n + block_size <= min(len(s), limit) and tuple(s[n : n + block_size]) == tuple(query[n : n + block_size]):
            n += block_size
        best = max(best, n)
    return best


def normalised_error(got: np.ndarray, want: np.ndarray) -> float:
    """``max |got - want| / max |want|``, in float64: how kernels are compared with a reference."""
    got, want = np.asarray(got, dtype=np.float64), np.asarray(want, dtype=np.float64)
    return float(np.abs(got - want).max() / max(np.abs(want).max(), 1e-30))


FLOAT32_ROUNDING = 2.0**-24  # the relative error of one float32 rounding (half an ulp of 1.0)


def float32_tolerance(k: Any, depth: int = 1, safety: float = 10.0) -> float:
    """The :func:`normalised_error` to allow between two float32 computations of the same thing
    that add up K-term sums in different orders (SIMD lanes, blocking, FMA or not, another
    BLAS kernel, threads): ``safety * sqrt(k * depth) * 2**-24``. ``k`` may be a model's
    :class:`~llmrs_core.config.ModelConfig`: then K is its longest sum (the larger of
    hidden and intermediate size) and ``depth`` its number of layers, for logits and hidden states.

    Each float32 addition rounds with a relative error up to 2^-24; the roundings of a K-term
    sum add up like a random walk, so two orders differ by about sqrt(K) · 2^-24 · Σ|terms|
    (and Σ|terms| is a few times max|result| for the data in these tests). A difference that
    goes on through ``depth`` chained steps (the layers of a model, K being its longest sum)
    adds up the same way: sqrt(K · depth) roundings' worth. Measured here, kernels and models
    land at 0.2 to 2 times sqrt(K · depth) · 2^-24 (AVX2, AVX-512 and SSE2-only code alike);
    ``safety`` = 10 leaves room for other data and other CPUs. It is still orders of magnitude
    below what a bug gives: a missing scale, a wrong RoPE pairing or a dropped block of weights
    are errors of order 1, and weights rounded to float16 on the way are about 1e-3.
    """
    from ..config import ModelConfig

    if isinstance(k, ModelConfig):
        k, depth = max(k.hidden_size, k.intermediate_size), k.n_layers
    return safety * math.sqrt(k * depth) * FLOAT32_ROUNDING


def random_q4(rows: int, cols: int, seed: int = 0):
    """A random 4-bit matrix ``w = d * q + m`` packed for the CPU kernels (chapter 8), and the same
    matrix dequantised in float64 ``[rows, cols]``. ``cols`` is a multiple of 32."""
    from ..kernels.cpu.packing import pack_affine_q4

    rng = np.random.default_rng(seed)
    codes = rng.integers(0, 16, (rows, cols), dtype=np.uint8)
    d = rng.uniform(0.005, 0.05, (rows, cols // 32)).astype(np.float32)
    m = rng.uniform(-0.4, 0.0, (rows, cols // 32)).astype(np.float32)
    dense = np.repeat(d, 32, axis=1).astype(np.float64) * codes + np.repeat(m, 32, axis=1)
    return pack_affine_q4(codes, d, m, "random"), dense


def q4_matvec_variants(w: Any, x: np.ndarray) -> list[tuple[str, np.ndarray]]:
    """``(description, W x)`` in float64: the product of a 4-bit matrix ``w`` (a ``"q4"``
    :class:`~llmrs_core.kernels.cpu.packing.PackedMatrix`) with ``x [cols]`` as a kernel with
    each known mistake computes it (chapter 8): nibbles swapped or in pack_int4's order, the
    ``m * sum(x)`` term left out, the output rows in lane-major order, the blocks of ``x`` taken
    16 apart (a block's 16 bytes counted for its 32 values). For :func:`diagnose`.
    """
    from ..kernels.cpu.packing import LANES
    from ..labs.naive import row_major

    qs, d, m = row_major(w)  # [rows, nb, 16] bytes (element j low, j + 16 high), [rows, nb] scales
    lo, hi = (qs & 15).astype(np.float64), (qs >> 4).astype(np.float64)
    xb = np.asarray(x, dtype=np.float64).reshape(-1, 32)  # [nb, 32]
    # block b read from x[16 b:16 b + 32]: windows of 32, 16 apart (in bounds: 16 (nb - 1) + 32 <= 32 nb)
    x16 = np.lib.stride_tricks.sliding_window_view(xb.reshape(-1), 32)[::16][: xb.shape[0]]

    def product(x_lo: np.ndarray, x_hi: np.ndarray, offsets: bool = True) -> np.ndarray:
        s = (lo * x_lo).sum(-1) + (hi * x_hi).sum(-1)  # [rows, nb]
        return (d * s + (m * xb.sum(-1) if offsets else 0.0)).sum(-1)

    right = product(xb[:, :16], xb[:, 16:])
    groups = -(-w.rows // LANES)
    padded = np.zeros(groups * LANES)
    padded[: w.rows] = right
    return [
        ("with the nibbles swapped (the low nibble of byte j times x[32 b + 16 + j], the high one times x[32 b + j])",
         product(xb[:, 16:], xb[:, :16])),
        ("with the nibbles in pack_int4's order (byte j holding elements 2j and 2j + 1, not j and j + 16)",
         product(xb[:, 0::2], xb[:, 1::2])),
        ("without the offsets: d * sum(q x) but no m * sum(x) per block", product(xb[:, :16], xb[:, 16:], False)),
        ("with the rows in the wrong order (output lane * groups + g instead of row 32 g + lane)",
         padded.reshape(groups, LANES).T.reshape(-1)[: w.rows]),
        ("with the blocks of x 16 apart (x[16 b + j] for byte j of block b: a block holds 32 values of x, "
         "so its bytes go with x[32 b + j] and x[32 b + 16 + j])", product(x16[:, :16], x16[:, 16:])),
    ]


def where(index: tuple[int, ...], axes: tuple[str, ...]) -> str:
    """``(3, 1, 7)``, ``("query", "head", "dim")`` -> ``"query 3, head 1, dim 7"``."""
    return ", ".join(f"{a} {i}" for a, i in zip(axes, index))


def diagnose(
    got: Any, want: np.ndarray, variants: Any = (), *, what: str, axes: tuple[str, ...], tol: float
) -> str | None:
    """Why a learner's array is not the reference, in the exercise's terms; None when it is.

    ``got`` matches ``want`` when their :func:`normalised_error` is at most ``tol``
    (take it from :func:`float32_tolerance`). Otherwise, if ``got`` matches one of
    ``variants`` — ``(description, array)`` pairs, the reference computed with a
    known mistake — the message names that mistake: "your attention equals the
    reference computed without the 1/sqrt(D) scale". A variant that equals the
    reference on this input is never named. Else the message gives the largest
    difference and the first index that differs, named by ``axes`` ("query 3,
    head 1, dim 7"), with both values — never whole arrays.
    """
    got = np.asarray(got)
    want = np.asarray(want, dtype=np.float64)
    if got.shape != want.shape:
        return f"{what} has shape {got.shape}; expected {want.shape} ([{', '.join(axes)}])"
    if not np.issubdtype(got.dtype, np.number):
        return f"{what} has dtype {got.dtype}; expected numbers"
    ours = got.astype(np.float64)
    finite = np.isfinite(ours)
    if not finite.all():
        index = tuple(int(i) for i in np.argwhere(~finite)[0])
        return f"{what} has {ours[index]} at {where(index, axes)} (the reference there is {want[index]:.6g})"
    err = normalised_error(ours, want)
    if err <= tol:
        return None
    for description, variant in variants:
        variant = np.asarray(variant, dtype=np.float64)
        if variant.shape == ours.shape and normalised_error(ours, variant) <= tol < normalised_error(variant, want):
            return f"{what} equals the reference computed {description}"
    diff = np.abs(ours - want)
    index = tuple(int(i) for i in np.argwhere(diff > tol * max(np.abs(want).max(), 1e-30))[0])
    return (
        f"{what} differs from the reference by up to {diff.max():.3g} (normalised {err:.2g}, allowed {tol:.2g}); "
        f"first at {where(index, axes)}: yours {ours[index]:.6g}, reference {want[index]:.6g}"
    )


def assert_matches(got: Any, want: np.ndarray, variants: Any = (), *, what: str, axes: tuple[str, ...],
                   tol: float, note: str = "") -> None:
    """:func:`diagnose`, raising ``AssertionError`` with its message (and ``note``) when there is one."""
    message = diagnose(got, want, variants, what=what, axes=axes, tol=tol)
    if message is not None:
        raise AssertionError(message + note)


def plant(func: Any, *edits: tuple[str, str], name: str | None = None, **globals_: Any) -> Any:
    """A copy of ``func`` with a mistake planted: recompiled from its source with each
    ``(old, new)`` edit (``old`` must occur exactly once, so a stale edit fails loudly) and
    some of its globals replaced. ``name``: the function the edited source defines, when an
    edit renames it. For tests that prove a diagnosis: the planted mistake must get its message.
    """
    import inspect
    import textwrap

    source = textwrap.dedent(inspect.getsource(func))
    for old, new in edits:
        if source.count(old) != 1:
            raise AssertionError(f"{func.__name__}: {old!r} is not in its source exactly once; update the edit")
        source = source.replace(old, new)
    namespace = {**func.__globals__, **globals_}
    exec(compile(source, f"<planted mistake in {func.__name__}>", "exec"), namespace)
    return namespace[name or func.__name__]


def with_methods(base: type, **edits: list[tuple[str, str]]) -> type:
    """A subclass of ``base`` whose methods ``name=[(old, new), ...]`` carry :func:`plant`'s edits:
    a learner's class with known mistakes."""
    return type(base.__name__, (base,), {name: plant(getattr(base, name), *e) for name, e in edits.items()})


def chapter_tests(chapter: int, filename: str) -> Any:
    """The test module ``tests/chNN/filename`` of the checkout, loaded under a name of its own, so
    that a diagnosis test can call the chapter's tests with a planted mistake."""
    import importlib.util

    from ..workbook import find_root

    path = find_root() / "tests" / f"ch{chapter:02d}" / filename
    spec = importlib.util.spec_from_file_location(f"diagnosed_{path.stem}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def failure_message(test: Any, *args: Any) -> str:
    """The message with which ``test(*args)`` fails (``AssertionError`` or ``pytest.fail``);
    a test that passes fails the diagnosis test instead."""
    import pytest

    with pytest.raises((AssertionError, pytest.fail.Exception)) as e:
        test(*args)
    return str(e.value)


def solution_with(chapter: int, **planted: Any) -> Any:
    """A copy of ``chapter``'s solution module (its public names in a namespace) with some
    names replaced, e.g. by :func:`plant`'s copies: a learner's module with known mistakes."""
    import types

    from ..workbook import exercises

    sol = exercises(chapter, "solutions")
    copy = types.SimpleNamespace(**{n: getattr(sol, n) for n in sol.__all__})
    for n, f in planted.items():
        if not hasattr(copy, n):
            raise AttributeError(f"chapter {chapter}'s solutions have no {n}")
        setattr(copy, n, f)
    return copy
