"""Benchmarks: how every speed figure of the workbook is measured (chapters 2, 7, 8, 11, appendix A).

    speed        ``llmrs bench speed``: prompt processing and generation (pp/tg),
                 llama-bench style, with llama.cpp in the same run (8, A)
    throughput   ``llmrs bench throughput``: offline serving throughput, TTFT/ITL,
                 the batching and prefix-cache speed-ups (7)
    tokenizer    ``make bench-tokenizer``: encode speed of our BPE against
                 Hugging Face ``tokenizers`` (2)
    serve        ``llmrs bench serve``: load on an OpenAI-compatible server, vLLM's
                 method: TTFT/ITL/TPOT/E2E, goodput, truncated streams apart (11)
    serve_compare  ``--compare``: our server and llama-cpp-python's, started on the
                 same GGUF and threads, side by side; the table and the plot (11)
    prompts      the short prompt set ``bench serve --dataset prompts`` sends
    common       what they share: the repetition timer, random prompt ids, percentiles

Nothing is imported here: use the modules, e.g.
``from llmrs_core.bench import speed; speed.speed(...)``.
"""
