"""`--impl learner` runs chapter 5's caches: 5.6 in ``model.generate``, 5.7 as the batching engine's pool.

The learner backend's ``engine_parts()`` (``Model.parts`` on ``load(backend="learner")``) builds
the model's and the engine's state: the learner's ``ContiguousKVCache`` and ``PagedKVCache``,
wrapped in their checks, where they are written (and pass a short run on a tiny config,
``workbook.cache_probe``), the engine's own otherwise, with the reason in the YOURS
table. "Written" below is the solution's code (``solutions/ch05_kv_cache.py``
re-exports the engine's classes) planted as the learner's, as subclasses that
count their calls, so that the test sees it is theirs that runs. Each planted
mistake is a copy of it with one likely learner mistake; it must be named by
the checks (``workbook.cache_checks``), not by a crash inside attention.
"""

from __future__ import annotations

import sys
import textwrap

import pytest

import llmrs_core as llmrs
from llmrs_core.engine import Engine
from llmrs_core.engine.parts import EngineParts
from llmrs_core.generate import generate_ids
from llmrs_core.model import LlamaModel
from llmrs_core.testing import ByteTokenizer, write_tiny_llama
from llmrs_core.workbook import committed_source, exercises, exercises_path
from llmrs_core.workbook.cache_checks import CacheProtocolError
from llmrs_core.workbook.checked import CheckedKVCache
from llmrs_core.workbook.learner import LearnerBackend
from llmrs_core.workbook.scheduler_checks import SchedulerProtocolError

WRITTEN = '''
from llmrs_core.kv_cache import ContiguousKVCache as _Contiguous, PagedKVCache as _Paged
from llmrs_core.kv_cache import CacheFullError, OutOfBlocksError

CALLS = {"view": 0, "gather": 0}

class ContiguousKVCache(_Contiguous):     # the learner's: here the solution's code, counting its calls
    def view(self, layer, n_new):
        CALLS["view"] += 1
        return super().view(layer, n_new)

class PagedKVCache(_Paged):
    def gather(self, layer, seq, n_new=0):
        CALLS["gather"] += 1
        return super().gather(layer, seq, n_new)
'''

#: one likely mistake each, planted in a copy of the solution: (code added to WRITTEN, what the message says)
MISTAKES = {
    "view forgets n_new": ('''
class ContiguousKVCache(ContiguousKVCache):
    def view(self, layer, n_new):
        return super().view(layer, 0)           # positions 0 .. length - 1: the new tokens left out
''', "kv_cache", "ContiguousKVCache.view(layer 0, n_new=3) (Exercise 5.6) returned keys of shape (0, 2, 4) "
     "(float32); expected floats [3, 2, 4] (length 0 + n_new 3) — the 3 token(s) just written are missing"),
    "view one position short": ('''
class ContiguousKVCache(ContiguousKVCache):
    def view(self, layer, n_new):
        return super().view(layer, n_new - 1)   # off by one: end = length + n_new - 1
''', "kv_cache", "returned keys of shape (2, 2, 4) (float32); expected floats [3, 2, 4] (length 0 + n_new 3) — "
     "one position short: off by one"),
    "advance one too far": ('''
class ContiguousKVCache(ContiguousKVCache):
    def advance(self, n_new):
        self.length += n_new + 1
''', "kv_cache", "after ContiguousKVCache.advance(3) (Exercise 5.6) length is 4; expected 0 + 3 = 3"),
    "gather forgets n_new": ('''
class PagedKVCache(PagedKVCache):
    def gather(self, layer, seq, n_new=0):
        return super().gather(layer, seq, 0)
''', "paged_kv_cache", "PagedKVCache.gather(layer 0, n_new=3) (through PagedSequence.view; Exercise 5.7) returned "
     "keys of shape (0, 2, 4)"),
    "reserve one block short": ('''
class PagedKVCache(PagedKVCache):
    def reserve(self, seq, n):
        super().reserve(seq, max(n - 1, 0))     # a token short: misses the block boundary
''', "paged_kv_cache", "after PagedKVCache.reserve('a', 3) (Exercise 5.7) the block table holds 1 block(s); "
     "0 + 3 tokens in blocks of 2 take 2"),
    "reserve never copies on write": ('''
class PagedKVCache(PagedKVCache):
    def reserve(self, seq, n):                  # new blocks on boundaries, but no copy-on-write
        table = self.tables[seq]
        need = -(-(self.lengths[seq] + n) // self.block_size) - len(table)
        if need > self.allocator.num_free:
            raise OutOfBlocksError(need, self.allocator.num_free)
        for _ in range(need):
            table.append(self.allocator.allocate())
''', "paged_kv_cache", "after PagedKVCache.reserve('b', 1) (Exercise 5.7) the new tokens go to block(s) [2], "
     "shared with another sequence"),
}

