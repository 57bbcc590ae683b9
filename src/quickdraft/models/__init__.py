"""Models: loading (demo names, folders, GGUF files, the hub cache), the demo registry, tokenizer checks."""

from quickdraft.models.base import LoadedModel
from quickdraft.models.demo import DEMO_MODELS
from quickdraft.models.loading import load_model
from quickdraft.models.tokenizers import check_tokenizers_compatible

__all__ = ["DEMO_MODELS", "LoadedModel", "check_tokenizers_compatible", "load_model"]
