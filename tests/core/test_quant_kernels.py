"""The numba backend on a tiny model stored in each type issue 28 adds (its kernel path per type).

Each type either packs into a form the Numba kernels read, exactly (the decoded weight is the
same float32 product ``d * q`` as the dequantiser's), or is dequantised to float32 at load:

    Q5_0, IQ4_NL, IQ4_XS   "q8" form, blocks of 32: float kernels; an int8 copy for the int8 path
    Q3_K                   "q8" form, blocks of 16 (Q6_K's): float kernels; an int8 copy ("q4h")
    Q5_1, Q5_K, Q2_K       float32 at load (BLAS); an int8 copy of their own ("q8a")
    BF16                   float32 at load: BLAS on both paths

The exact path (``exact=True``) must give the NumPy backend's logits to float32 rounding; the
default int8 path must run, on the int8 kernels where the type has an int8 copy.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

import llmrs_core as llmrs
from llmrs_core.kernels.cpu.activations import ACTIVATION_SCHEME, SCHEME_BLOCK
from llmrs_core.kernels.cpu.int8 import int8_unavailable
from llmrs_core.quant.types import GGMLType
from llmrs_core.testing import float32_tolerance, normalised_error, write_tiny_llama

PATHS = {"Q5_0": ("q8", 32, True), "IQ4_NL": ("q8", 32, True), "IQ4_XS": ("q8", 32, True),
         "Q3_K": ("q8", 16, True), "Q5_1": ("f32", None, True), "Q5_K": ("f32", None, True),
         "Q2_K": ("f32", None, True), "BF16": ("f32", None, False)}

IDS = list(range(1, 20))


@pytest.fixture(scope="module", params=list(PATHS))
def stored(request, tmp_path_factory):
    """(type name, path, NumPy backend's logits [T, V]) of a tiny model whose matrices are in that type."""
    path = tmp_path_factory.mktemp("kernels") / f"{request.param}.gguf"
    write_tiny_llama(path, weight_type=request.param.lower(), hidden_size=256, intermediate_size=512,
                     n_layers=2, n_heads=4, n_kv_heads=2, vocab_size=64)
    reference = llmrs.load(path, backend="numpy")
    return request.param, path, reference.network.forward(IDS), reference.config


def test_exact_path_equals_numpy_to_float32_rounding(stored):
    type_name, path, want, config = stored
    model = llmrs.load(path, backend="numba", exact=True)
    kind, block, _ = PATHS[type_name]
    for w in (model.network.layers[0].wq, model.network.layers[1].w_down, model.network.output):
        assert w.kind == kind, f"{type_name}: packed as {w.kind}, expected {kind}"
        if block is not None:
            assert w.qs.shape[2] == block
    assert normalised_error(model.network.forward(IDS), want) <= float32_tolerance(config)


@pytest.mark.skipif(int8_unavailable() is not None, reason=f"int8 kernels not compiled: {int8_unavailable()}")
def test_int8_path_runs(stored):
    type_name, path, want, config = stored
    model = llmrs.load(path, backend="numba")
    _, _, has_int8 = PATHS[type_name]
    layer = model.network.layers[0]
    assert (layer.wq.int8 is not None) == has_int8 and (layer.w_down.int8 is not None) == has_int8
    got = model.network.forward(IDS)
    if not has_int8:  # the float kernels, row by row (Q3_K) or BLAS: float32 rounding
        assert normalised_error(got, want) <= float32_tolerance(config)
        return
    # Each of the 2 * 7 + 1 chained products rounds its input to 8 bits per block (32 values, or 256
    # for the K-quants' Q8_K): a relative error of at most 2^-8 of the block's largest per element,
    # about 2^-8 / sqrt(3) rms for blocks of 32; through 15 products they add like a random walk,
    # sqrt(15) * 2^-8 / sqrt(3) = 0.009 rms of the logits' scale, and the largest of 64 x 19 logits
    # lies within about 4 sigma of it. A block of 256 has a larger largest value, by about
    # sqrt(2 ln 256) / sqrt(2 ln 32) = 1.27 for Gaussian values. Measured 0.016-0.018 per 32 and
    # 0.020-0.026 per 256 (Q4_K on the same model: 0.020); a wrong code or scale is order 1.
    block = SCHEME_BLOCK[ACTIVATION_SCHEME[GGMLType[type_name]]]
    bound = 4 * math.sqrt(15) * 2**-8 / math.sqrt(3) * math.sqrt(math.log(block) / math.log(32))
    assert normalised_error(got, want) <= bound
    # a different top token only where the reference's two candidates lie within that error
    slack = 2 * bound * np.abs(want).max()
    chosen = want[np.arange(len(IDS)), got.argmax(axis=1)]
    assert np.all(chosen >= want.max(axis=1) - slack)


RELEASED_TYPES = ["Q4_0", "Q4_1", "Q8_0", "Q4_K", "Q6_K"] + [t for t, (_, _, int8) in PATHS.items() if int8]


@pytest.mark.skipif(int8_unavailable() is not None, reason=f"int8 kernels not compiled: {int8_unavailable()}")
@pytest.mark.parametrize("type_name", RELEASED_TYPES)
def test_int8_path_holds_only_the_copy_and_embeds_the_files_rows(type_name, tmp_path):
    """On the int8 path the packed arrays would be a second copy of every matrix: the backend frees
    them, and the embedding's rows are dequantised from the file's bytes, as ggml's get_rows does.
    They must be the very values the packed form's embedding kernels give (the exact path keeps it)."""
    path = tmp_path / f"{type_name}.gguf"
    write_tiny_llama(path, weight_type=type_name.lower(), hidden_size=256, intermediate_size=512,
                     n_layers=1, n_heads=4, n_kv_heads=2, vocab_size=64)
    int8_model, exact = llmrs.load(path, backend="numba"), llmrs.load(path, backend="numba", exact=True)
    net = int8_model.network
    for w in (net.layers[0].wq, net.layers[0].w_down, net.token_embd):
        assert w.released and w.qs.size == 0 and w.nbytes == w.int8.nbytes, f"{type_name}: packed arrays kept"
    ids = np.array([0, 5, 63, 5, 17])
    got = net.backend.embed(net.token_embd, ids)
    want = exact.network.backend.embed(exact.network.token_embd, ids)
    np.testing.assert_array_equal(got, want, err_msg=f"{type_name}: the file's rows differ from the packed form's")


def test_released_pages_read_back_from_the_file(tmp_path):
    """load() drops the file's mapped pages once the backend has its copies; the arrays handed out
    before must still read the file's bytes (a page comes back from the page cache)."""
    from llmrs_core.formats.gguf import read_gguf

    path = tmp_path / "q4_k.gguf"
    write_tiny_llama(path, weight_type="q4_k", hidden_size=256, intermediate_size=512, n_layers=1,
                     n_heads=4, n_kv_heads=2, vocab_size=64)
    with read_gguf(path) as gguf:
        views = {name: gguf.tensor_bytes(name) for name in gguf.tensors}
        copies = {name: v.copy() for name, v in views.items()}
        gguf.release_pages()
        for name, view in views.items():
            np.testing.assert_array_equal(view, copies[name], err_msg=name)
