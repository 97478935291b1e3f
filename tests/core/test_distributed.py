"""Tensor and pipeline parallelism on the in-process communicator (threads): fast, no MPI needed.

References: the single-process engine on the same file (its logits and greedy tokens), and
the dequantiser for the shards of quantised weights. Tensor parallelism changes the order of
the o_proj and down sums (each rank adds its band of input features, the all-reduce adds the
bands): two float32 summation orders, bounded by ``float32_tolerance(config)``. Pipeline
parallelism moves the hidden state untouched and runs each layer's arithmetic unchanged, so
its logits are the single-process logits bit for bit.
"""

from __future__ import annotations

import time

import numpy as np
import pytest

import llmrs_core as llmrs
from llmrs_core.distributed import GroupBroken, LocalCommunicator, RankFailed, run_local, sharding
from llmrs_core.distributed.launch import LaunchError, connect
from llmrs_core.distributed.shard import ShardSource, ShardSpec
from llmrs_core.quant.dequant import dequantize
from llmrs_core.quant.ggml_blocks import quantize
from llmrs_core.quant.types import GGMLType
from llmrs_core.testing import float32_tolerance, normalised_error, tiny_llama_config, write_tiny_llama

IDS = [3, 17, 5, 60, 0, 9, 9, 41, 22, 1]


# -- the in-process communicator -------------------------------------------------------------


def test_local_collectives_match_numpy():
    rng = np.random.default_rng(0)
    data = [rng.standard_normal((3, 5)).astype(np.float32) for _ in range(3)]

    def body(comm):
        r = comm.rank
        x = data[r].copy()
        comm.all_reduce(x)
        g = comm.all_gather(data[r])
        b = data[r].copy()
        comm.broadcast(b, root=2)
        if r == 0:
            comm.send(data[0], 1, tag=7)
        got = comm.recv(np.empty((3, 5), np.float32), 0, tag=7) if r == 1 else None
        comm.barrier()
        return x, g, b, got, comm.gather_objects(r * 10)

    out = run_local(3, body)
    for x, g, b, _, objs in out:
        np.testing.assert_allclose(x, data[0] + data[1] + data[2], rtol=1e-6)
        np.testing.assert_array_equal(g, np.stack(data))
        np.testing.assert_array_equal(b, data[2])
        assert objs == [0, 10, 20]
    assert all(np.array_equal(out[0][0], o[0]) for o in out), "every rank gets the same all-reduced bits"
    np.testing.assert_array_equal(out[1][3], data[0])


def test_a_failing_rank_breaks_the_group_instead_of_hanging():
    def body(comm):
        if comm.rank == 1:
            raise RuntimeError("rank 1 broke")
        comm.all_reduce(np.zeros(4, np.float32))  # rank 0 would wait forever without the break

    with pytest.raises(RuntimeError, match="rank 1 broke"):
        run_local(2, body, timeout=30)


def test_a_missing_message_times_out_with_a_clear_error():
    comm = LocalCommunicator.group(2, timeout=0.2)[1]
    with pytest.raises(GroupBroken, match="nothing arrived from rank 0"):
        comm.recv(np.empty(3, np.float32), 0)


# -- sharding -----------------------------------------------------------------------------


