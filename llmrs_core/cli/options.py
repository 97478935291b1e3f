"""The options several commands share, and what they mean: the model, the backend, sampling."""

from __future__ import annotations

import argparse

from ..backends import BACKENDS, DEFAULT_BACKEND


def add_model_options(p: argparse.ArgumentParser) -> None:
    """``--model``, ``--backend``, ``--threads``, ``--exact``, ``--impl``: which model, run how."""
    p.add_argument("--model", help="a GGUF file (default: SmolLM2)")
    p.add_argument("--backend", choices=BACKENDS,
                   help=f"{DEFAULT_BACKEND} (default), numpy (the reference), learner (your exercise code) "
                        "or cuda (an NVIDIA GPU, chapter 9)")
    p.add_argument("--threads", type=int, help="numba backend: threads (default: all cores)")
    p.add_argument("--exact", action="store_true", help="numba backend: keep every product on the float kernels (within float32 rounding of numpy) instead of the int8 decode path (llama.cpp's arithmetic)")
    p.add_argument("--impl", choices=("learner", "solutions"),
                   help="learner = --backend learner; solutions = --backend numpy")


def add_sampling_options(p: argparse.ArgumentParser, max_tokens: int) -> None:
    """The model's options (:func:`add_model_options`), then the sampler's, ``--max-tokens`` defaulting
    to ``max_tokens``: what ``generate`` and ``chat`` share."""
    add_model_options(p)
    p.add_argument("--max-tokens", type=int, default=max_tokens, help=f"tokens to generate (default {max_tokens})")
    p.add_argument("--temperature", type=float, default=0.0, help="0 = greedy (default)")
    p.add_argument("--top-p", type=float, default=1.0, help="nucleus sampling threshold (1 = off)")
    p.add_argument("--top-k", type=int, default=0, help="keep the k most likely tokens (0 = off)")
    p.add_argument("--min-p", type=float, default=0.0, help="drop tokens below min_p x the top probability")
    p.add_argument("--repetition-penalty", type=float, default=1.0, help="> 1 discourages repeats")
    p.add_argument("--seed", type=int, help="random seed: the same seed gives the same sample")
    p.add_argument("--stop", action="append", metavar="TEXT", help="stop before this text (repeatable)")


def sampling_kwargs(args: argparse.Namespace) -> dict:
    return dict(
        max_tokens=args.max_tokens, temperature=args.temperature, top_p=args.top_p, top_k=args.top_k,
        min_p=args.min_p, repetition_penalty=args.repetition_penalty, seed=args.seed, stop=args.stop or (),
    )


def backend_of(args: argparse.Namespace) -> str:
    if args.impl is not None:
        return "learner" if args.impl == "learner" else "numpy"
    return args.backend or DEFAULT_BACKEND


def parse_backends(text: str | None) -> tuple[str, ...]:
    names = tuple(n.strip() for n in (text or DEFAULT_BACKEND).split(",") if n.strip())
    unknown = [n for n in names if n not in BACKENDS]
    if unknown or not names:
        raise ValueError(f"unknown backend {', '.join(unknown) or text!r}; available: {', '.join(BACKENDS)}")
    return names


def parse_numbers(option: str, text: str, kind: type) -> list:
    """``"1,4,16"`` -> ``[1, 4, 16]`` (``kind`` int or float), each > 0; one-line errors."""
    try:
        values = [kind(v) for v in text.split(",") if v.strip()]
    except ValueError:
        values = []
    if not values or not all(v > 0 for v in values):
        raise ValueError(f"{option} takes positive {'whole ' if kind is int else ''}numbers separated by commas "
                         f"(e.g. {'1,4,16' if kind is int else '2,4.5'}), got {text!r}")
    return values
