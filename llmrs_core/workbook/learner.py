"""The learner backend: SmolLM2 run with your own exercise code wherever it exists.

``llmrs generate --backend learner`` and ``llmrs.load(backend="learner")``
use this. Each operation comes from the learner's exercises if that
function is implemented (chapters 3 and 4), and from the NumPy reference
otherwise; :meth:`LearnerBackend.describe` says which is which. Every
learner function is first tried on a small probe input and compared with
the reference, so a wrong implementation is reported, not hidden — and it
is still used: seeing its effect on the model's text is part of the lesson.

The engine's state is built from the learner's classes too: :meth:`LearnerBackend.engine_parts`
(:class:`~llmrs_core.engine.parts.EngineParts`, which ``load(backend="learner")`` hands the model
and the engine) gives them, each wrapped in its checks (:mod:`~llmrs_core.workbook.checked`):

* Exercise 5.6's ``ContiguousKVCache`` holds the keys and values of ``model.generate``
  with one prompt (``llmrs generate --impl learner``);
* Exercise 5.7's ``PagedKVCache`` is the block pool of the batching engine (several
  prompts, ``llmrs bench throughput --impl learner``, ``serve``);
* Exercise 7.6's ``Scheduler`` and 7.7's ``RadixCache`` run inside that engine.

A cache class is used where it passes a short run on a tiny config
(:mod:`~llmrs_core.workbook.cache_probe`: every view compared with what was written,
copy-on-write, ``free``); a stub, or one that fails, leaves the engine's own,
and the YOURS table says why ("not implemented yet", "yours raised ..."). Unlike
a wrong operation a broken cache is not used: it could not give any text. What
the learner's caches return is still checked on every step (``workbook.cache_checks``),
so a cache that goes wrong later is named — ``ContiguousKVCache.view(...)
(Exercise 5.6) returned keys of shape ...`` — before attention's kernel sees it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from types import ModuleType
from typing import Any

import numpy as np

from .. import attention, layers, rope
from ..attention import PLAIN
from ..backends.numpy_backend import NumpyBackend
from ..engine.parts import EngineParts
from ..sampling import Sampler, SamplingParams
from .checked import checked_parts

#: where the batching engine's parts run
_BATCHING = "used by the batching engine (generate with several prompts, bench throughput, serve)"


@dataclass
class Part:
    """Who computes one operation, and what the probe found."""

    label: str  # "attention (Exercise 3.6)": what it is, and the exercise it comes from
    source: str  # "yours" or "reference"
    note: str = ""

    @property
    def name(self) -> str:
        """The operation, as the learner knows it: ``"attention"``."""
        return self.label.split(" (Exercise ")[0]

    @property
    def exercise(self) -> str:
        """The exercise it comes from: ``"3.6"``."""
        return self.label.rpartition("(Exercise ")[2].rstrip(")")


def _probe_inputs(seed: int = 0) -> dict[str, tuple]:
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((3, 8)).astype(np.float32)
    q = rng.standard_normal((3, 4, 8)).astype(np.float32)
    kv = rng.standard_normal((5, 2, 8)).astype(np.float32), rng.standard_normal((5, 2, 8)).astype(np.float32)
    return {
        "linear": (x, rng.standard_normal((6, 8)).astype(np.float32)),
        "rms_norm": (x, rng.standard_normal(8).astype(np.float32), 1e-5),
        "swiglu": (x, rng.standard_normal((3, 8)).astype(np.float32)),
        "rope": (q, np.arange(3, 6), 1e5),
        "attention": (q, *kv),
    }


class LearnerOutputError(ValueError):
    """The learner's function returned what the model cannot use; the message names it and what was expected."""


#: the shape each operation returns, from its arguments (float32 throughout, as the model's activations)
_RESULT_SHAPES: dict[str, Callable[..., tuple]] = {
    "matmul": lambda x, w: (x.shape[0], w.shape[0]),
    "rms_norm": lambda x, weight, eps: x.shape,
    "swiglu": lambda gate, up: gate.shape,
    "rope": lambda x, positions, theta: x.shape,
    "attention": lambda q, k, v: q.shape,
}


