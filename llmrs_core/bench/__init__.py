"""Benchmarks: how every speed figure of the workbook is measured (chapters 2, 7, 8, appendix A).

    speed        ``llmrs bench speed``: prompt processing and generation (pp/tg),
                 llama-bench style, with llama.cpp in the same run (8, A)
    throughput   ``llmrs bench throughput``: offline serving throughput, TTFT/ITL,
                 the batching and prefix-cache speed-ups (7)
    tokenizer    ``make bench-tokenizer``: encode speed of our BPE against
                 Hugging Face ``tokenizers`` (2)
    common       what they share: the repetition timer, random prompt ids, percentiles

A ``serve`` module (chapter 11: load against the HTTP server, vLLM's method)
will join them. Nothing is imported here: use the modules, e.g.
``from llmrs_core.bench import speed; speed.speed(...)``.
"""
