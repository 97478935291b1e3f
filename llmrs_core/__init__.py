"""llmrs_core: the inference engine the llm-rs workbook builds, chapter by chapter.

The stable front door (see README and DESIGN.md)::

    import llmrs_core as llmrs
    model = llmrs.load()            # SmolLM2-135M-Instruct, fetched if missing
    model.config                    # ModelConfig (chapter 1)
"""

from .config import ConfigError, ModelConfig
from .fetch import FetchError, fetch_model
from .formats.gguf import GGUFError, read_gguf
from . import sampling
from .loader import Model, load

__version__ = "0.1.0"

__all__ = [
    "ConfigError",
    "FetchError",
    "GGUFError",
    "Model",
    "ModelConfig",
    "fetch_model",
    "load",
    "read_gguf",
    "__version__",
]
