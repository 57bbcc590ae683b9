"""The exceptions quickdraft raises for bad input.

Every error says what was wrong and what to do about it. They subclass ``ValueError`` (or
``FileNotFoundError``) so callers that already catch those keep working; entry points (CLI,
server) catch ``QuickdraftError`` and turn it into a message and an exit code or a 4xx response.
"""

from __future__ import annotations


class QuickdraftError(Exception):
    """Base class for every error quickdraft raises on purpose."""


class InvalidParameterError(QuickdraftError, ValueError):
    """A sampling or speculation parameter is out of range (K < 1, temperature < 0, ...)."""


class ModelNotFoundError(QuickdraftError, FileNotFoundError):
    """A model name or path could not be resolved to weights on this machine."""


class TokenizerMismatchError(QuickdraftError, ValueError):
    """Target and draft do not share a vocabulary, so their token ids are not comparable."""


class ContextLengthError(QuickdraftError, ValueError):
    """The prompt (plus the tokens asked for) does not fit in the model's context window."""


class UnsupportedModelError(QuickdraftError, ValueError):
    """The model cannot be used for speculation (e.g. its cache cannot be rolled back)."""


class CorruptModelFileError(QuickdraftError):
    """A model file failed its checksum or could not be read."""


class CheckpointMismatchError(QuickdraftError, ValueError):
    """A trained drafter's checkpoint belongs to another target model (or to other settings)."""
