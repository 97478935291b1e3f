"""Chapter 1 solutions. Exercise 1.6's ModelConfig *is* the engine's config."""

from llmrs_core.config import ConfigError, ModelConfig

__all__ = ["ConfigError", "ModelConfig"]
