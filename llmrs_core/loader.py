"""The front door: ``llmrs_core.load()`` returns a :class:`Model` (introduced in chapter 1).

Chapter 1 gives the model its file and its :class:`~llmrs_core.config.ModelConfig`,
chapter 2 its tokenizer; later chapters add the forward pass and generation (4),
and other backends (8, 9). The names here are the stable public API that
tests, notebooks and the ``llmrs`` CLI all use.
"""

from __future__ import annotations

import functools
import os
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from .backends import BACKENDS, DEFAULT_BACKEND, get_backend
from .distributed.communicator import Communicator
from .distributed.plan import StepPlan
from .engine.parts import EngineParts
from .fetch import default_model_path, fetch_model
from .formats.gguf import read_gguf
from .formats.hf import HFWeights
from .formats.source import WeightSource
from .generate import Completion, generate_ids
from .info import summary
from .kv_cache.paged import blocks_for
from .memory import check_host_allocation
from .model import LlamaModel, check_tensors, resident_bytes
from .quant.registry import check_computable
from .sampling import SamplingParams
from .tokenizer import Tokenizer
from .validation import check_max_tokens, normalise_stop, precheck_chat, prompt_ids


class Model:
    """A loaded model file and what the engine knows about it.

    Attributes:
        path: the GGUF file (or Hugging Face directory).
        source: the weight source (:class:`~llmrs_core.formats.source.WeightSource`): the
            parsed GGUF file (metadata, tensor infos, memory-mapped data), or a
            Hugging Face directory (chapter 10).
        config: the architecture, from the GGUF metadata (or ``config.json``).
        backend_name: name of the compute backend: ``"numba"`` (the default, chapter 8),
            ``"numpy"`` (the readable reference, chapter 4), ``"learner"`` (your
            exercise code where it exists; chapters 3-4) or ``"cuda"`` (an NVIDIA GPU,
            or numba-cuda's simulator; chapter 9).
        parts: what the model's caches and its batching engines are built from
            (:class:`~llmrs_core.engine.parts.EngineParts`): the engine's own, or on the
            ``"learner"`` backend the learner's chapter 5 and 7 classes where they are written,
            wrapped in the workbook's checks. ``Engine(model.network, ..., parts=model.parts)``.
    """

    def __init__(self, source: WeightSource, backend: str | None = None, threads: int | None = None,
                 split: tuple[WeightSource, StepPlan] | None = None, exact: bool = False):
        self.source = source
        self.path = source.path
        self.config = source.config
        check_tensors(source, self.config)  # at load, not at the first forward pass
        self.backend_name = DEFAULT_BACKEND if backend is None else backend
        self._backend = get_backend(self.backend_name, threads, exact)
        self.parts = EngineParts.engines_own()
        if self.backend_name == "learner":  # the workbook's learner facade: its classes, each in its checks
            self.parts = self._backend.engine_parts()  # type: ignore[attr-defined]
        #: a distributed rank's shard of ``source`` and the step plan that communicates (chapter 11)
        self.split = split

    @functools.cached_property
    def network(self) -> LlamaModel:
        """The weights on the backend, loaded on first use (chapter 4); a distributed rank's
        own shard of them (chapter 11)."""
        check_computable(self.source)  # every tensor's type, before any weight is read (llmrs info lists them)
        if self.split is None:
            check_host_allocation(resident_bytes(self.source, self._backend.name),
                                  f"{self.path.name} on the {self._backend.name} backend")
            network = LlamaModel(self.source, self.config, self._backend, kv_cache=self.parts.kv_cache)
            self.source.release_pages()  # the backend holds its own copies of the weights now
            return network
        part, plan = self.split
        rows = part.tensors["token_embd.weight"].shape[0]
        return LlamaModel(part, part.config, self._backend, plan=plan, vocab_rows=rows, kv_cache=self.parts.kv_cache)

    @property
    def on_host(self) -> bool:
        """Whether the backend keeps its arrays in NumPy, in host memory (the CPU backends; not ``"cuda"``)."""
        return self._backend.xp is np

    @property
    def compiles_kernels(self) -> bool:
        """Whether the backend compiles kernels (the Numba backend), so that :meth:`warm_up` matters."""
        return bool(self._backend.warm_up_sizes)

    def warm_up(self) -> float:
        """Compile the backend's kernels (or load them from Numba's cache) before anything is
        timed; returns the seconds it took (0.0 when nothing compiles). ``llmrs generate``
        calls it so that a first run reports the engine's speed, not the compiler's."""
        return self.network.warm_up()

    def backend_report(self) -> str:
        """Which implementation each operation uses (the learner backend says whose)."""
        return self._backend.describe()

    # -- the forward pass and generation (chapter 4) -----------------------

    def logits(self, ids: Sequence[int]) -> np.ndarray:
        """Logits ``[T, vocab]`` float32 of a whole sequence, from position 0 (no cache reuse)."""
        return self.network.forward(ids)

    def generate(
        self,
        prompt: str | Sequence[int] | list[str | Sequence[int]],
        max_tokens: int = 128,
        temperature: float = 0.0,
        top_p: float = 1.0,
        top_k: int = 0,
        min_p: float = 0.0,
        repetition_penalty: float = 1.0,
        presence_penalty: float = 0.0,
        frequency_penalty: float = 0.0,
        seed: int | None = None,
        stop: str | Sequence[str] = (),
        on_text: Callable[..., None] | None = None,
        allow_special: bool = False,
    ) -> Completion | list[Completion]:
        """Generate a continuation of ``prompt`` (text, or token ids).

        A list of prompts returns a list of completions, in order, computed
        together by the continuous-batching engine (chapter 7); each prompt
        gets its own sampler, seeded with ``seed``. Greedy by default; see
        :mod:`llmrs_core.sampling` for the sampling chain. Both paths sample
        with the backend's sampler and stop at the tokenizer's end-of-turn
        tokens. ``on_text(text)`` receives the text as it is generated; for a
        list of prompts it is called as ``on_text(i, text)`` for prompt ``i``.

        Text prompts are encoded as ordinary text: special-token strings in them
        (``<|im_start|>``) stay text unless ``allow_special=True``. ``stop`` is
        one string or a list of them. Every argument is checked first, with a
        ``ValueError`` naming it.
        """
        # a list of prompts (texts or id lists); a list of anything else is one prompt, checked as such
        batched = isinstance(prompt, list) and bool(prompt) and isinstance(prompt[0], (str, list, tuple, np.ndarray))
        params = SamplingParams(
            temperature=temperature, top_k=top_k, top_p=top_p, min_p=min_p,
            repetition_penalty=repetition_penalty, presence_penalty=presence_penalty,
            frequency_penalty=frequency_penalty, seed=seed,
        )
        max_tokens = check_max_tokens(max_tokens)
        stop = normalise_stop(stop)
        if batched:
            return self._generate_batch(prompt, max_tokens, params, stop, on_text, allow_special)
        ids = self._prompt_ids(prompt, max_tokens, allow_special)
        return generate_ids(
            self.network, self._tokenizer, ids, max_tokens=max_tokens, sampling=params, stop=stop,
            stop_token_ids=self._stop_token_ids(), on_text=on_text,
            sampler=self._backend.sampler(params),
        )

    def _prompt_ids(self, prompt: Any, max_tokens: int, allow_special: bool) -> list[int]:
        c = self.config
        return prompt_ids(prompt, self._tokenizer, c.vocab_size, c.context_length, max_tokens, allow_special)

    def _generate_batch(
        self, prompts: list, max_tokens: int, params: SamplingParams, stop: Sequence[str],
        on_text: Callable[[int, str], None] | None, allow_special: bool,
    ) -> list[Completion]:
        """Run the prompts together through the continuous-batching engine (chapter 7)."""
        from .engine import Engine

        encoded = []
        for i, p in enumerate(prompts):
            try:
                encoded.append(self._prompt_ids(p, max_tokens, allow_special))
            except ValueError as e:
                raise ValueError(f"prompt {i}: {e}") from None
        block_size = 16
        needed = sum(blocks_for(len(ids) + max_tokens, block_size) for ids in encoded)
        engine = Engine(self.network, self._tokenizer, num_blocks=min(max(needed, 1), 4096), block_size=block_size,
                        parts=self.parts)
        outs = engine.generate(encoded, max_tokens, params, stop, stop_token_ids=self._stop_token_ids(),
                               on_text=on_text)
        for i, out in enumerate(outs):
            if out.finish_reason == "error":
                raise RuntimeError(f"prompt {i} failed: {out.error}")
        return outs

    def chat(self, messages: Sequence[Mapping[str, Any]], *, tools: Sequence[Mapping[str, Any]] | None = None,
             chat_template_kwargs: Mapping[str, Any] | None = None, **kwargs: Any) -> Completion:
        """Generate the assistant's reply to ``messages``, rendered with the model's chat template.

        ``tools`` (JSON schemas of functions, OpenAI's shape) and ``chat_template_kwargs``
        (template variables: ``enable_thinking=False`` for Qwen3, ``date_string`` for
        Llama 3.1..., vLLM's name) go to the template; the other keyword arguments to
        :meth:`generate`. No BOS is added: the template writes it where the model wants it.

        Only the template's own structure becomes control tokens: a message
        whose *content* contains ``<|im_start|>`` or ``<|im_end|>`` cannot
        forge a turn (the content is encoded as ordinary text,
        :meth:`~llmrs_core.tokenizer.Tokenizer.encode_chat`).
        """
        from .tokenizer.messages import template_data

        if "allow_special" in kwargs:
            raise ValueError("chat() encodes message contents as text; allow_special applies to generate()")
        data = template_data(tools, chat_template_kwargs)
        # messages far too long for the context are refused before the template renders them
        precheck_chat(messages, self.tokenizer, self.config.context_length, 1, data)
        ids = self.tokenizer.encode_chat(messages, add_generation_prompt=True, tools=tools,
                                         chat_template_kwargs=chat_template_kwargs)
        return self.generate(ids, **kwargs)

    def _stop_token_ids(self) -> list[int]:
        return [] if self._tokenizer is None else self._tokenizer.stop_token_ids

    @functools.cached_property
    def _tokenizer(self) -> Tokenizer | None:
        return self.source.tokenizer()

    @property
    def tokenizer(self) -> Tokenizer:
        """The model's tokenizer, built from the GGUF's ``tokenizer.*`` metadata (chapter 2)
        or a Hugging Face directory's ``tokenizer.json``. A model file without one
        still loads and runs on token ids; asking for its tokenizer raises ``ValueError``."""
        if self._tokenizer is None:
            raise ValueError(
                f"{self.path} has no tokenizer (no tokenizer.* metadata or tokenizer.json): "
                "give token ids, not text"
            )
        return self._tokenizer

    @property
    def name(self) -> str:
        return str(self.source.metadata.get("general.name", self.path.stem))

    def file_bytes(self) -> int:
        """Size of the model file on disk."""
        return self.source.file_size

    def tensor_types(self) -> dict[str, int]:
        """How many tensors are stored in each ggml type, e.g. ``{"Q4_1": 210, ...}``."""
        return dict(Counter(t.type_name for t in self.source.tensors.values()).most_common())

    def stored_params(self) -> int:
        """Parameters actually stored in the file (sum over its tensor shapes)."""
        return sum(t.n_elements for t in self.source.tensors.values())

    def summary(self, context_length: int | None = None) -> dict:
        """Everything ``llmrs info`` prints, as a JSON-ready dict: :func:`llmrs_core.info.summary`.

        KV-cache figures are for f16 K/V at ``context_length`` tokens
        (default: the model's trained context length).
        """
        return summary(self, context_length)

    def __repr__(self) -> str:
        return f"Model({self.name!r}, {self.config.n_params:,} params, backend={self.backend_name!r})"


