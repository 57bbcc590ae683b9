"""Drafters: anything that proposes tokens for the target to verify."""

from quickdraft.drafters.base import Draft, Drafter
from quickdraft.drafters.draft_model import DraftModelDrafter
from quickdraft.drafters.prompt_lookup import PromptLookupDrafter

__all__ = ["Draft", "Drafter", "DraftModelDrafter", "PromptLookupDrafter"]
