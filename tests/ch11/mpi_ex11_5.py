"""Run under ``mpiexec -n 2`` by ``test_ex11_5_multi_process.py``: Exercise 11.5's block on real MPI.

Each rank shards the tiny block with the code under test (``LLMRS_IMPL``: the learner's
exercises or the solutions), runs ``parallel_block`` over an ``MPICommunicator``, and rank 0
prints ``{"err": e}`` per rank: the normalised error against the naive float64 reference.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from llmrs_core.distributed.mpi import world  # noqa: E402
from llmrs_core.testing import normalised_error  # noqa: E402
from llmrs_core.workbook import exercises  # noqa: E402
from tests.ch11.test_ex11_5_multi_process import CONFIG, IDS, _block, _reference, _weights  # noqa: E402


def main() -> int:
    ex = exercises(11)
    comm = world()
    w = _weights()
    x0, want = _reference(w)
    shard = ex.shard_block(_block(w), comm.rank, comm.world_size)
    out = ex.parallel_block(x0.copy(), shard, comm, CONFIG)
    errs = comm.gather_objects(normalised_error(np.asarray(out), want))
    if comm.rank == 0:
        print(json.dumps({"err": errs, "tokens": len(IDS)}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
