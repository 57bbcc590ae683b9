"""Drafters: anything that proposes tokens for the target to verify."""

from quickdraft.drafters.base import Draft, Drafter, FeatureDrafter
from quickdraft.drafters.cross_tokenizer import CrossTokenizerDrafter
from quickdraft.drafters.draft_model import DraftModelDrafter
from quickdraft.drafters.eagle import EagleDrafter, EagleTreeDrafter
from quickdraft.drafters.eagle_head import EagleHead, load_eagle_head
from quickdraft.drafters.medusa import MedusaDrafter, MedusaHeads, load_medusa_heads
from quickdraft.drafters.prompt_lookup import PromptLookupDrafter
from quickdraft.drafters.tree_draft_model import DraftModelTreeDrafter
from quickdraft.drafters.tree_prompt_lookup import PromptLookupTreeDrafter

__all__ = [
    "CrossTokenizerDrafter",
    "Draft",
    "Drafter",
    "FeatureDrafter",
    "DraftModelDrafter",
    "DraftModelTreeDrafter",
    "EagleDrafter",
    "EagleHead",
    "EagleTreeDrafter",
    "MedusaDrafter",
    "MedusaHeads",
    "PromptLookupDrafter",
    "PromptLookupTreeDrafter",
    "load_eagle_head",
    "load_medusa_heads",
]