PROMPTS = [[1, 2, 3, 4, 5, 6], [1, 2, 3, 4, 5, 7], [9, 8, 7], [5]]


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    path = tmp_path_factory.mktemp("tiny") / "tiny.gguf"
    write_tiny_llama(path)
    return llmrs.load(path, backend="numpy")


def learner(tmp_path, reference, ch05: str) -> tuple[LlamaModel, LearnerBackend]:
    """The tiny model on a learner backend whose chapter 5 is ``ch05`` (chapters 3-4 empty: the reference)."""
    for name, code in (("ch03_attention", ""), ("ch04_inference_loop", ""), ("ch05_kv_cache", ch05)):
        (tmp_path / "chapters" / name).mkdir(parents=True, exist_ok=True)
        (tmp_path / "chapters" / name / "exercises.py").write_text(textwrap.dedent(code))
    (tmp_path / "solutions").mkdir(exist_ok=True)
    backend = LearnerBackend(root=tmp_path)
    return LlamaModel(reference.source, reference.config, backend, kv_cache=backend.engine_parts().kv_cache), backend


def greedy(net: LlamaModel, prompt: list[int]) -> list[int]:
    return generate_ids(net, None, prompt, max_tokens=8).token_ids


def batch(net: LlamaModel, parts: EngineParts | None = None) -> tuple[Engine, list[list[int]]]:
    engine = Engine(net, ByteTokenizer(), num_blocks=32, block_size=4, parts=parts)
    return engine, [c.token_ids for c in engine.generate(PROMPTS, max_tokens=6)]


def test_written_caches_run_inside_generate_and_the_engine(tmp_path, reference):
    net, backend = learner(tmp_path, reference, WRITTEN)
    report = backend.describe()
    assert "YOURS      KV cache (Exercise 5.6)  (used by generate with one prompt)" in report, report
    assert "YOURS      paged KV cache (Exercise 5.7)" in report, report
    parts, calls = backend.engine_parts(), sys.modules["llmrs_exercises_ch05"].CALLS

    assert type(net.new_cache(4).inner).__module__ == "llmrs_exercises_ch05"  # theirs, in its checks
    for prompt in PROMPTS:
        assert greedy(net, prompt) == greedy(reference.network, prompt), f"generate after {prompt}"
    assert calls["view"] > 0, "model.generate never called the learner's ContiguousKVCache.view"

    engine, outs = batch(net, parts)
    assert type(engine.cache.inner).__module__ == "llmrs_exercises_ch05"
    assert outs == batch(reference.network)[1], "the batch on the learner's pool differs from the engine's own"
    assert calls["gather"] > 0, "the engine never called the learner's PagedKVCache.gather"


def test_stubs_leave_the_engines_own_caches(tmp_path, reference):
    stubs = committed_source(exercises_path(5))  # chapter 5's exercises.py as committed: the stubs
    net, backend = learner(tmp_path, reference, stubs)
    for op, label in (("kv_cache", "KV cache (Exercise 5.6)"), ("paged_kv_cache", "paged KV cache (Exercise 5.7)")):
        assert backend.parts[op].source == "reference" and backend.parts[op].note == "not implemented yet"
        assert f"reference  {label}  (not implemented yet)" in backend.describe()
    assert backend.engine_parts() == EngineParts.engines_own()
    assert greedy(net, PROMPTS[0]) == greedy(reference.network, PROMPTS[0])
    assert batch(net, backend.engine_parts())[1] == batch(reference.network)[1]


