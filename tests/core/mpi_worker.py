"""Run under ``mpiexec`` by ``test_distributed_mpi.py``: one rank of a split model.

``python mpi_worker.py MODEL TP PP PROMPT_IDS_JSON N OUT_NPZ [-- CLI ARGS...]``: loads this rank's
shard with ``llmrs.load(MODEL, tp=TP, pp=PP)``, generates ``N`` greedy tokens after the prompt
(none for ``N = 0``) and computes the logits of prompt + tokens; rank 0 writes both to ``OUT_NPZ``. Then, if given,
it runs ``llmrs CLI ARGS`` in the same launch (its output on rank 0's stdout), so that one
launch checks both the front door and the command line.

``python mpi_worker.py --fail-on-rank R CLI ARGS...``: a rank that fails in the middle of a run.
"""

from __future__ import annotations

import json
import sys

import numpy as np

import llmrs_core as llmrs
from llmrs_core.cli import main
from llmrs_core.cli.ranks import launcher_rank


def fail_mid_run(argv: list[str]) -> int:
    """``--fail-on-rank R CLI ARGS``: ``llmrs CLI ARGS`` through the engine's own rank runner, where rank
    ``R`` raises after loading while the others go on into the generation's collectives."""
    from llmrs_core.cli import build_parser
    from llmrs_core.cli.generate import generate_with
    from llmrs_core.cli.ranks import run_on_ranks

    rank = int(argv[0])
    args = build_parser().parse_args(argv[1:])

    def body(args, model):
        if launcher_rank() == rank:
            raise RuntimeError(f"rank {rank} was told to fail")
        return generate_with(args, model)

    return run_on_ranks(args, body)


def run(argv: list[str]) -> int:
    if argv[0] == "--fail-on-rank":
        return fail_mid_run(argv[1:])
    split = argv.index("--") if "--" in argv else len(argv)
    model, tp, pp, prompt, n, out = argv[:split]
    m = llmrs.load(model, backend="numba", threads=1, exact=True, tp=int(tp), pp=int(pp))
    prompt_ids = json.loads(prompt)
    tokens = m.generate(prompt_ids, max_tokens=int(n)).token_ids if int(n) else []
    logits = m.logits(prompt_ids + tokens)
    if launcher_rank() == 0:
        np.savez(out, tokens=np.array(tokens), logits=logits)
    return main(argv[split + 1:]) if split < len(argv) else 0


if __name__ == "__main__":
    sys.exit(run(sys.argv[1:]))
