"""What the commands print: streamed text, a completion's speed, JSON files, one-line errors."""

from __future__ import annotations

import json
import sys
import threading

from ..files import atomic_write


def write(text: str) -> None:
    sys.stdout.write(text)
    sys.stdout.flush()


def print_stats(completion, file=sys.stderr) -> None:
    print(
        f"\n[{completion.prompt_tokens} prompt tokens at {completion.prefill_tokens_per_second:,.1f} tokens/s; "
        f"{len(completion.token_ids)} generated at {completion.decode_tokens_per_second:,.1f} tokens/s; "
        f"finish: {completion.finish_reason}]",
        file=file,
    )


def warm_up(model) -> None:
    """Compile the kernels before the clock starts, saying so when it takes a while (the first
    run, with an empty Numba cache); a warm cache loads them silently in a fraction of a second."""
    if not model.compiles_kernels:
        return
    _ = model.network  # load the weights first: only compilation is timed and reported
    said = threading.Event()

    def say() -> None:
        print("compiling the CPU kernels (first run only) ...", end=" ", file=sys.stderr, flush=True)
        said.set()

    timer = threading.Timer(1.0, say)
    timer.start()
    try:
        seconds = model.warm_up()
    finally:
        timer.cancel()
        timer.join()
    if said.is_set():
        print(f"{seconds:.0f} s", file=sys.stderr, flush=True)


def write_json(result: dict, path: str) -> None:
    with atomic_write(path, "w") as f:
        json.dump(result, f, indent=2)
        f.write("\n")
    print(f"wrote {path}", file=sys.stderr)


def one_line(e: BaseException) -> str:
    text = str(e) or type(e).__name__
    if isinstance(e, OSError) and e.filename is not None and str(e.filename) not in text:
        text = f"{text}: {e.filename}"
    return " ".join(text.split())
