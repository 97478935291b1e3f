"""Starting a split model: checking the launch, sharding, agreeing that every rank loaded (chapter 11).

A bad launch must end every rank within seconds with one clear message, never a hang:

* ``--tp``/``--pp`` without ``mpiexec``, or mpi4py missing: caught before MPI starts;
* world size != ``tp * pp``: every rank sees the same sizes and raises the same error;
* a rank that fails to load the model: every rank reports its outcome in one
  :meth:`~.communicator.Communicator.gather_objects`, so all of them learn who failed and
  raise :class:`RankFailed` together (rank 0's message names the rank and its error).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

from ..formats.source import WeightSource
from .communicator import Communicator
from .plan import PipelineParallel, StepPlan, TensorParallel
from .shard import ShardSource, ShardSpec

T = TypeVar("T")


class LaunchError(ValueError):
    """The processes were started in a way that cannot run the requested split."""


class RankFailed(RuntimeError):
    """Some rank failed at a point every rank passes together (loading the model)."""


def command_line(tp: int, pp: int) -> str:
    n = tp * pp
    flag = f"--tp {tp}" if tp > 1 else f"--pp {pp}"
    return f"mpiexec -n {n} llmrs generate PROMPT {flag}"


def check_sizes(tp: int, pp: int) -> None:
    """``LaunchError`` for sizes below 1, or tensor and pipeline parallelism together (not built)."""
    if tp < 1 or pp < 1:
        raise LaunchError(f"--tp and --pp must be at least 1; got --tp {tp} --pp {pp}")
    if tp > 1 and pp > 1:
        raise LaunchError("--tp and --pp together are not supported: choose one of them")


def connect(tp: int, pp: int, comm: Communicator | None = None) -> Communicator:
    """The communicator of a ``tp * pp``-rank run: ``comm`` if given (in-process tests), else
    MPI's world. ``LaunchError`` (the same on every rank) when the launch cannot run it."""
    check_sizes(tp, pp)
    if comm is None:
        from .mpi import under_launcher, world

        if not under_launcher():
            raise LaunchError(f"--tp/--pp need {tp * pp} processes started by mpiexec: run "
                              f"`{command_line(tp, pp)}` (mpiexec comes with pip install -e '.[dist]')")
        comm = world()
    if comm.world_size != tp * pp:
        raise LaunchError(
            f"mpiexec started {comm.world_size} processes, but --tp {tp} --pp {pp} needs {tp * pp}: "
            f"run `{command_line(tp, pp)}`"
        )
    return comm


def agree(comm: Communicator, step: Callable[[], T], what: str = "load the model") -> T:
    """Run ``step()`` on every rank and return its result, unless it failed on any rank: then
    every rank raises :class:`RankFailed`, naming each failed rank and its error."""
    result, error = None, None
    try:
        result = step()
    except Exception as e:  # noqa: BLE001 - reported to every rank below
        error = f"{type(e).__name__}: {' '.join(str(e).split())}"
    outcomes = comm.gather_objects(error)
    by_error: dict[str, list[int]] = {}
    for r, msg in enumerate(outcomes):
        if msg is not None:
            by_error.setdefault(msg, []).append(r)
    if by_error:
        def who(ranks: list[int]) -> str:
            if len(ranks) == len(outcomes) > 1:
                return "every rank"
            return ("rank " if len(ranks) == 1 else "ranks ") + ", ".join(map(str, ranks))

        raise RankFailed("; ".join(f"{who(ranks)} failed to {what}: {msg}" for msg, ranks in by_error.items()))
    return result


def shard(source: WeightSource, comm: Communicator, tp: int, pp: int,
          vocab_parallel: bool = True, micro_batched: bool = False) -> tuple[ShardSource, StepPlan]:
    """This rank's :class:`ShardSource` and its :class:`StepPlan` (rank = TP rank, or PP stage).
    ``micro_batched``: a :class:`~.pipeline.PipelineStage` for :func:`~.pipeline.pipelined_greedy`."""
    check_sizes(tp, pp)
    if tp > 1:
        spec = ShardSpec(tp=tp, tp_rank=comm.rank, vocab_parallel=vocab_parallel)
        part = ShardSource(source, spec)
        return part, TensorParallel(comm, part.vocab_rows, source.config.vocab_size)
    part = ShardSource(source, ShardSpec(pp=pp, pp_rank=comm.rank))
    if micro_batched:
        from .pipeline import PipelineStage

        return part, PipelineStage(comm, source.config.hidden_size)
    return part, PipelineParallel(comm, source.config.hidden_size, source.config.vocab_size)


__all__ = ["LaunchError", "RankFailed", "agree", "check_sizes", "command_line", "connect", "shard"]
