"""`--backend learner`: the learner's code where it exists, the reference elsewhere, and a report."""

from __future__ import annotations

import textwrap

import numpy as np
import pytest

import llmrs_core as llmrs
from llmrs_core.model import LlamaModel
from llmrs_core.testing import write_tiny_llama
from llmrs_core.workbook.learner import LearnerBackend

CH3 = '''
import numpy as np
from llmrs_core.attention import scaled_dot_product_attention as _ref

def scaled_dot_product_attention(q, k, v, causal=True):
    return _ref(q, k, v, causal)          # "implemented"

def apply_rope_interleaved(x, positions, theta):
    return x                              # wrong: no rotation
'''
CH4 = '''
def linear(x, w):
    raise NotImplementedError("Exercise 4.6 `linear`: not implemented yet — see ch04_inference_loop.ipynb §4.6")

def rms_norm(x, weight, eps):
    raise ZeroDivisionError("oops")

def sample_token(logits, params, rng, history=()):
    return 3                              # always token 3
'''


@pytest.fixture
def workbook(tmp_path):
    for folder, code in (("ch03_attention", CH3), ("ch04_inference_loop", CH4)):
        (tmp_path / "chapters" / folder).mkdir(parents=True)
        (tmp_path / "chapters" / folder / "exercises.py").write_text(textwrap.dedent(code))
    (tmp_path / "solutions").mkdir()
    return tmp_path


def test_report_says_whose_code_runs(workbook):
    backend = LearnerBackend(root=workbook)
    report = backend.describe()
    parts = backend.parts
    assert parts["attention"].source == "yours" and not parts["attention"].note
    assert parts["rope"].source == "yours" and "differs from the reference" in parts["rope"].note
    assert parts["matmul"].source == "reference" and parts["matmul"].note == "not implemented yet"
    assert parts["rms_norm"].source == "reference" and "ZeroDivisionError" in parts["rms_norm"].note
    assert parts["swiglu"].note == "not in your exercises"
    assert parts["sampler"].source == "yours"
    assert "YOURS" in report and "reference" in report


def test_generation_uses_the_learner_parts(workbook, tmp_path):
    path = tmp_path / "tiny.gguf"
    write_tiny_llama(path)
    model = llmrs.load(path)
    backend = LearnerBackend(root=workbook)
    net = LlamaModel(model.source, model.config, backend)
    ids = [1, 2, 3, 4]
    assert not np.allclose(net.forward(ids), model.logits(ids)), "the learner's (wrong) RoPE must be used"
    sample = backend.sampler(llmrs.SamplingParams())
    assert sample(np.zeros(8, dtype=np.float32), []) == 3, "the learner's sampler must be used"


STUB = 'def {name}(*args, **kwargs):\n    raise NotImplementedError("Exercise {n} `{name}`: not implemented yet")\n'


def test_untouched_stubs_fall_back_to_the_reference(tmp_path):
    for folder, n, names in (
        ("ch03_attention", "3.6", ["scaled_dot_product_attention", "apply_rope_interleaved"]),
        ("ch04_inference_loop", "4.6", ["linear", "rms_norm", "swiglu", "sample_token"]),
    ):
        (tmp_path / "chapters" / folder).mkdir(parents=True)
        code = "\n".join(STUB.format(name=name, n=n) for name in names)
        (tmp_path / "chapters" / folder / "exercises.py").write_text(code)
    (tmp_path / "solutions").mkdir()
    path = tmp_path / "tiny.gguf"
    write_tiny_llama(path)
    reference = llmrs.load(path, backend="numpy")
    backend = LearnerBackend(root=tmp_path)
    assert all(part.source == "reference" for part in backend.parts.values())
    net = LlamaModel(reference.source, reference.config, backend)
    np.testing.assert_array_equal(net.forward([5, 6, 7]), reference.logits([5, 6, 7]))


def test_load_with_the_learner_backend(tmp_path):
    path = tmp_path / "tiny.gguf"
    write_tiny_llama(path)
    model = llmrs.load(path, backend="learner")  # this checkout's exercises, whatever state they are in
    assert model.logits([1, 2]).shape == (2, 64)
    assert "backend 'learner'" in model.backend_report()


def test_learner_backend_needs_the_workbook(tmp_path):
    with pytest.raises(ValueError, match="exercises, which were not found"):
        LearnerBackend(root=tmp_path)
