"""``llmrs ab serve``: one ``llmrs serve`` per variant on 127.0.0.1, and the router in front (section 12.4).

Each ``--variant NAME=MODEL[:backend][@weight]`` becomes a child process
(:class:`~llmrs_core.bench.serve_compare.ManagedServer`: a free port, ready when its
``/ready`` answers 200, its output in a temporary log quoted if it fails) serving the
model under the variant's name; each ``--upstream NAME=URL[@weight]`` is a server
already running. The router then runs in the foreground; when it
stops (SIGTERM, Ctrl-C) or fails, every child is stopped with it.
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Callable, Sequence
from typing import TextIO

from .variants import Upstream, VariantSpec, check_variants


def variant_command(spec: VariantSpec, threads: int | None, extra: Sequence[str] = ()) -> Callable[[int], list[str]]:
    """The command line of ``spec``'s server, given its port."""
    from ..backends import DEFAULT_BACKEND
    from ..bench.serve_compare import our_command

    if (spec.backend or DEFAULT_BACKEND) != "numba":  # --threads is the numba backend's (BLAS: the environment)
        threads = None

    def command(port: int) -> list[str]:
        cmd = our_command(spec.model, port, threads, max_num_seqs=16, backend=spec.backend)
        return [*cmd, "--served-model-name", spec.name, "--no-request-log", *extra]

    return command


def run_ab(variants: Sequence[VariantSpec], upstreams: Sequence[Upstream], *, host: str = "127.0.0.1",
           port: int = 8000, salt: str = "", served_model_name: str = "ab", request_log: TextIO | None = None,
           threads: int | None = None, timeout: float = 300.0, start_timeout: float = 300.0,
           say: Callable[[str], None] = lambda line: print(line, file=sys.stderr, flush=True)) -> None:
    """Start the variants' servers, serve the router until SIGTERM or Ctrl-C, stop them all."""
    from ..bench.serve_compare import ManagedServer
    from ..server.serve import serve
    from .router import create_router

    check_variants([*variants, *upstreams])
    if threads is None and variants:  # the children share the cores rather than each taking all
        threads = max(1, (os.cpu_count() or 1) // len(variants))
    with contextlib.ExitStack() as stack:
        started = []
        for spec in variants:
            say(f"starting variant {spec.name!r}: {spec.model} ({spec.backend or 'default backend'}, "
                f"{threads} thread(s)) ...")
            server = ManagedServer(f"variant {spec.name!r}", variant_command(spec, threads), "/ready",
                                   threads=threads, start_timeout=start_timeout)
            url = stack.enter_context(server)
            started.append(Upstream(spec.name, url, spec.weight))
            say(f"variant {spec.name!r} ready at {url}")
        every = [*started, *upstreams]
        app = create_router(every, salt=salt, served_model_name=served_model_name, request_log=request_log,
                            timeout=timeout)
        split = ", ".join(f"{u.name} {u.weight:g}" for u in every)
        say(f"A/B router for {served_model_name!r} on http://{host}:{port}/v1 (weights: {split}); "
            f"the header x-llmrs-variant names each answer's variant")
        serve(app, host=host, port=port, drain_timeout=min(timeout, 30.0), access_log=False)


__all__ = ["run_ab", "variant_command"]