@pytest.mark.parametrize("mistake", list(MISTAKES))
def test_a_wrong_cache_is_named_and_the_engines_own_runs(tmp_path, reference, mistake):
    code, op, message = MISTAKES[mistake]
    net, backend = learner(tmp_path, reference, WRITTEN + code)
    part = backend.parts[op]
    assert part.source == "reference", f"{mistake}: the broken cache was used\n{backend.describe()}"
    assert part.note.startswith("yours raised CacheProtocolError: "), part.note
    assert message in part.note, f"{mistake}:\n{part.note}"
    assert greedy(net, PROMPTS[0]) == greedy(reference.network, PROMPTS[0])
    assert batch(net, backend.engine_parts())[1] == batch(reference.network)[1]


@pytest.mark.parametrize("backend_name", ["numpy", "numba"])
def test_a_view_that_forgets_n_new_is_named_before_attention(tmp_path, reference, backend_name):
    """The issue's case: the learner's own class in the model, in its checks (as chapter 5's tests run
    it). Decoding after a prompt, its view has ``length`` keys: the shape is plausible, but the new
    token's own key is missing. It must be a CacheProtocolError, on the Numba backend too."""
    if backend_name == "numba":
        pytest.importorskip("numba")
    learner(tmp_path, reference, WRITTEN + MISTAKES["view forgets n_new"][0])
    theirs = exercises(5, "learner", root=tmp_path).ContiguousKVCache
    net = llmrs.load(reference.source.path, backend=backend_name).network
    cache = CheckedKVCache(theirs(net.config, 8), yours=True)
    with pytest.raises(CacheProtocolError) as e:
        net.forward([1, 2, 3], cache)
    assert "ContiguousKVCache.view(layer 0, n_new=3) (Exercise 5.6) returned keys of shape (0, 2, 8)" in str(e.value)


def test_a_view_one_short_in_decode_is_named(tmp_path, reference):
    """Right for the prompt, one key short once something is cached: the old range check let it through."""
    short = WRITTEN + '''
class ContiguousKVCache(ContiguousKVCache):
    def view(self, layer, n_new):
        return super().view(layer, n_new - 1 if self.length else n_new)
'''
    learner(tmp_path, reference, short)
    theirs = exercises(5, "learner", root=tmp_path).ContiguousKVCache
    net = reference.network
    cache = CheckedKVCache(theirs(net.config, 8), yours=True)
    net.forward([1, 2, 3], cache)
    with pytest.raises(CacheProtocolError, match=r"expected floats \[4, 2, 8\] \(length 3 \+ n_new 1\) — "):
        net.forward([4], cache)


def test_a_partly_written_cache_is_not_implemented_yet(tmp_path, reference):
    """``__init__`` written, ``view`` still the stub: the engine's own runs, and the table says why."""
    partly = WRITTEN + '''
class ContiguousKVCache(ContiguousKVCache):
    def view(self, layer, n_new):
        raise NotImplementedError(
            "Exercise 5.6 `ContiguousKVCache.view`: not implemented yet — see ch05_kv_cache.ipynb §5.6")
'''
    net, backend = learner(tmp_path, reference, partly)
    assert backend.parts["kv_cache"].note == "not implemented yet", backend.describe()
    assert backend.parts["paged_kv_cache"].source == "yours"
    assert greedy(net, PROMPTS[0]) == greedy(reference.network, PROMPTS[0])


def test_a_pool_mistake_the_probe_misses_is_named_by_the_engine(tmp_path, reference):
    """A reserve wrong only for 4 or more tokens passes the probe (which reserves 1 to 3, and 11 that
    cannot fit); in the engine, the schedule's check names the learner's reserve as a suspect."""
    late = WRITTEN + '''
class PagedKVCache(PagedKVCache):
    def reserve(self, seq, n):
        super().reserve(seq, n - 1 if n >= 4 else n)
'''
    net, backend = learner(tmp_path, reference, late)
    assert backend.parts["paged_kv_cache"].source == "yours", backend.describe()
    engine = Engine(net, ByteTokenizer(), num_blocks=32, block_size=4, parts=backend.engine_parts())
    with pytest.raises(SchedulerProtocolError, match=r"take 2 — reserve them first \(cache\.reserve\); or "
                                                     r"PagedKVCache\.reserve \(Exercise 5\.7\), your pool's, took too few"):
        engine.generate([[1, 2, 3, 4, 5]], max_tokens=2)