def load(path: str | os.PathLike[str] | None = None, backend: str | None = None,
         threads: int | None = None, tp: int = 1, pp: int = 1, comm: Communicator | None = None,
         vocab_parallel: bool = True, exact: bool = False) -> Model:
    """Load a model: SmolLM2-135M-Instruct by default (fetched if missing), a GGUF file,
    or a Hugging Face directory (``config.json`` + ``model.safetensors``, chapter 10).

    ``backend``: ``"numba"`` (default: quantised weights, fused kernels),
    ``"numpy"`` (the float32 reference the early chapters read) or
    ``"learner"``; ``threads``: the Numba backend's threads (default: all). Where the CPU
    has AVX2 the Numba backend decodes with llama.cpp's 8-bit activations and integer dot
    products (faster; agrees with llama.cpp, not with ``"numpy"`` to float32 rounding;
    chapter 8, "int8"); ``exact=True`` keeps every product on its float kernels, within
    float32 rounding of ``"numpy"``.

    ``tp`` / ``pp`` (chapter 11): this process is one rank of a tensor-parallel (``tp``)
    or pipeline-parallel (``pp``) run started by ``mpiexec -n tp*pp`` (or of ``comm``, an
    in-process group); it loads only its shard, and every rank must make the same calls
    (``generate`` returns the same completion on each). ``vocab_parallel=False`` keeps the
    embedding and output head whole on every rank. A rank that fails to load makes every
    rank raise :class:`~llmrs_core.distributed.launch.RankFailed`.

    Raises ``FileNotFoundError`` for a missing path, ``GGUFError`` (a ``ValueError``)
    for a malformed file and ``ValueError`` for an unknown backend.
    """
    if tp != 1 or pp != 1:
        from .distributed.launch import agree, connect, shard

        comm = connect(tp, pp, comm)

        def load_shard() -> Model:
            source = _open(path, backend)
            model = Model(source, backend=backend, threads=threads,
                          split=shard(source, comm, tp, pp, vocab_parallel), exact=exact)
            if not model.on_host:  # the collectives move NumPy arrays (MPI); NCCL is not built
                raise ValueError(f"tp/pp run on the CPU backends (numba, numpy); {model.backend_name!r} keeps "
                                 "its arrays on a GPU, which this engine's communicators cannot move")
            _ = model.network  # load the weights now, so that every rank knows every rank loaded
            return model

        return agree(comm, load_shard)
    source = _open(path, backend)
    return Model(source, backend=backend, threads=threads, exact=exact)


def _open(path: str | os.PathLike[str] | None, backend: str | None) -> WeightSource:
    """The weight source at ``path`` (default: SmolLM2, fetched if missing)."""
    if backend is not None and backend not in BACKENDS:
        raise ValueError(f"unknown backend {backend!r}; available: {', '.join(BACKENDS)}")
    if path is None:
        path = default_model_path()
        if not path.exists():
            path = fetch_model()
    path = Path(path)
    return HFWeights(path) if path.is_dir() else read_gguf(path)
