"""Exercise 11.5 — a multi-process engine: column- and row-parallel splits, and a tensor-parallel block.

The learner's code runs on the in-process communicator (threads, one per rank). References:
NumPy slicing for the splits, and ``llmrs_core.testing.naive_llama`` (a float64 token-by-token
loop sharing no code with the engine) for the block's output. Two float32 computations of the
block that add its sums in different orders (the all-reduce adds per-rank partial sums) agree to
``float32_tolerance(K)``, K the longest sum; the float64 reference is closer still.
"""

from __future__ import annotations

import numpy as np
import pytest

from llmrs_core.distributed import GroupBroken, LocalCommunicator, run_local
from llmrs_core.testing import (
    TINY_LLAMA,
    float32_tolerance,
    naive_llama,
    normalised_error,
    tiny_llama_config,
    tiny_llama_tensors,
)

P = {**TINY_LLAMA, "n_layers": 1}  # 4 query heads, 2 KV heads: TP = 2 keeps one KV head per rank
CONFIG = tiny_llama_config(**P)
IDS = [3, 17, 5, 60, 0, 9, 41]
NAMES = {"attn_norm": "attn_norm", "wq": "attn_q", "wk": "attn_k", "wv": "attn_v", "wo": "attn_output",
         "ffn_norm": "ffn_norm", "w_gate": "ffn_gate", "w_up": "ffn_up", "w_down": "ffn_down"}
TOL = float32_tolerance(max(CONFIG.hidden_size, CONFIG.intermediate_size))
TIMEOUT = 20.0  # seconds a rank waits in a collective for the others


def _weights(zero: tuple[str, ...] = ()) -> dict[str, np.ndarray]:
    w = tiny_llama_tensors(**P, seed=21)
    for name in zero:  # a zero o_proj (or down) leaves only the MLP (or attention) in the block
        w[f"blk.0.{NAMES[name]}.weight"] = np.zeros_like(w[f"blk.0.{NAMES[name]}.weight"])
    return w


