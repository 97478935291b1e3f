"""The engine's seams: the KVCache and WeightSource interfaces, the backend's step, one sampler.

Each seam is tested by plugging in an implementation the engine has never
seen (an in-memory weight source, a recording array module, a recording
backend): if the engine probed for concrete types, these would fail.
"""

from __future__ import annotations

import ast
import textwrap
import types
from pathlib import Path

import numpy as np
import pytest

import llmrs_core as llmrs
from llmrs_core.backends.numpy_backend import NumpyBackend
from llmrs_core.engine import Engine
from llmrs_core.formats.source import WeightSource
from llmrs_core.kv_cache import (
    ContiguousKVCache,
    KVCache,
    PagedKVCache,
    SinkCache,
    SlidingWindowCache,
)
from llmrs_core.model import LlamaModel
from llmrs_core.testing import normalised_error, write_tiny_llama
from llmrs_core.workbook.learner import LearnerBackend

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    path = tmp_path_factory.mktemp("seams") / "tiny.gguf"
    write_tiny_llama(path, seed=3, weight_type="q4_1")
    return llmrs.load(path, backend="numpy")


class InMemoryWeights(WeightSource):
    """A weight source the engine has never seen: float32 arrays in a dict."""

    def __init__(self, arrays: dict[str, np.ndarray], config, rope_layout="interleaved"):
        self.path = Path("<memory>")
        self.metadata = {"general.name": "in-memory"}
        self._arrays = arrays
        self._config = config
        self.rope_layout = rope_layout
        self.file_size = sum(a.nbytes for a in arrays.values())
        self.tensors = {
            name: types.SimpleNamespace(shape=a.shape, type_name="F32", n_bytes=a.nbytes, n_elements=a.size)
            for name, a in arrays.items()
        }

    @property
    def config(self):
        return self._config

    def float32(self, name):
        return self._arrays[name]

    def tokenizer(self):
        return None


@pytest.mark.parametrize("backend", ["numpy", "numba"])
def test_any_weight_source_loads_on_every_backend(tiny, backend):
    arrays = {name: tiny.source.float32(name) for name in tiny.source.tensors}
    source = InMemoryWeights(arrays, tiny.config)
    model = llmrs.Model(source, backend=backend)
    ids = [1, 7, 3, 9, 2]
    # the Q4_1 weights dequantised exactly: only float32 summation order differs
    assert normalised_error(model.logits(ids), tiny.logits(ids)) < 1e-5
    assert model.generate(ids, max_tokens=3).token_ids == tiny.generate(ids, max_tokens=3).token_ids


def test_the_sources_and_caches_declare_their_interfaces(tiny):
    from llmrs_core.formats.gguf import GGUFFile
    from llmrs_core.formats.hf import HFWeights

    assert issubclass(GGUFFile, WeightSource) and issubclass(HFWeights, WeightSource)
    cfg = tiny.config
    for cache in (ContiguousKVCache(cfg, 4), PagedKVCache(cfg, 2, 4).sequence("a"),
                  SlidingWindowCache(cfg, 4), SinkCache(cfg, 1, 4)):
        assert isinstance(cache, KVCache), type(cache).__name__
    assert SinkCache.stores_unrotated_keys and not ContiguousKVCache.stores_unrotated_keys


def test_the_backend_learns_the_rope_layout_when_it_prepares():
    class Source(InMemoryWeights):
        pass

    backend = NumpyBackend()
    with pytest.raises(ValueError, match="unknown RoPE layout 'sideways'"):
        backend.prepare(Source({}, None, rope_layout="sideways"))
    backend.prepare(Source({}, None, rope_layout="half"))
    assert backend.rope_layout == "half"


class RecordingArrays(types.ModuleType):
    """An array module that is NumPy but records what was allocated in it."""

    def __init__(self):
        super().__init__("recording_numpy")
        self.allocations = []

    def zeros(self, shape, dtype=np.float32):
        self.allocations.append(tuple(shape))
        return np.zeros(shape, dtype)

    def __getattr__(self, name):
        return getattr(np, name)


class RecordingBackend(NumpyBackend):
    """The NumPy backend, recording the order of calls the model makes."""

    def __init__(self):
        self.xp = RecordingArrays()
        self.calls = []

    def begin_step(self, n_tokens, sizes=()):
        self.calls.append(("begin_step", n_tokens))

    def matmul(self, x, w):
        self.calls.append(("matmul", x.shape[0]))
        return super().matmul(x, w)


