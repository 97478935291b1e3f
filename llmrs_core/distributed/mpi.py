"""``MPICommunicator``: the :class:`~.communicator.Communicator` over MPI (mpi4py, chapter 11).

The hot path uses mpi4py's upper-case, buffer-based methods (``Allreduce``, ``Allgather``,
``Send``/``Recv``, ``Bcast``) on NumPy arrays in place: no pickling, no copies beyond
MPI's own. Only start-up agreement and error reports use the pickling lower-case
``allgather``.

mpi4py is the ``dist`` extra (``pip install -e '.[dist]'``, which brings MPICH's wheel
and its ``mpiexec``). Importing this module does not import mpi4py; :func:`world` does.
"""

from __future__ import annotations

import os
import sys
from typing import Any

import numpy as np

from .communicator import Communicator

INSTALL_HINT = "pip install -e '.[dist]' (mpi4py and the MPICH wheel, which provides mpiexec)"
#: environment variables a process manager sets in every rank it starts (MPICH's hydra, PMIx, Open MPI, Slurm)
LAUNCHER_VARIABLES = ("PMI_RANK", "PMI_SIZE", "PMIX_RANK", "OMPI_COMM_WORLD_SIZE", "MPI_LOCALNRANKS")
#: MPICH settings for more ranks than cores (3 ranks on a 2-core CI machine). A rank waiting in a
#: collective polls its shared-memory queues in a loop; oversubscribed, that loop holds the core the
#: rank being waited for needs, unless it yields. ``POLLS_BEFORE_YIELD=1`` makes it call
#: ``sched_yield`` on every empty poll. Measured on the shared 2-core machine (300 steps of a
#: [1, 576] x [576, 192] product and an all-reduce, 3 ranks on one core, 5 alternating runs each):
#: 0.063-0.068 s with it, 0.061-0.114 s with MPICH's default and 0.062-0.088 s with
#: ``MPIR_CVAR_CH4_PROGRESS_THROTTLE=1`` (usleep(1) after empty polls) — the same median, a
#: tighter spread. MPICH already yields now and then by default; this makes it yield at once.
OVERSUBSCRIBED_ENV = {"MPIR_CVAR_POLLS_BEFORE_YIELD": "1"}


def _mpi() -> Any:
    try:
        from mpi4py import MPI
    except ImportError as e:
        raise ImportError(f"a distributed run needs mpi4py, which is not installed ({e}): {INSTALL_HINT}") from None
    return MPI


def under_launcher() -> bool:
    """Whether this process was started by ``mpiexec`` (or another MPI process manager)."""
    return any(v in os.environ for v in LAUNCHER_VARIABLES)


class MPICommunicator(Communicator):
    """One MPI process's rank in ``comm`` (default: ``MPI.COMM_WORLD``)."""

    def __init__(self, comm: Any = None):
        self._MPI = _mpi()
        self.comm = self._MPI.COMM_WORLD if comm is None else comm

    @property
    def rank(self) -> int:
        return self.comm.Get_rank()

    @property
    def world_size(self) -> int:
        return self.comm.Get_size()

    def all_reduce(self, x: np.ndarray) -> np.ndarray:
        self.comm.Allreduce(self._MPI.IN_PLACE, x, op=self._MPI.SUM)
        return x

    def all_gather(self, x: np.ndarray) -> np.ndarray:
        x = np.ascontiguousarray(x)
        out = np.empty((self.world_size, *x.shape), dtype=x.dtype)
        self.comm.Allgather(x, out)
        return out

    def send(self, x: np.ndarray, dest: int, tag: int = 0) -> None:
        self.comm.Send(np.ascontiguousarray(x), dest=dest, tag=tag)

    def recv(self, out: np.ndarray, source: int, tag: int = 0) -> np.ndarray:
        self.comm.Recv(out, source=source, tag=tag)
        return out

    def broadcast(self, x: np.ndarray, root: int = 0) -> np.ndarray:
        self.comm.Bcast(x, root=root)
        return x

    def barrier(self) -> None:
        self.comm.Barrier()

    def gather_objects(self, obj: Any) -> list[Any]:
        return self.comm.allgather(obj)

    def abort(self, code: int = 1) -> None:
        sys.stdout.flush()
        sys.stderr.flush()
        self.comm.Abort(code)


def find_mpiexec() -> str:
    """The ``mpiexec`` beside this Python (the MPICH wheel's) or on ``PATH``; ``FileNotFoundError``
    saying what to install."""
    import shutil
    from pathlib import Path

    found = shutil.which("mpiexec", path=str(Path(sys.executable).parent)) or shutil.which("mpiexec")
    if found is None:
        raise FileNotFoundError(f"mpiexec not found beside {sys.executable} or on PATH: {INSTALL_HINT}")
    return found


def launch_command(n: int, argv: list[str]) -> tuple[list[str], dict[str, str]]:
    """The ``mpiexec`` command line and environment that run ``llmrs ARGV`` on ``n`` ranks. With more
    ranks than cores, each rank gets :data:`OVERSUBSCRIBED_ENV`; each gets its share of the cores as
    Numba threads unless ``NUMBA_NUM_THREADS`` is set."""
    if n < 1:
        raise ValueError(f"launch -n {n}: give at least one rank")
    cores = os.cpu_count() or 1
    env = {**os.environ}
    env.setdefault("NUMBA_NUM_THREADS", str(max(1, cores // n)))
    if n > cores:
        env = {**OVERSUBSCRIBED_ENV, **env}
    return [find_mpiexec(), "-n", str(n), sys.executable, "-m", "llmrs_core", *argv], env


def world() -> MPICommunicator:
    """The communicator of every process ``mpiexec`` started; ``ImportError`` saying what to
    install when mpi4py is missing."""
    return MPICommunicator()


__all__ = ["INSTALL_HINT", "OVERSUBSCRIBED_ENV", "MPICommunicator", "find_mpiexec", "launch_command", "under_launcher",
           "world"]
