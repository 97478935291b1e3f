"""`--backend learner` plugs chapter 7's Scheduler (7.6) and RadixCache (7.7) into the batching engine.

Where a learner's class is written, an :class:`~llmrs_core.engine.Engine` built from the learner
backend's ``engine_parts()`` uses it, wrapped in its checks, and ``describe`` says YOURS; where it
is a stub, the engine's own runs. A learner's class that misbehaves is named by those checks
(``workbook.scheduler_checks``), not by a compiled kernel.
"""

from __future__ import annotations

import sys
import textwrap

import pytest

import llmrs_core as llmrs
from llmrs_core.engine import Engine, RadixCache, Scheduler
from llmrs_core.model import LlamaModel
from llmrs_core.testing import ByteTokenizer, write_tiny_llama
from llmrs_core.workbook.learner import LearnerBackend
from llmrs_core.workbook.scheduler_checks import SchedulerProtocolError

WRITTEN = '''
from llmrs_core.engine import RadixCache as _RadixCache, Scheduler as _Scheduler

CALLS = {"schedule": 0, "match": 0}

class Scheduler(_Scheduler):            # the learner's, here the engine's code counting its calls
    def schedule(self):
        CALLS["schedule"] += 1
        return super().schedule()

class RadixCache(_RadixCache):
    def match_prefix(self, tokens, count=True):
        CALLS["match"] += 1
        return super().match_prefix(tokens, count)
'''
STUBS = '''
class Scheduler:
    def __init__(self, cache, max_num_seqs=16, max_num_batched_tokens=512, policy="fcfs", prefix_cache=None):
        raise NotImplementedError("Exercise 7.6 `Scheduler.__init__`: not implemented yet — see ch07_batching.ipynb §7.6")

class RadixCache:
    def __init__(self, allocator, block_size):
        raise NotImplementedError("Exercise 7.7 `RadixCache.__init__`: not implemented yet — see ch07_batching.ipynb §7.7")
'''
SKIPS_A_REQUEST = WRITTEN + '''
class Scheduler(_Scheduler):
    def schedule(self):
        return super().schedule()[1:]   # leaves one admitted request out of the step
'''


def learner_net(tmp_path, ch07: str):
    for name, code in (("ch03_attention", ""), ("ch04_inference_loop", ""), ("ch07_batching", ch07)):
        (tmp_path / "chapters" / name).mkdir(parents=True, exist_ok=True)
        (tmp_path / "chapters" / name / "exercises.py").write_text(textwrap.dedent(code))
    (tmp_path / "solutions").mkdir(exist_ok=True)
    path = tmp_path / "tiny.gguf"
    write_tiny_llama(path)
    model = llmrs.load(path, backend="numpy")
    backend = LearnerBackend(root=tmp_path)
    return LlamaModel(model.source, model.config, backend), backend


def test_written_classes_run_inside_the_engine(tmp_path):
    net, backend = learner_net(tmp_path, WRITTEN)
    assert backend.parts["scheduler"].source == "yours", backend.describe()
    assert backend.parts["prefix_cache"].source == "yours", backend.describe()
    assert "YOURS      scheduler (Exercise 7.6)" in backend.describe()
    engine = Engine(net, ByteTokenizer(), num_blocks=32, block_size=4, parts=backend.engine_parts())
    sched_cls, cache_cls = type(engine.scheduler.inner), type(engine.prefix_cache.inner)  # theirs, in its checks
    assert sched_cls.__module__ == cache_cls.__module__ == "llmrs_exercises_ch07"
    outs = engine.generate([[1, 2, 3, 4, 5], [1, 2, 3, 4, 6]], max_tokens=3)
    assert all(len(c.token_ids) >= 1 for c in outs)
    calls = sys.modules[sched_cls.__module__].CALLS
    assert calls["schedule"] > 0, "the engine never called the learner's Scheduler.schedule"
    assert calls["match"] > 0, "the engine never called the learner's RadixCache.match_prefix"


def test_stubs_leave_the_engines_own_classes(tmp_path):
    net, backend = learner_net(tmp_path, STUBS)
    assert backend.parts["scheduler"].source == "reference"
    assert backend.parts["scheduler"].note == "not implemented yet"
    parts = backend.engine_parts()
    assert (parts.scheduler, parts.prefix_cache) == (Scheduler, RadixCache)
    engine = Engine(net, ByteTokenizer(), num_blocks=32, block_size=4, parts=parts)
    assert type(engine.scheduler) is Scheduler


def test_a_misbehaving_learner_scheduler_is_named_by_the_engine(tmp_path):
    net, backend = learner_net(tmp_path, SKIPS_A_REQUEST)
    engine = Engine(net, ByteTokenizer(), num_blocks=32, block_size=4, parts=backend.engine_parts())
    with pytest.raises(SchedulerProtocolError, match=r"^Scheduler\.schedule \(from "):
        engine.generate([[1, 2, 3], [4, 5, 6]], max_tokens=2)
