"""Drafters: anything that proposes tokens for the target to verify."""

from quickdraft.drafters.base import Draft, Drafter
from quickdraft.drafters.draft_model import DraftModelDrafter
from quickdraft.drafters.prompt_lookup import PromptLookupDrafter
from quickdraft.drafters.tree_draft_model import DraftModelTreeDrafter
from quickdraft.drafters.tree_prompt_lookup import PromptLookupTreeDrafter

__all__ = [
    "Draft",
    "Drafter",
    "DraftModelDrafter",
    "DraftModelTreeDrafter",
    "PromptLookupDrafter",
    "PromptLookupTreeDrafter",
]
