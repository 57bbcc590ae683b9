"""Medusa heads (Cai et al. 2024, arXiv:2401.10774): K small blocks on the target's last feature,
block j guessing the token j + 1 places ahead, all K drafts from one feature at once.

Words as in ``quickdraft.drafters.eagle_head``: the feature ``f_i`` is the target's last
hidden state at position ``i`` (after its final norm); ``lm_head(f_i)`` predicts ``x_{i+1}``,
which the target itself samples. Head ``j`` (1 .. K) is one residual block::

    g_j(f_i) = f_i + SiLU(W_j f_i + b_j)          # [H] -> [H]
    q_j      = softmax(lm_head(g_j(f_i)))          # guesses x_{i+j+1}, after the sampling parameters

with the target's own output layer, frozen. ``W_j`` and ``b_j`` start at zero, so an untrained head
guesses ``x_{i+1}`` again (Medusa's initialisation). Unlike an EAGLE head, a Medusa head does
not see the tokens between ``i`` and the one it guesses (not even the target's own ``x_{i+1}``):
it is cheaper (one matrix product a head, no cache, no sequential step) and less accurate the
further it guesses. Each draft token is drawn from its own ``q_j``; the rejection rule is exact
for any proposal that draft j was sampled from, so drafting stays lossless.

Checkpoints are the same folders as EAGLE heads' (``head_checkpoint``), of kind ``medusa``.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import torch
from safetensors.torch import load_file
from torch import nn

from quickdraft.config import SamplingParams
from quickdraft.drafters.base import Draft
from quickdraft.drafters.head_checkpoint import WEIGHTS_FILE, checked_head_config
from quickdraft.drafters.trained_head import TrainedHeadDrafter
from quickdraft.errors import InvalidParameterError
from quickdraft.models.base import LoadedModel
from quickdraft.processing import LogitsProcessor
from quickdraft.sampling import greedy, logits_to_probs, sample
from quickdraft.tree import TreeSpec


class MedusaHeads(nn.Module):
    """``heads`` residual blocks on a feature of width ``hidden_size``.

    Args:
        vocabulary_size: the most frequent token ids the heads were trained (and draft) over;
            ``None`` for the whole vocabulary.
    """

    kind = "medusa"

    def __init__(self, hidden_size: int, heads: int, vocabulary_size: int | None = None) -> None:
        super().__init__()
        self.hidden_size = hidden_size
        self.vocabulary_size = vocabulary_size
        self.blocks = nn.ModuleList(nn.Linear(hidden_size, hidden_size) for _ in range(heads))
        for block in self.blocks:
            nn.init.zeros_(block.weight)
            nn.init.zeros_(block.bias)

    @property
    def heads(self) -> int:
        return len(self.blocks)

    def forward(self, features: torch.Tensor) -> torch.Tensor:
        """``[..., H]`` features ``f_i`` -> ``[..., K, H]``: row ``j - 1`` guesses ``x_{i+j+1}``."""
        return torch.stack([features + nn.functional.silu(block(features)) for block in self.blocks], dim=-2)

    def checkpoint_fields(self) -> dict:
        """What ``config.json`` needs to build the heads again."""
        return {"heads": self.heads, "hidden_size": self.hidden_size}


def load_medusa_heads(folder: str | Path, target: LoadedModel) -> MedusaHeads:
    """The heads saved in ``folder``, checked against ``target``, on its device and in its dtype."""
    folder = Path(folder).expanduser()  # "medusa:~/..." reaches us unexpanded by the shell
    config = checked_head_config(folder, target, MedusaHeads.kind)
    heads = MedusaHeads(config["hidden_size"], config["heads"], config["vocabulary_size"])
    heads.load_state_dict(load_file(folder / WEIGHTS_FILE))
    return heads.to(device=target.device, dtype=target.dtype).eval().requires_grad_(False)


class MedusaDrafter(TrainedHeadDrafter):
    """Drafts up to K tokens from the target's feature of the sequence's next-to-last token.

    The last token of the sequence is the one the target chose after its last forward; the
    feature before it is the newest one the target computed, and head j guesses the j-th token
    after the sequence from it. One forward of the heads a step, whatever k (up to K).
    """

    def __init__(self, heads: MedusaHeads, target: LoadedModel) -> None:
        super().__init__(heads, target, "medusa", "Medusa heads; they reuse the target's output layer")

    @torch.inference_mode()
    def propose(
        self,
        sequence: Sequence[int],
        k: int,
        params: SamplingParams,
        generator: torch.Generator | None,
        processor: LogitsProcessor | None = None,
    ) -> Draft:
        # The heads guess all k tokens at once, so the prefix-dependent options (``processor``)
        # are left to verification: exact all the same (q is what the tokens were drawn from).
        features = self._features
        assert features is not None and features.shape[0] == len(sequence) - 1, "observe_target first"
        k = min(k, self.head.heads)
        if features.shape[0] == 0 or k < 1:
            return Draft(tokens=torch.empty(0, dtype=torch.long, device=self._output.weight.device))
        guessed = self.head(features[-1].to(self._output.weight.dtype))[:k]  # [k, H]
        logits = self._output.logits(guessed)  # [k, V]
        self.forwards += 1
        self.positions += 1
        if params.greedy:
            return Draft(tokens=greedy(logits))
        q = logits_to_probs(logits, params)  # [k, V]
        return Draft(tokens=sample(q, generator), probs=q)


def build(argument: str, target: LoadedModel, tree: TreeSpec | None) -> MedusaDrafter:
    """``draft="medusa:DIR"`` (the registry's entry): the heads trained for ``target`` in DIR."""
    if tree is not None:
        raise InvalidParameterError("Medusa heads draft chains only: no tree= with 'medusa:DIR' (use 'eagle:DIR')")
    return MedusaDrafter(load_medusa_heads(argument, target), target)
