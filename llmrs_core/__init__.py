"""llmrs_core: the inference engine the llm-rs workbook builds, chapter by chapter.

The stable front door (see the README)::

    import llmrs_core as llmrs
    model = llmrs.load()                       # SmolLM2-135M-Instruct, fetched if missing
    model.config                               # ModelConfig (chapter 1)
    model.tokenizer.encode(text)               # chapter 2
    tok = llmrs.load_tokenizer(path)           # any GGUF (vocab-only too) or HF directory's tokenizer
    model.logits(ids)                          # [T, vocab] float32 (chapter 4)
    model.generate("prompt", max_tokens=32)    # Completion(token_ids, text, finish_reason)
    model.chat([{"role": "user", "content": "Hi"}])
"""

from .config import ConfigError, ModelConfig
from .fetch import FetchError, fetch_model
from .formats.gguf import GGUFError, read_gguf
from .generate import Completion
from .loader import Model, load
from .sampling import SamplingParams
from .tokenizer.load import load_tokenizer

__version__ = "0.1.0"

__all__ = [
    "Completion",
    "ConfigError",
    "FetchError",
    "GGUFError",
    "Model",
    "ModelConfig",
    "SamplingParams",
    "fetch_model",
    "load",
    "load_tokenizer",
    "read_gguf",
    "__version__",
]
