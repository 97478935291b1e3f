"""Distributed inference: tensor and pipeline parallelism over a ``Communicator`` (chapter 11).

* :mod:`.communicator`: the :class:`Communicator` interface, the in-process
  :class:`LocalCommunicator` and :func:`run_local`;
* :mod:`.mpi`: :class:`~.mpi.MPICommunicator` (mpi4py; imported only when used);
* :mod:`.sharding`: column- and row-parallel splits, KV-head assignment, vocab split,
  the tensor-parallel sizes that work;
* :mod:`.shard`: :class:`ShardSource`, the part of a model one rank keeps;
* :mod:`.plan`: the :class:`StepPlan` a :class:`~llmrs_core.model.LlamaModel` calls at
  its four communication points;
* :mod:`.launch`: checking a launch, sharding, agreeing that every rank loaded.

The tooling around them lives beside the CLI: :mod:`llmrs_core.cli.ranks` (``llmrs generate
--tp/--pp`` on each rank), :mod:`llmrs_core.ops.profile` and :mod:`llmrs_core.ops.timeline`
(the per-rank timeline).

An NCCL communicator (CuPy) is not built: this engine's distributed runs are CPU
processes under MPI.
"""

from .communicator import Communicator, GroupBroken, LocalCommunicator, run_local
from .launch import LaunchError, RankFailed
from .plan import PipelineParallel, SingleProcess, StepPlan, TensorParallel
from .shard import ShardSource, ShardSpec

__all__ = [
    "Communicator", "GroupBroken", "LaunchError", "LocalCommunicator", "PipelineParallel", "RankFailed",
    "ShardSource", "ShardSpec", "SingleProcess", "StepPlan", "TensorParallel", "run_local",
]