def _block(w: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    return {key: w[f"blk.0.{name}.weight"] for key, name in NAMES.items()}


def _reference(w: dict[str, np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """The block's input (embedding rows) and its output from the naive loop."""
    _, hidden = naive_llama(w, P, IDS)
    return w["token_embd.weight"][IDS].astype(np.float32), hidden[0]


def _reference_shard(block: dict[str, np.ndarray], rank: int, world_size: int) -> dict[str, np.ndarray]:
    """Rank ``rank``'s weights by NumPy slicing: bands of rows for Q, K, V, gate and up, of columns for o_proj
    and down, the norms whole (what ``shard_block`` must return; the block tests use these, so that
    they test ``parallel_block`` alone)."""
    out = {}
    for name, w in block.items():
        if name in ("wo", "w_down"):
            n = w.shape[1] // world_size
            out[name] = np.ascontiguousarray(w[:, rank * n:(rank + 1) * n])
        elif name in ("attn_norm", "ffn_norm"):
            out[name] = w
        else:
            n = w.shape[0] // world_size
            out[name] = w[rank * n:(rank + 1) * n]
    return out


def _run(ex, w: dict[str, np.ndarray], tp: int) -> tuple[list[np.ndarray], list[int]]:
    """Each rank's output of the learner's ``parallel_block`` on the reference shards, and its all-reduce count."""
    x0 = w["token_embd.weight"][IDS].astype(np.float32)
    calls = [0] * tp

    def rank(comm):
        shard = _reference_shard(_block(w), comm.rank, comm.world_size)
        counting = _Counting(comm, calls)
        try:
            return ex.parallel_block(x0.copy(), shard, counting, CONFIG)
        except ValueError as e:
            if "reshape" not in str(e):
                raise
            pytest.fail(f"rank {comm.rank} of {tp}: parallel_block could not reshape ({e}): this rank's q has "
                        f"n_heads / world_size = {CONFIG.n_heads // tp} heads and its k, v "
                        f"n_kv_heads / world_size = {CONFIG.n_kv_heads // tp}, not the whole model's")

    try:
        return run_local(tp, rank, timeout=TIMEOUT), calls
    except GroupBroken as e:
        pytest.fail(f"the ranks called all_reduce {calls} times ({e}): a collective waits for every rank, so "
                    "each rank must call it at the same points, the same number of times (no `if comm.rank == 0:`)")


class _Counting(LocalCommunicator):
    """The rank's communicator, counting its all-reduces."""

    def __init__(self, inner: LocalCommunicator, calls: list[int]):
        super().__init__(inner._group, inner.rank)
        self.calls = calls

    def all_reduce(self, x):
        self.calls[self.rank] += 1
        return super().all_reduce(x)


# -- the splits -----------------------------------------------------------------------------


def _same_band(got: np.ndarray, want: np.ndarray, w: np.ndarray, axis: int, call: str) -> None:
    """``got`` is the band ``want`` of ``w`` along ``axis`` (0: rows, 1: columns); else say which band it is."""
    if np.array_equal(got, want):
        return
    what = "rows" if axis == 0 else "columns"
    size = want.shape[axis]
    for start in range(w.shape[axis] - size + 1):
        if np.array_equal(got, np.take(w, range(start, start + size), axis=axis)):
            pytest.fail(f"{call} returned {what} {start}..{start + size - 1}; shard `index` of `parts` is the "
                        f"index-th band of {size} {what}: it starts at index * {size}")
    pytest.fail(f"{call} has the right shape {got.shape} but is not a band of consecutive {what} of w")


@pytest.mark.parametrize("parts", [1, 2, 4])
def test_ex11_5_split_rows_is_column_parallel(ex, parts):
    w = np.arange(8 * 12, dtype=np.float32).reshape(8, 12)
    for r in range(parts):
        got = np.asarray(ex.split_rows(w, parts, r))
        want = w[r * 8 // parts:(r + 1) * 8 // parts]
        if got.shape == (8, 12 // parts) and parts > 1:
            pytest.fail(f"split_rows(w [8, 12], {parts}, {r}) kept columns {got.shape}: a column-parallel "
                        "shard keeps a band of output features, which are the ROWS of a [out, in] weight")
        assert got.shape == want.shape, f"split_rows(w [8, 12], {parts}, {r}): shape {got.shape}, want {want.shape}"
        _same_band(got, want, w, 0, f"split_rows(w [8, 12], {parts}, {r})")


@pytest.mark.parametrize("parts", [1, 2, 3])
def test_ex11_5_split_cols_is_row_parallel(ex, parts):
    w = np.arange(6 * 12, dtype=np.float32).reshape(6, 12)
    for r in range(parts):
        got = np.asarray(ex.split_cols(w, parts, r))
        want = w[:, r * 12 // parts:(r + 1) * 12 // parts]
        if got.shape == (6 // parts, 12) and parts > 1:
            pytest.fail(f"split_cols(w [6, 12], {parts}, {r}) kept rows {got.shape}: a row-parallel shard "
                        "keeps a band of input features, which are the COLUMNS of a [out, in] weight")
        assert got.shape == want.shape, f"split_cols(w [6, 12], {parts}, {r}): shape {got.shape}, want {want.shape}"
        _same_band(got, want, w, 1, f"split_cols(w [6, 12], {parts}, {r})")
        assert got.flags.c_contiguous, "split_cols must return a C-contiguous copy (a column slice is strided)"


def test_ex11_5_uneven_splits_are_refused(ex):
    w = np.zeros((6, 10), np.float32)
    for split, parts, what in ((ex.split_rows, 4, "6 rows"), (ex.split_cols, 3, "10 columns")):
        try:
            got = split(w, parts, 0)
        except ValueError:
            continue
        pytest.fail(f"{split.__name__}(w [6, 10], {parts}, 0) returned shape {np.shape(got)}: {what} do not split "
                    f"into {parts} equal bands, so raise ValueError (equal shards are what the ranks' sums assume)")


def test_ex11_5_shard_block_splits_each_weight_the_right_way(ex):
    block = _block(_weights())
    shard = ex.shard_block(block, 1, 2)
    assert set(shard) == set(block), f"shard_block must return the keys {sorted(block)}; got {sorted(shard)}"
    for name in ("wq", "wk", "wv", "w_gate", "w_up"):
        w, got = block[name], np.asarray(shard[name])
        rows = w[w.shape[0] // 2:]
        if got.shape == (w.shape[0], w.shape[1] // 2):
            pytest.fail(f"{name} was split by columns: it is column-parallel (each rank computes its own heads "
                        "or MLP features), so it keeps a band of rows")
        assert got.shape == rows.shape, f"{name}: rank 1 of 2 keeps half of its rows, {rows.shape}; got {got.shape}"
        _same_band(got, rows, w, 0, f"shard_block(w, rank=1, world_size=2)[{name!r}]")
    for name in ("wo", "w_down"):
        w, got = block[name], np.asarray(shard[name])
        if got.shape == (w.shape[0] // 2, w.shape[1]):
            pytest.fail(f"{name} was split by rows: it is row-parallel (its input is this rank's heads or MLP "
                        "features), so it keeps a band of columns, and its product is a partial sum")
        cols = w[:, w.shape[1] // 2:]
        assert got.shape == cols.shape, f"{name}: rank 1 of 2 keeps half of its columns, {cols.shape}; got {got.shape}"
        _same_band(got, cols, w, 1, f"shard_block(w, rank=1, world_size=2)[{name!r}]")
    for name in ("attn_norm", "ffn_norm"):
        assert np.array_equal(shard[name], block[name]), f"{name} is not split: every rank needs all of it"


# -- the block ------------------------------------------------------------------------------


def _check_against_reference(outs, x0, want, what: str, tp: int) -> None:
    for rank, out in enumerate(outs):
        err = normalised_error(out, want)
        if err <= TOL:
            continue
        parts = [o - x0 for o in outs]
        # out = a x0 + b (want - x0) with a > 1: the residual went into an all-reduce and was summed over the ranks
        basis = np.stack([x0.ravel(), (want - x0).ravel()], axis=1).astype(np.float64)
        (a, b), *_ = np.linalg.lstsq(basis, out.ravel().astype(np.float64), rcond=None)
        if a > 1.5 and normalised_error(out, a * x0 + b * (want - x0)) <= 1e-3:
            pytest.fail(f"rank {rank}: the block's output holds its input x about {a:.2g} times: x went into an "
                        "all-reduce and was summed over the ranks. All-reduce only the partial sum (o_proj's, "
                        "down's output), then add it to x")
        if normalised_error(sum(parts), want - x0) <= TOL:
            pytest.fail(
                f"layer 0's {what} on rank {rank} differs from one process's: each rank's is about 1/{tp} of it, "
                f"and the ranks' add up to it: the partial sums of {'o_proj' if what == 'attention output' else 'down'}"
                " were not all-reduced"
            )
        token, feature = np.unravel_index(int(np.argmax(np.abs(out - want))), want.shape)
        pytest.fail(f"rank {rank}: the block's output differs from one process's by {err:.2e} (> {TOL:.2e}); worst "
                    f"at token {token}, feature {feature}: {out[token, feature]:.5g} instead of {want[token, feature]:.5g}")


@pytest.mark.parametrize("tp", [2])
def test_ex11_5_attention_output_is_all_reduced(ex, tp):
    w = _weights(zero=("w_down",))  # the block is x + attention only
    x0, want = _reference(w)
    outs, _ = _run(ex, w, tp)
    _check_against_reference(outs, x0, want, "attention output", tp)


@pytest.mark.parametrize("tp", [2])
def test_ex11_5_mlp_output_is_all_reduced(ex, tp):
    w = _weights(zero=("wo",))  # the block is x + MLP only
    x0, want = _reference(w)
    outs, _ = _run(ex, w, tp)
    _check_against_reference(outs, x0, want, "MLP output", tp)


@pytest.mark.parametrize("tp", [1, 2])
def test_ex11_5_block_equals_one_process_with_two_all_reduces(ex, tp):
    w = _weights()
    x0, want = _reference(w)
    outs, calls = _run(ex, w, tp)
    _check_against_reference(outs, x0, want, "output", tp)
    assert calls == [2] * tp, (
        f"each rank all-reduced {calls} times: a block needs exactly two (after o_proj and after down); "
        "more moves data for nothing"
    )


# -- once under a real mpiexec ---------------------------------------------------------------


def test_ex11_5_block_under_mpiexec(ex, impl, tmp_path):
    import json
    import os
    import shutil
    import signal
    import subprocess
    import sys
    from pathlib import Path

    from llmrs_core.distributed.mpi import OVERSUBSCRIBED_ENV

    ex.shard_block(_block(_weights()), 0, 2)  # a stub says "not implemented" here, not in a subprocess
    mpiexec = shutil.which("mpiexec", path=str(Path(sys.executable).parent)) or shutil.which("mpiexec")
    if mpiexec is None:
        pytest.skip("mpiexec is not installed (pip install -e '.[dist]'): the in-process tests above still ran")
    env = {**os.environ, **OVERSUBSCRIBED_ENV, "LLMRS_IMPL": impl, "OPENBLAS_NUM_THREADS": "1"}
    worker = str(Path(__file__).with_name("mpi_ex11_5.py"))
    proc = subprocess.Popen([mpiexec, "-n", "2", sys.executable, worker], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=env, start_new_session=True)
    try:
        out, err = proc.communicate(timeout=60)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        pytest.fail(f"mpiexec -n 2 did not end within 60 s: does every rank call all_reduce the same number "
                    f"of times? stderr: {err[-2000:]}")
    assert proc.returncode == 0, f"your block failed under mpiexec -n 2:\n{err[-3000:]}"
    errs = json.loads(out.strip().splitlines()[-1])["err"]
    assert max(errs) <= TOL, (f"under mpiexec -n 2 the ranks' outputs differ from one process's by {errs} "
                              f"(> {TOL:.2e}); in-process they passed: is your block's result the same on every rank?")