def _checked(op: str, label: str, name: str, fn: Callable) -> Callable:
    """``fn`` (the learner's) with every result checked before the model uses it: an array of
    the shape the reference gives, float32 — else a :class:`LearnerOutputError` naming ``name``."""
    expected = _RESULT_SHAPES[op]

    def call(*args):
        out = fn(*args)
        want = tuple(expected(*args))
        shape, dtype = getattr(out, "shape", None), getattr(out, "dtype", None)
        if shape is None or tuple(shape) != want or dtype != np.float32:
            got = f"{dtype} of shape {tuple(shape)}" if shape is not None else type(out).__name__
            inputs = ", ".join(str(tuple(a.shape)) for a in args if hasattr(a, "shape"))
            raise LearnerOutputError(
                f"{label}: your {name} returned {got} for inputs {inputs}; expected float32 of shape {want}"
            )
        return out

    return call


class LearnerBackend(NumpyBackend):
    """NumPy backend whose operations are replaced by the learner's where implemented."""

    name = "learner"

    def __init__(self, root: Any = None):
        from . import exercises

        self.parts: dict[str, Part] = {}
        try:
            ch3 = exercises(3, "learner", root=root)
            ch4 = exercises(4, "learner", root=root)
        except FileNotFoundError as e:
            raise ValueError(
                f"the learner backend runs the workbook's exercises, which were not found ({e})"
            ) from None
        probes = _probe_inputs()
        ops: list[tuple[str, str, Callable | None, Callable, tuple]] = [
            ("matmul", "linear (Exercise 4.6)", getattr(ch4, "linear", None), layers.linear, probes["linear"]),
            ("rms_norm", "RMSNorm (Exercise 4.6)", getattr(ch4, "rms_norm", None), layers.rms_norm, probes["rms_norm"]),
            ("swiglu", "SwiGLU (Exercise 4.6)", getattr(ch4, "swiglu", None), layers.swiglu, probes["swiglu"]),
            ("rope", "RoPE (Exercise 3.7)", getattr(ch3, "apply_rope_interleaved", None),
             rope.apply_rope_interleaved, probes["rope"]),
            ("attention", "attention (Exercise 3.6)", getattr(ch3, "scaled_dot_product_attention", None),
             lambda q, k, v: attention.scaled_dot_product_attention(q, k, v, causal=True), probes["attention"]),
        ]
        for op, label, theirs, reference, probe in ops:
            chosen = self._choose(op, label, theirs, reference, probe)
            if chosen is not None:
                setattr(self, op, chosen)
        yours = self.__dict__.get("attention")
        if yours is not None:  # Exercise 3.6 is Llama's attention; a family's options run the reference
            self.attention = lambda q, k, v, options=PLAIN: (
                yours(q, k, v) if options.plain else NumpyBackend.attention(self, q, k, v, options))
        self._learner_sample = self._choose_sampler(getattr(ch4, "sample_token", None))
        self._engine_parts = self._choose_engine_parts(root)

    def _choose(self, op: str, label: str, theirs: Callable | None, reference: Callable, probe: tuple):
        if theirs is None:
            self.parts[op] = Part(label, "reference", "not in your exercises")
            return None
        ran, got = self._try(op, label, lambda: np.asarray(theirs(*probe)))
        if not ran:
            return None
        want = reference(*probe)
        if got.shape != want.shape:
            self.parts[op] = Part(label, "reference", f"yours returned shape {got.shape}, expected {want.shape}")
            return None
        err = float(np.max(np.abs(got - want)))
        note = "" if err < 1e-4 else f"differs from the reference by {err:.3g} on a probe!"
        self.parts[op] = Part(label, "yours", note)
        name = getattr(theirs, "__name__", op)
        if op == "attention":
            return _checked(op, label, name, lambda q, k, v: theirs(q, k, v, True))
        return _checked(op, label, name, theirs)

    def _choose_sampler(self, theirs: Callable | None) -> Callable | None:
        label = "sampling (Exercise 4.7)"
        if theirs is None:
            self.parts["sampler"] = Part(label, "reference", "not in your exercises")
            return None
        ran, _ = self._try("sampler", label, lambda: theirs(
            np.array([0.0, 1.0], dtype=np.float32), SamplingParams(), np.random.default_rng(0), ()))
        if not ran:
            return None
        self.parts["sampler"] = Part(label, "yours")
        return theirs

    def _choose_engine_parts(self, root: Any) -> EngineParts:
        """Chapter 5's caches (5.6, 5.7) and chapter 7's Scheduler (7.6) and RadixCache (7.7), each
        where it is written. A cache class is run once through a short protocol on a tiny config
        (:mod:`~llmrs_core.workbook.cache_probe`): one that fails it is reported and the engine's own
        runs. A scheduler or prefix cache is constructed once on a tiny pool to see; the engine
        checks every schedule and prefix match they give it (``workbook.scheduler_checks``), so a
        wrong one is named when it misbehaves. What the learner's caches return is checked on every
        step too (``workbook.cache_checks``): each class of the learner's comes wrapped in its checks."""
        from .cache_probe import TINY, probe_kv_cache, probe_paged_kv_cache

        own = EngineParts.engines_own()
        ch5, ch7 = self._chapter(5, root), self._chapter(7, root)
        kv_cache = self._choose_class(
            "kv_cache", "KV cache (Exercise 5.6)", ch5, "ContiguousKVCache", own.kv_cache, probe_kv_cache,
            "used by generate with one prompt")
        paged = self._choose_class(
            "paged_kv_cache", "paged KV cache (Exercise 5.7)", ch5, "PagedKVCache", own.paged_kv_cache,
            probe_paged_kv_cache, _BATCHING)
        pool = paged(TINY, num_blocks=4, block_size=4)
        scheduler = self._choose_class(
            "scheduler", "scheduler (Exercise 7.6)", ch7, "Scheduler", own.scheduler,
            lambda cls: cls(pool, 2, 8, "fcfs", None), _BATCHING)
        prefix_cache = self._choose_class(
            "prefix_cache", "prefix cache (Exercise 7.7)", ch7, "RadixCache", own.prefix_cache,
            lambda cls: cls(pool.allocator, 4), _BATCHING)
        chosen = {"scheduler": scheduler, "prefix_cache": prefix_cache, "kv_cache": kv_cache, "paged_kv_cache": paged}
        # with the learner's pool, the engine's own scheduler and prefix cache run checked too: their
        # checks read the pool's tables, and name its reserve when a table is wrong
        checked = {op for op in chosen if self.parts[op].source == "yours"}
        if "paged_kv_cache" in checked:
            checked |= {"scheduler", "prefix_cache"}
        return checked_parts(**{op: chosen[op] for op in checked}, yours=True)

    @staticmethod
    def _chapter(chapter: int, root: Any) -> ModuleType | None:
        from . import exercises

        try:
            return exercises(chapter, "learner", root=root)
        except FileNotFoundError:
            return None

    def _choose_class(self, op: str, label: str, module: ModuleType | None, name: str, reference: type,
                      try_it: Callable[[type], object], used_by: str) -> type:
        """The learner's class ``name`` of ``module`` if ``try_it(theirs)`` succeeds, else ``reference``;
        either way :attr:`parts` says which, and why."""
        theirs = getattr(module, name, None) if module is not None else None
        if theirs is None or theirs is reference:
            self.parts[op] = Part(label, "reference", "not in your exercises")
            return reference
        if not self._try(op, label, lambda: try_it(theirs))[0]:
            return reference
        self.parts[op] = Part(label, "yours", used_by)
        return theirs

    def _try(self, op: str, label: str, attempt: Callable[[], Any]) -> tuple[bool, Any]:
        """``(True, attempt())``; or, where the learner's code raises, ``(False, None)`` with
        :attr:`parts` saying why the reference runs ("not implemented yet" for a stub)."""
        try:
            return True, attempt()
        except NotImplementedError:
            self.parts[op] = Part(label, "reference", "not implemented yet")
        except Exception as e:  # the learner's code may fail in any way; say how, use ours
            self.parts[op] = Part(label, "reference", f"yours raised {type(e).__name__}: {e}")
        return False, None

    def engine_parts(self) -> EngineParts:
        """What ``load(backend="learner")``'s model and engine are built from: the learner's classes
        where they are written and work (wrapped in their checks), the engine's own elsewhere."""
        return self._engine_parts

    def sampler(self, params: SamplingParams) -> Callable[..., int]:
        if self._learner_sample is None:
            return Sampler(params)
        rng = np.random.default_rng(params.seed)
        sample = self._learner_sample

        def checked(logits, history) -> int:
            token = sample(logits, params, rng, history)
            is_int = np.ndim(token) == 0 and np.issubdtype(np.asarray(token).dtype, np.integer)
            if not is_int or not 0 <= int(token) < len(logits):
                raise LearnerOutputError(
                    f"sampling (Exercise 4.7): your sample_token returned {token!r}; expected a token id, "
                    f"an int in 0..{len(logits) - 1}"
                )
            return int(token)

        return checked

    def describe(self) -> str:
        lines = ["backend 'learner' — who computes what:"]
        for part in self.parts.values():
            who = "YOURS    " if part.source == "yours" else "reference"
            lines.append(f"  {who}  {part.label}" + (f"  ({part.note})" if part.note else ""))
        return "\n".join(lines)


__all__ = ["LearnerBackend", "LearnerOutputError"]
