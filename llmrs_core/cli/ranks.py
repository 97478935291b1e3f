"""Running a CLI command on every rank of an ``mpiexec`` launch (chapter 11).

Every rank runs the same command on its shard (SPMD); only rank 0 prints. Failures end
every rank within seconds, never a hang:

* a bad launch (no ``mpiexec``, mpi4py missing, world size != ``tp * pp``) is seen
  alike by every rank: rank 0 prints it, all exit with status 2;
* a rank that fails to load: every rank learns it at the load's agreement point
  (:func:`~llmrs_core.distributed.launch.agree`); rank 0 prints who failed and why, all exit with status 1;
* an error during the run: the rank prints it (ranks other than 0 first give rank 0 two
  seconds to report an error they share) and ``MPI_Abort`` ends every rank.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
import time
from collections.abc import Callable, Iterator
from typing import Any

from ..distributed.launch import LaunchError, RankFailed, connect

RANK_VARIABLES = ("PMI_RANK", "PMIX_RANK", "OMPI_COMM_WORLD_RANK")
#: how long a rank other than 0 waits for rank 0 to report an error before reporting its own
GRACE_SECONDS = 2.0


def launcher_rank() -> int:
    """This process's rank as the process manager set it (0 outside ``mpiexec``), known
    before MPI starts: who reports a launch error."""
    for name in RANK_VARIABLES:
        if name in os.environ:
            with contextlib.suppress(ValueError):
                return int(os.environ[name])
    return 0


@contextlib.contextmanager
def _silenced(quiet: bool) -> Iterator[None]:
    """On a quiet rank (every rank but 0), file descriptors 1 and 2 point at ``/dev/null``: whatever
    writes to them (``print``, a ``file=sys.stderr`` bound at import, Numba, C libraries) is dropped."""
    if not quiet:
        yield
        return
    sys.stdout.flush()
    sys.stderr.flush()
    saved = [os.dup(1), os.dup(2)]
    null = os.open(os.devnull, os.O_WRONLY)
    os.dup2(null, 1)
    os.dup2(null, 2)
    os.close(null)
    try:
        yield
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        for fd, saved_fd in zip((1, 2), saved):
            os.dup2(saved_fd, fd)
            os.close(saved_fd)


def _one_line(e: BaseException) -> str:
    return " ".join((str(e) or type(e).__name__).split())


def run_on_ranks(args: argparse.Namespace, body: Callable[[argparse.Namespace, Any], int]) -> int:
    """Load this rank's shard of ``args.model`` (``args.tp`` / ``args.pp``) and run
    ``body(args, model)`` on it, printing only on rank 0; see the module docstring for failures."""
    from ..loader import load

    name = f"llmrs {args.command}"
    try:
        comm = connect(args.tp, args.pp)
    except (LaunchError, ImportError) as e:
        if launcher_rank() == 0:
            print(f"{name}: error: {_one_line(e)}", file=sys.stderr)
        return 2
    quiet = comm.rank != 0
    try:
        with _silenced(quiet):
            model = load(args.model, backend=args.backend, threads=args.threads, exact=args.exact, tp=args.tp,
                         pp=args.pp, comm=comm)
    except (RankFailed, LaunchError, ValueError, OSError) as e:  # the same on every rank
        if not quiet:
            print(f"{name}: error: {_one_line(e)}", file=sys.stderr)
        return 1
    try:
        with _silenced(quiet):
            return body(args, model)
    except BaseException as e:  # noqa: BLE001 - the other ranks may wait in a collective: end them all
        if quiet:
            time.sleep(GRACE_SECONDS)  # an error every rank shares is rank 0's to report
        print(f"{name}: error on rank {comm.rank}: {type(e).__name__}: {_one_line(e)}", file=sys.stderr)
        comm.abort(1)
        raise


__all__ = ["GRACE_SECONDS", "launcher_rank", "run_on_ranks"]
