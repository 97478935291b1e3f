"""`--backend learner` checks what the learner's functions return before the model uses it.

A learner's operation that passes the probe can still return the wrong thing on
the model's own shapes (float64, a transposed layout, a token id out of range):
the model must stop with a LearnerOutputError naming the learner's function and
what was expected, not fail later in a reshape or an embedding lookup.
"""

from __future__ import annotations

import textwrap

import numpy as np
import pytest

import llmrs_core as llmrs
from llmrs_core.model import LlamaModel
from llmrs_core.testing import write_tiny_llama
from llmrs_core.workbook.learner import LearnerBackend, LearnerOutputError

CH3 = '''
import numpy as np
from llmrs_core.attention import scaled_dot_product_attention as _ref

def scaled_dot_product_attention(q, k, v, causal=True):
    out = _ref(q, k, v, causal)
    return out if q.shape[0] == 3 else out.astype(np.float64)   # right on the probe only
'''
CH4 = '''
import numpy as np

def linear(x, w):
    out = x @ w.T
    return out if x.shape[0] == 3 else out[:, :-1]              # one column short, past the probe

def sample_token(logits, params, rng, history=()):
    return len(logits)                                          # one past the last id
'''


@pytest.fixture
def net(tmp_path):
    for folder, code in (("ch03_attention", CH3), ("ch04_inference_loop", CH4)):
        (tmp_path / "chapters" / folder).mkdir(parents=True)
        (tmp_path / "chapters" / folder / "exercises.py").write_text(textwrap.dedent(code))
    (tmp_path / "solutions").mkdir()
    path = tmp_path / "tiny.gguf"
    write_tiny_llama(path)
    model = llmrs.load(path, backend="numpy")
    backend = LearnerBackend(root=tmp_path)
    assert backend.parts["attention"].source == "yours" and backend.parts["matmul"].source == "yours"
    return LlamaModel(model.source, model.config, backend)


def test_a_wrong_shape_names_the_learners_function(net):
    with pytest.raises(LearnerOutputError, match=r"linear \(Exercise 4.6\): your linear returned float32 of shape "
                       r"\(5, 31\) for inputs \(5, 32\), \(32, 32\); expected float32 of shape \(5, 32\)"):
        net.forward([1, 2, 3, 4, 5])


def test_float64_attention_is_named(net):
    net.backend.matmul = lambda x, w: x @ w.T  # a right linear, so that attention is reached
    with pytest.raises(LearnerOutputError, match=r"your scaled_dot_product_attention returned float64 of shape "
                       r"\(5, 4, 8\)"):
        net.forward([1, 2, 3, 4, 5])


def test_a_token_id_out_of_range_is_named(net):
    sample = net.backend.sampler(llmrs.SamplingParams(temperature=1.0))
    with pytest.raises(LearnerOutputError, match=r"your sample_token returned 8; expected a token id, an int in 0..7"):
        sample(np.zeros(8, dtype=np.float32), [])