def test_caches_live_in_the_backends_array_module_and_steps_are_announced(tiny):
    backend = RecordingBackend()
    net = LlamaModel(tiny.source, tiny.config, backend)
    cache = net.new_cache(8)
    layers, hkv, d = tiny.config.n_layers, tiny.config.n_kv_heads, tiny.config.head_dim
    assert backend.xp.allocations == [(layers, hkv, 8, d)] * 2, "K and V of the contiguous cache"
    net.forward([1, 2, 3], cache)
    net.forward([4], cache)
    steps = [(i, c) for i, c in enumerate(backend.calls) if c[0] == "begin_step"]
    assert [c for _, c in steps] == [("begin_step", 3), ("begin_step", 1)]
    assert steps[0][0] == 0, "begin_step comes before the step's first product"
    backend.xp.allocations.clear()
    engine = Engine(net, None, num_blocks=6, block_size=4)
    assert backend.xp.allocations == [(layers, 6, hkv, 4, d)] * 2, "the engine's block pool"
    engine.generate([[1, 2, 3], [4, 5]], max_tokens=2)
    sizes = [c[1] for c in backend.calls if c[0] == "begin_step"][2:]
    assert sizes[0] == 5, "both prompts in one step"


LEARNER_CH4 = '''
def sample_token(logits, params, rng, history=()):
    return 3                              # the learner's sampler: always token 3
'''


def test_a_batch_samples_with_the_backends_sampler(tiny, tmp_path):
    """With --backend learner, the learner's sampler runs for a list of prompts too."""
    for folder, code in (("ch03_attention", ""), ("ch04_inference_loop", LEARNER_CH4)):
        (tmp_path / "chapters" / folder).mkdir(parents=True)
        (tmp_path / "chapters" / folder / "exercises.py").write_text(textwrap.dedent(code))
    backend = LearnerBackend(root=tmp_path)
    assert backend.parts["sampler"].source == "yours"
    net = LlamaModel(tiny.source, tiny.config, backend)
    outs = Engine(net, None, num_blocks=8, block_size=4).generate([[1, 2], [5, 6, 7]], max_tokens=4)
    assert [o.token_ids for o in outs] == [[3, 3, 3, 3]] * 2, "the engine must use backend.sampler"


def test_a_list_of_prompts_streams_through_on_text(byte_model):
    pieces: dict[int, list[str]] = {0: [], 1: []}
    outs = byte_model.generate([[65, 66], [67]], max_tokens=5, temperature=0.0,
                               on_text=lambda i, text: pieces[i].append(text))
    for i, out in enumerate(outs):
        assert "".join(pieces[i]) == out.text, f"prompt {i}: the streamed text is the final text"


@pytest.fixture(scope="module")
def byte_model(tmp_path_factory):
    """A tiny model whose GGUF carries a one-byte-per-token tokenizer."""
    from llmrs_core.testing import ByteTokenizer

    path = tmp_path_factory.mktemp("bytes") / "bytes.gguf"
    write_tiny_llama(path, vocab_size=256)
    model = llmrs.load(path, backend="numpy")
    model.__dict__["_tokenizer"] = ByteTokenizer()  # the tiny file has no tokenizer metadata
    return model


def test_a_model_without_a_tokenizer_loads_and_runs_on_token_ids(tiny):
    assert tiny.source.tokenizer() is None
    assert tiny.logits([1, 2]).shape == (2, tiny.config.vocab_size)
    out = tiny.generate([1, 2], max_tokens=3)
    assert len(out.token_ids) == 3 and out.text == "" and out.finish_reason == "length"
    assert len(tiny.generate([[1, 2], [3]], max_tokens=2)) == 2
    with pytest.raises(ValueError, match="no tokenizer.*give token ids"):
        tiny.generate("text needs a tokenizer", max_tokens=2)


def _probes(path: Path, functions: set[str] | None = None) -> list[str]:
    """Calls of hasattr/getattr/isinstance in a module (or in the named functions of it)."""
    tree = ast.parse(path.read_text())
    scopes = [tree] if functions is None else [
        n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef) and n.name in functions
    ]
    found = []
    for scope in scopes:
        for node in ast.walk(scope):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and \
                    node.func.id in ("hasattr", "getattr", "isinstance"):
                found.append(f"{path.name}:{node.lineno} {node.func.id}")
    return found


def test_no_probes_of_caches_or_weight_sources():
    core = ROOT / "llmrs_core"
    found = _probes(core / "model.py") + _probes(core / "backends" / "numba_backend.py") \
        + _probes(core / "backends" / "numpy_backend.py") + _probes(core / "quant" / "dequant.py") \
        + _probes(core / "loader.py", {"__init__", "load", "network", "_tokenizer", "tokenizer"})
    assert not found, f"the seams are declared interfaces; these probe instead: {found}"
