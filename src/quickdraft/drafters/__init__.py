"""Drafters: anything that proposes tokens for the target to verify (``registry`` builds them)."""

from quickdraft.drafters.base import Draft, Drafter, DrafterBase, Footprint
from quickdraft.drafters.cross_tokenizer import CrossTokenizerDrafter
from quickdraft.drafters.draft_model import DraftModelDrafter
from quickdraft.drafters.eagle import EagleDrafter
from quickdraft.drafters.eagle_head import EagleHead, load_eagle_head
from quickdraft.drafters.lookup_first import PromptLookupFirst
from quickdraft.drafters.medusa import MedusaDrafter, MedusaHeads, load_medusa_heads
from quickdraft.drafters.prompt_lookup import PromptLookupDrafter
from quickdraft.drafters.registry import KINDS, make_drafter

__all__ = [
    "KINDS",
    "CrossTokenizerDrafter",
    "Draft",
    "Drafter",
    "DrafterBase",
    "DraftModelDrafter",
    "EagleDrafter",
    "EagleHead",
    "Footprint",
    "MedusaDrafter",
    "MedusaHeads",
    "PromptLookupDrafter",
    "PromptLookupFirst",
    "load_eagle_head",
    "load_medusa_heads",
    "make_drafter",
]