@pytest.mark.parametrize("parts", [1, 2, 3])
def test_float_splits_round_trip(parts):
    w = np.arange(6 * 12, dtype=np.float32).reshape(6, 12)
    np.testing.assert_array_equal(np.concatenate([sharding.split_rows(w, parts, r) for r in range(parts)]), w)
    np.testing.assert_array_equal(np.concatenate([sharding.split_cols(w, parts, r) for r in range(parts)], 1), w)
    x = np.random.default_rng(1).standard_normal((4, 12)).astype(np.float32)
    partial = sum(x[:, r * 12 // parts:(r + 1) * 12 // parts] @ sharding.split_cols(w, parts, r).T
                  for r in range(parts))
    np.testing.assert_allclose(partial, x @ w.T, rtol=1e-5, atol=1e-4)


@pytest.mark.parametrize("t", [GGMLType.Q4_1, GGMLType.Q8_0])
def test_block_splits_keep_the_blocks_and_round_trip(t):
    rng = np.random.default_rng(2)
    w = rng.standard_normal((12, 192)).astype(np.float32)
    raw = quantize(w, t).reshape(-1)
    full = dequantize(raw, t, w.shape)
    for lo, hi in [(0, 64), (64, 128), (128, 192)]:
        cols = sharding.block_cols(raw, t, w.shape, lo, hi)
        np.testing.assert_array_equal(dequantize(cols, t, (12, hi - lo)), full[:, lo:hi])
    rows = sharding.block_rows(raw, t, w.shape, 4, 8)
    np.testing.assert_array_equal(dequantize(rows, t, (4, 192)), full[4:8])


def test_a_column_band_that_cuts_a_block_is_refused():
    raw = quantize(np.ones((2, 64), np.float32), GGMLType.Q4_1).reshape(-1)
    with pytest.raises(ValueError, match="whole Q4_1 blocks of 32 weights; columns 16..48 cut a block"):
        sharding.block_cols(raw, GGMLType.Q4_1, (2, 64), 16, 48)


def test_kv_head_assignment_keeps_each_group_together():
    assert sharding.kv_head_assignment(9, 3, 3) == [(range(0, 3), range(0, 1)), (range(3, 6), range(1, 2)),
                                                     (range(6, 9), range(2, 3))]
    for q, kv in sharding.kv_head_assignment(8, 4, 2):
        assert {h // 2 for h in q} == set(kv), "a query head and its KV head on one rank"
    with pytest.raises(ValueError, match="3 KV heads do not split over 2 ranks"):
        sharding.kv_head_assignment(9, 3, 2)


def test_the_vocabulary_splits_into_equal_bands():
    assert [sharding.vocab_range(49152, 3, r) for r in range(3)] == [(0, 16384), (16384, 32768), (32768, 49152)]


def test_smollm2_shapes_allow_tp_1_and_3_only():
    c = tiny_llama_config(vocab_size=49152, hidden_size=576, intermediate_size=1536, n_layers=30, n_heads=9,
                          n_kv_heads=3)
    assert c.head_dim == 64
    assert sharding.valid_tp_sizes(c, block_size=32) == [1, 3]
    with pytest.raises(ValueError, match=r"--tp 2 cannot split.*Tensor-parallel sizes that work: 1, 3"):
        sharding.check_tp(c, 2, block_size=32)


def test_pipeline_stages_cover_the_layers():
    assert [sharding.stage_layers(30, 2, s) for s in range(2)] == [range(0, 15), range(15, 30)]
    assert [len(sharding.stage_layers(30, 4, s)) for s in range(4)] == [7, 8, 7, 8]
    with pytest.raises(ValueError, match="--pp 31 cannot split 30 layers"):
        sharding.stage_layers(30, 31, 0)


def test_a_shard_source_presents_the_rank_s_slices(tmp_path):
    path = tmp_path / "q.gguf"
    write_tiny_llama(path, weight_type="q4_1", hidden_size=128, intermediate_size=128, seed=3)
    whole = llmrs.read_gguf(path)
    part = ShardSource(whole, ShardSpec(tp=2, tp_rank=1))
    c = part.config
    assert (c.n_heads, c.n_kv_heads, c.intermediate_size, c.n_layers) == (2, 1, 64, 2)
    assert part.tensors["blk.0.attn_q.weight"].shape == (64, 128)
    assert part.tensors["blk.0.attn_output.weight"].shape == (128, 64)
    assert part.tensors["token_embd.weight"].shape == (32, 128)
    raw, t = part.blocks("blk.1.ffn_down.weight")
    np.testing.assert_array_equal(dequantize(raw, t, (128, 64)), whole.float32("blk.1.ffn_down.weight")[:, 64:])
    np.testing.assert_array_equal(part.float32("blk.1.attn_k.weight"), whole.float32("blk.1.attn_k.weight")[32:])
    stage = ShardSource(whole, ShardSpec(pp=2, pp_rank=1))
    np.testing.assert_array_equal(stage.float32("blk.0.attn_q.weight"), whole.float32("blk.1.attn_q.weight"))
    assert stage.config.n_layers == 1 and "blk.1.attn_q.weight" not in stage.tensors


# -- the split model against the whole one ------------------------------------------------------


@pytest.fixture(scope="module", params=["f32-tied", "q4_1-untied"])
def tiny(request, tmp_path_factory):
    """A tiny model with 4 query heads and 2 KV heads (TP = 2 divides both)."""
    path = tmp_path_factory.mktemp("dist") / "tiny.gguf"
    if request.param == "f32-tied":
        write_tiny_llama(path, seed=11, n_layers=4)
    else:  # row-parallel bands of 64 columns: whole Q4_1 blocks
        write_tiny_llama(path, seed=11, n_layers=4, weight_type="q4_1", hidden_size=128, intermediate_size=128,
                         tie_embeddings=False)
    return path


def _split(path, backend, tp, pp, fn):
    return run_local(tp * pp, lambda comm: fn(llmrs.load(path, backend=backend, tp=tp, pp=pp, comm=comm)))


@pytest.mark.parametrize("backend", ["numpy", "numba"])
@pytest.mark.parametrize(("tp", "pp"), [(2, 1), (1, 2)], ids=["tp2", "pp2"])
def test_split_logits_and_greedy_tokens_equal_one_process(tiny, backend, tp, pp):
    whole = llmrs.load(tiny, backend=backend)
    want = whole.logits(IDS)
    want_tokens = whole.generate(IDS, max_tokens=12).token_ids
    got = _split(tiny, backend, tp, pp, lambda m: (m.logits(IDS), m.generate(IDS, max_tokens=12).token_ids))
    tol = float32_tolerance(whole.config)
    for rank, (logits, tokens) in enumerate(got):
        assert logits.shape == want.shape
        err = normalised_error(logits, want)
        if pp > 1:
            assert err == 0.0, f"rank {rank}: pipeline stages change no arithmetic, yet the logits differ by {err:.2e}"
        assert err <= tol, f"rank {rank}: logits differ from one process's by {err:.2e} (> {tol:.2e})"
        assert tokens == want_tokens, f"rank {rank}: greedy tokens {tokens} != one process's {want_tokens}"


def test_whole_vocabulary_on_every_rank_gives_the_same_logits(tiny):
    whole = llmrs.load(tiny, backend="numpy").logits(IDS)
    got = run_local(2, lambda comm: llmrs.load(tiny, backend="numpy", tp=2, comm=comm,
                                               vocab_parallel=False).logits(IDS))
    for logits in got:
        assert normalised_error(logits, whole) <= float32_tolerance(llmrs.load(tiny).config)


@pytest.mark.parametrize(("tp", "pp"), [(2, 1), (1, 2)], ids=["tp2", "pp2"])
def test_batched_generation_on_the_split_model(tiny, tp, pp):
    """The continuous-batching engine (paged caches sized by the shard's config) on the split model."""
    prompts = [IDS[:4], IDS[3:9], IDS]
    want = [c.token_ids for c in llmrs.load(tiny, backend="numpy").generate(prompts, max_tokens=6)]
    got = _split(tiny, "numpy", tp, pp, lambda m: [c.token_ids for c in m.generate(prompts, max_tokens=6)])
    assert got == [want, want]


# -- launches that cannot work ------------------------------------------------------------------


def test_an_invalid_tp_size_lists_the_sizes_that_work(tiny):
    with pytest.raises(RankFailed, match=r"every rank failed to load the model: .*--tp 4 cannot split this model: "
                                         r"2 KV heads do not split over 4 ranks.*sizes that work: 1, 2"):
        _split(tiny, "numpy", 4, 1, lambda m: None)


def test_a_rank_that_cannot_load_fails_every_rank(tiny, tmp_path):
    paths = [tiny, tmp_path / "missing.gguf"]
    with pytest.raises(RankFailed, match=r"^rank 1 failed to load the model: FileNotFoundError"):
        run_local(2, lambda comm: llmrs.load(paths[comm.rank], backend="numpy", pp=2, comm=comm))


def test_world_size_must_be_tp_times_pp():
    comm = LocalCommunicator.group(2)[0]
    with pytest.raises(LaunchError, match=r"started 2 processes, but --tp 3 --pp 1 needs 3: run `mpiexec -n 3"):
        connect(3, 1, comm)
    with pytest.raises(LaunchError, match="--tp and --pp together are not supported"):
        connect(2, 2, comm)


def test_tp_without_mpiexec_says_how_to_launch(monkeypatch):
    from llmrs_core.distributed import mpi

    for name in mpi.LAUNCHER_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    with pytest.raises(LaunchError, match=r"need 3 processes started by mpiexec: run `mpiexec -n 3 llmrs generate"):
        connect(3, 1)


def test_a_decode_step_all_reduces_two_vectors_per_layer_and_the_embedding(tiny):
    """Megatron's count: one all-reduce after o_proj and one after down in every layer, one after the
    vocab-parallel embedding: (2 * layers + 1) * hidden * 4 bytes per decoded token."""
    from llmrs_core.ops.timeline import TimedCommunicator, summarise

    def body(comm):
        timed = TimedCommunicator(comm)
        net = llmrs.load(tiny, backend="numpy", tp=2, comm=timed).network
        cache = net.new_cache(len(IDS) + 1)
        net.forward(IDS, cache)
        timed.events.clear()
        start = time.perf_counter()
        net.forward([IDS[0]], cache)
        return summarise(timed.events, [(start, time.perf_counter())]), net.config

    (s, c), _ = run_local(2, body)
    layers = llmrs.load(tiny).config.n_layers
    assert s["all_reduces"] == 2 * layers + 1
    assert s["all_reduce_bytes"] == (2 * layers + 1) * c.hidden_size * 4


@pytest.mark.parametrize("p", [2, 3, 4])
def test_the_ring_all_reduce_equals_the_communicator_s(p):
    from llmrs_core.labs.ring import ring_all_reduce

    def body(comm):
        x = np.random.default_rng(comm.rank).standard_normal((7, 11)).astype(np.float32)
        return ring_all_reduce(comm, x.copy()), comm.all_reduce(x.copy())

    for got, want in run_local(p, body):
        assert normalised_error(got, want) <= float32_tolerance(p)


@pytest.mark.parametrize("pp", [1, 2, 3])
def test_a_micro_batched_pipeline_gives_each_prompt_its_greedy_tokens(tiny, pp):
    """Groups interleaved through the stages (pipelined_greedy) against generate() per prompt."""
    from llmrs_core.backends import get_backend
    from llmrs_core.distributed.launch import shard
    from llmrs_core.distributed.pipeline import pipelined_greedy
    from llmrs_core.model import LlamaModel

    prompts = [IDS[:4], IDS[2:9], IDS]
    whole = llmrs.load(tiny, backend="numpy")
    want = [whole.generate(p, max_tokens=7).token_ids for p in prompts]

    def body(comm):
        part, plan = shard(whole.source, comm, 1, pp, micro_batched=True)
        net = LlamaModel(part, part.config, get_backend("numpy"), plan=plan)
        return pipelined_greedy(net, plan, prompts, 7)

    assert run_local(pp, body) == [want] * pp
