"""Ring all-reduce over point-to-point messages: the algorithm, for reading (chapter 11).

The engine calls its communicator's ``all_reduce`` (MPI's, NCCL's); this is what such a library
runs for large messages. ``p`` ranks in a ring, the array cut into ``p`` chunks:

1. **reduce-scatter**, ``p - 1`` steps: each rank sends one chunk to its right neighbour and adds
   the chunk arriving from its left one; afterwards rank ``r`` holds the full sum of chunk
   ``(r + 1) mod p``;
2. **all-gather**, ``p - 1`` steps: the finished chunks travel once more round the ring.

Each rank sends ``2 (p - 1) / p`` times the array — nearly twice its size, whatever ``p`` — in
``2 (p - 1)`` messages, so the time is ``2 (p - 1) alpha + 2 (p - 1) / p * N / beta`` (latency
``alpha`` per message, bandwidth ``beta``).
"""

from __future__ import annotations

import numpy as np

from ..distributed.communicator import Communicator


def _exchange(comm: Communicator, send: np.ndarray, recv: np.ndarray, tag: int) -> None:
    """Send ``send`` right and receive ``recv`` from the left. Rank 0 receives first and every
    other rank sends first, so that blocking sends cannot all wait on each other."""
    right, left = (comm.rank + 1) % comm.world_size, (comm.rank - 1) % comm.world_size
    if comm.rank == 0:
        comm.recv(recv, left, tag)
        comm.send(send, right, tag)
    else:
        comm.send(send, right, tag)
        comm.recv(recv, left, tag)


def ring_all_reduce(comm: Communicator, x: np.ndarray) -> np.ndarray:
    """Sum ``x`` over the ranks with a ring of sends and receives, in place; returns ``x``."""
    p, r = comm.world_size, comm.rank
    if p == 1:
        return x
    flat = x.reshape(-1)  # a view: x is C-contiguous
    bounds = np.linspace(0, flat.size, p + 1).astype(int)
    chunk = [flat[bounds[i]:bounds[i + 1]] for i in range(p)]
    for step in range(p - 1):  # reduce-scatter
        out, into = (r - step) % p, (r - step - 1) % p
        incoming = np.empty_like(chunk[into])
        _exchange(comm, np.ascontiguousarray(chunk[out]), incoming, tag=step)
        chunk[into] += incoming
    for step in range(p - 1):  # all-gather: rank r starts with the finished chunk (r + 1) % p
        out, into = (r + 1 - step) % p, (r - step) % p
        incoming = np.empty_like(chunk[into])
        _exchange(comm, np.ascontiguousarray(chunk[out]), incoming, tag=p + step)
        chunk[into][...] = incoming
    return x


def ring_bytes_sent(n_bytes: int, p: int) -> float:
    """Bytes each rank sends in a ring all-reduce of ``n_bytes``: ``2 (p - 1) / p * n_bytes``."""
    return 2 * (p - 1) / p * n_bytes


def main() -> int:
    """Under ``mpiexec -n P python -m llmrs_core.labs.ring``: the ring against MPI's all-reduce."""
    import json

    from ..distributed.mpi import world
    from ..testing import normalised_error

    comm = world()
    x = np.random.default_rng(comm.rank).standard_normal(100_003).astype(np.float32)
    want = comm.all_reduce(x.copy())
    got = ring_all_reduce(comm, x.copy())
    errs = comm.gather_objects(normalised_error(got, want))
    if comm.rank == 0:
        print(json.dumps({"ranks": comm.world_size, "normalised_error": errs}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
