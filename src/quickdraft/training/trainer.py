"""Training an EAGLE head on the target's stored features, resumable from its last checkpoint.

Per chunk of ``T`` tokens ``x_0 .. x_{T-1}`` with the target's features ``f_0 .. f_{T-1}``
(words as in ``quickdraft.drafters.eagle_head``), the head's position ``i`` (0 .. T-2) reads
``x_{i+1}`` and ``f_i`` (plus uniform noise, so that it learns to draft from imperfect features
as it must from its own) and predicts ``f^_{i+1}``. The loss::

    CE(softmax(W f_{i+1}), log_softmax(W f^_{i+1})) + feature_weight * smooth_l1(f^_{i+1}, f_{i+1})

with ``W`` the target's frozen output layer cut to the ``vocabulary_size`` most frequent token
ids: the target's distribution comes from the stored feature on the fly, none is stored.
EAGLE-1's loss is ``feature_weight=10`` (its 1 : 0.1 weighting); the default is the token term
alone, as in EAGLE-3, which learned faster here (docs/trained_drafters.md). The
**top-1 agreement** reported is the share of positions where the head's most likely token is
the target's, what greedy acceptance of a first draft token would be.

With ``unroll = k > 1`` the head is also trained as it drafts tokens 2 .. k, on its own
predicted features (EAGLE-3's training-time test, ``unrolled_predictions``), and the mean
top-1 agreement of those steps is reported beside the first's.

``kind="medusa"`` trains Medusa heads (``quickdraft.drafters.medusa``) instead: head ``j`` at
position ``i`` reads ``f_i`` and learns ``softmax(W f_{i+j})``, the target's distribution of
``x_{i+j+1}``, by the same cross-entropy (``_medusa_loss``); head 1's agreement is the first
draft token's, the other heads' the later ones'.

Checkpoints, under the output folder: ``train/state.pt`` (head, optimizer, position in the
run; every ``save_every`` steps and at each epoch's end) and, after every epoch, the usable head
itself (``head.safetensors`` + ``config.json``, ``head_checkpoint.save_head``).
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn
from tqdm.auto import tqdm
from transformers import DynamicCache

from quickdraft.drafters.eagle_head import EagleHead, head_decoder_config
from quickdraft.drafters.medusa import MedusaHeads
from quickdraft.drafters.head_checkpoint import save_head
from quickdraft.drafters.registry import DEFAULT_DRAFT_VOCABULARY
from quickdraft.errors import CheckpointMismatchError, InvalidParameterError
from quickdraft.models.base import LoadedModel
from quickdraft.tree import additive_mask


@dataclass(frozen=True)
class TrainConfig:
    """How a head is trained; the defaults are sized for the demo target (docs/trained_drafters.md).

    Attributes:
        kind: ``"eagle"`` (one decoder layer) or ``"medusa"`` (``heads`` residual blocks).
        tokens: target tokens to collect features for (chunks of ``seq_len``).
        seq_len: tokens per chunk.
        epochs: passes over the chunks; may be raised when resuming, to train further.
        batch_size: chunks per optimizer step.
        lr: AdamW learning rate, reached after a linear warm-up of ``warmup_steps``.
        warmup_steps: optimizer steps of the warm-up.
        feature_weight: weight of the feature term (the cross-entropy has weight 1).
        feature_noise: half-width ``a`` of the uniform noise ``U(-a, a)`` added to input features.
        unroll: drafting steps trained per anchor: 1 is teacher forcing alone; ``k > 1`` also
            trains steps ``2 .. k`` on the head's own features (``unrolled_predictions``).
        heads: Medusa heads, the most tokens they draft a step (``kind="medusa"`` only).
        anchors: positions per chunk, drawn at random each step, that the unrolled steps (or the
            Medusa heads) draft from in the loss; ``None``: every position with room after it.
        intermediate_size: the width of the head's MLP; ``None``: ``head_decoder_config``'s
            default (2,048 for the demo target, whose own layers are 8,960 wide).
        vocabulary_size: most frequent token ids the loss covers and the head drafts over;
            ``None``: the whole vocabulary.
        seed: initialisation, data order and noise.
        save_every: optimizer steps between checkpoints of the training state.
    """

    kind: str = "eagle"
    tokens: int = 120_000
    seq_len: int = 512
    epochs: int = 5
    batch_size: int = 1
    lr: float = 3e-4
    warmup_steps: int = 20
    feature_weight: float = 0.0
    feature_noise: float = 0.1
    unroll: int = 1
    heads: int = 4
    anchors: int | None = None
    intermediate_size: int | None = None
    vocabulary_size: int | None = DEFAULT_DRAFT_VOCABULARY
    seed: int = 0
    save_every: int = 25

    def __post_init__(self) -> None:
        if self.kind not in ("eagle", "medusa"):
            raise InvalidParameterError(f"kind must be 'eagle' or 'medusa', got {self.kind!r}")
        if self.kind == "medusa" and (self.unroll != 1 or self.feature_weight):
            raise InvalidParameterError("unroll and feature_weight apply to EAGLE heads: leave them at 1 and 0 "
                                        "for Medusa heads, which draft from the target's own feature")
        counts = (self.tokens, self.seq_len - 1, self.epochs, self.batch_size, self.save_every, self.unroll, self.heads,
                  1 if self.intermediate_size is None else self.intermediate_size,
                  1 if self.anchors is None else self.anchors)
        if min(counts) < 1 or self.lr <= 0 or self.feature_weight < 0:
            raise InvalidParameterError(
                "need tokens, epochs, batch_size, save_every, unroll, heads, anchors, intermediate_size >= 1, "
                "seq_len >= 2, lr > 0 and feature_weight >= 0"
            )
        if self.reach > self.seq_len - 1:
            raise InvalidParameterError(
                f"{self.kind} drafts reaching {self.reach} tokens need chunks of more than {self.reach} tokens "
                f"(seq_len {self.seq_len})")

    @property
    def reach(self) -> int:
        """Tokens after an anchor that the loss drafts: ``unroll`` (EAGLE) or ``heads`` (Medusa)."""
        return self.heads if self.kind == "medusa" else self.unroll

    def new_head(self, target_config) -> nn.Module:
        """A freshly initialised head of this kind for a target with ``target_config``."""
        if self.kind == "medusa":
            return MedusaHeads(target_config.get_text_config().hidden_size, self.heads, self.vocabulary_size)
        return EagleHead(head_decoder_config(target_config, self.intermediate_size), self.vocabulary_size)


def _total(config: TrainConfig, feature_loss: torch.Tensor | float, cross_entropy: torch.Tensor | float):
    """The optimised loss from its two terms (tensors, or their running sums as floats)."""
    return cross_entropy + config.feature_weight * feature_loss


def _unroll_mask(anchors: torch.Tensor, positions: int, step: int) -> torch.Tensor:
    """``[S, positions + (step - 1) * S]`` bool: what the nodes of unrolled step ``step`` (>= 2) see.

    Node ``s`` drafts from anchor ``a_s``, as the head does when ``a_s`` is the last position
    with the target's feature: it sees the first pass's positions ``0 .. a_s`` and its own
    chain's nodes of steps ``2 .. step`` (itself last), not the other chains.
    """
    first = torch.arange(positions, device=anchors.device)[None] <= anchors[:, None]  # [S, positions]
    own = torch.eye(anchors.shape[0], dtype=torch.bool, device=anchors.device)  # [S, S]
    return torch.cat([first] + [own] * (step - 1), dim=1)


def unrolled_predictions(
    head: EagleHead, embeddings: torch.Tensor, features: torch.Tensor, unroll: int = 1,
    anchors: torch.Tensor | None = None,
) -> list[torch.Tensor]:
    """The head's predicted features at step 1 and at the unrolled steps ``2 .. unroll``.

    Step 1 is teacher forced: position ``i`` reads the target's feature ``f_i``. Steps
    ``2 .. unroll`` are the training-time test of EAGLE-3 (arXiv:2503.01840): from each anchor
    ``a``, node ``a + k - 1`` of step ``k`` reads the head's own output of step ``k - 1`` instead of
    the target's feature and attends as ``_unroll_mask`` says, exactly what drafting the ``k``-th
    token after ``a`` computes. Its token input is that of its position: drafts after a wrong
    token are rejected anyway, so only the chains of right tokens need to be learned.

    Args:
        embeddings: ``[B, T, H]`` of ``x_{i+1}``; features: ``[B, T, H]`` ``f_i`` (with noise);
        anchors: ``[S]`` distinct positions in ``0 .. T - unroll``, needed when ``unroll > 1``.

    Returns:
        ``[B, T, H]`` (step 1, ``f^_{i+1}`` at every position), then ``[B, S, H]`` per unrolled
        step ``k`` (``f^`` after the node ``a + k - 1`` of each anchor).
    """
    cache = DynamicCache(config=head.config) if unroll > 1 else None
    outputs = [head(embeddings, features, cache)]  # [B, T, H]
    if unroll > 1:
        assert anchors is not None and int(anchors.max()) <= embeddings.shape[1] - unroll, anchors
        previous = outputs[0][:, anchors]  # [B, S, H]
        for step in range(2, unroll + 1):
            nodes = anchors + step - 1  # [S] the positions of this step's nodes
            mask = additive_mask(_unroll_mask(anchors, embeddings.shape[1], step), previous.dtype)
            previous = head(embeddings[:, nodes], previous, cache, nodes[None], mask)  # [B, S, H]
            outputs.append(previous)
    return outputs


def _loss(
    head: EagleHead, embed: torch.nn.Module, out_rows: torch.Tensor, tokens: torch.Tensor,
    features: torch.Tensor, noise: torch.Tensor, unroll: int = 1, anchors: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Feature loss, cross-entropy and top-1 agreement of one batch's step 1, and the top-1
    agreement of its unrolled steps (``nan`` when ``unroll`` is 1); 0-dim tensors.

    The cross-entropy is the mean over the steps (``unrolled_predictions``); the feature loss
    is step 1's, the only step with the target's features to compare with.

    Args:
        tokens: ``[B, T]`` chunk tokens; features: ``[B, T, H]`` their float32 target features;
        noise: ``[B, T - 1, H]`` added to the input features; out_rows: ``[R, H]`` output layer rows;
        anchors: ``[S]`` anchor positions in ``0 .. T - 1 - unroll`` of the unrolled steps.
    """
    with torch.no_grad():
        embeddings = embed(tokens[:, 1:]).float()  # [B, T-1, H] of x_{i+1}
        wanted = features[:, 1:]  # [B, T-1, H] f_{i+1}
        target_logits = wanted @ out_rows.T  # [B, T-1, R]
    outputs = unrolled_predictions(head, embeddings, features[:, :-1] + noise, unroll, anchors)
    cross_entropies, agreements = [], []
    for step, predicted in enumerate(outputs):
        wanted_logits = target_logits if step == 0 else target_logits[:, anchors + step]  # [B, T-1 or S, R]
        logits = predicted @ out_rows.T
        cross_entropies.append(-(torch.softmax(wanted_logits, -1) * torch.log_softmax(logits, -1)).sum(-1).mean())
        agreements.append((logits.argmax(-1) == wanted_logits.argmax(-1)).float().mean())
    feature_loss = F.smooth_l1_loss(outputs[0], wanted)
    later = torch.stack(agreements[1:]).mean() if unroll > 1 else torch.tensor(float("nan"))
    return feature_loss, torch.stack(cross_entropies).mean(), agreements[0], later


def _medusa_loss(
    heads: MedusaHeads, out_rows: torch.Tensor, features: torch.Tensor, anchors: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """As ``_loss``, for Medusa heads drafting from ``anchors`` (``[S]`` positions in ``0 .. T-1-K``).

    Args:
        features: ``[B, T, H]`` float32 target features; out_rows: ``[R, H]`` output layer rows.

    Returns:
        A zero feature loss (there is none), the cross-entropy over the heads, head 1's top-1
        agreement and the mean of the other heads' (``nan`` with one head).
    """
    ahead = torch.arange(1, heads.heads + 1, device=anchors.device)  # [K]
    with torch.no_grad():
        target_logits = features[:, anchors[:, None] + ahead] @ out_rows.T  # [B, S, K, R] of x_{i+j+1}
    logits = heads(features[:, anchors]) @ out_rows.T  # [B, S, K, R]
    cross_entropy = -(torch.softmax(target_logits, -1) * torch.log_softmax(logits, -1)).sum(-1).mean()
    agreements = (logits.argmax(-1) == target_logits.argmax(-1)).float().mean(dim=(0, 1))  # [K]
    later = agreements[1:].mean() if heads.heads > 1 else torch.tensor(float("nan"))
    return torch.zeros(()), cross_entropy, agreements[0], later


def train_head(
    target: LoadedModel,
    tokens: torch.Tensor,
    features: torch.Tensor,
    folder: Path,
    config: TrainConfig,
    progress: bool = True,
    log: Callable[[str], None] = print,
    record: dict | None = None,
) -> dict:
    """Train (or resume training) a head on ``tokens`` (``[N, T]``) and ``features`` (``[N, T, H]``).

    Saves the head into ``folder`` after every epoch, with ``record`` (what the data was) and
    the per-epoch history in its config; returns that training record.
    """
    device = target.device
    state_path = folder / "train" / "state.pt"
    state_path.parent.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(config.seed)
    head = config.new_head(target.module.config).to(device).float().train()
    optimizer = torch.optim.AdamW(head.parameters(), lr=config.lr, betas=(0.9, 0.95), weight_decay=0.0)
    epoch, step, sums, history = 0, 0, [0.0] * 4, []
    if state_path.is_file():
        state = torch.load(state_path, map_location=device, weights_only=True)
        previous = {**state["config"], "epochs": config.epochs}
        if previous != asdict(config):
            raise CheckpointMismatchError(
                f"{folder} holds a training run with other settings ({state['config']}); resume it "
                "with the same options (only --epochs may change) or give a new --out folder"
            )
        head.load_state_dict(state["head"])
        optimizer.load_state_dict(state["optimizer"])
        epoch, step, sums, history = state["epoch"], state["step"], state["sums"], state["history"]
        log(f"resuming training at epoch {epoch + 1}, step {step}")

    def save_state() -> None:
        state = {"config": asdict(config), "head": head.state_dict(), "optimizer": optimizer.state_dict(),
                 "epoch": epoch, "step": step, "sums": sums, "history": history}
        torch.save(state, state_path.with_suffix(".tmp"))
        os.replace(state_path.with_suffix(".tmp"), state_path)

    embed = target.module.get_input_embeddings()
    rows = min(target.vocab_size, config.vocabulary_size or target.vocab_size)
    out_rows = target.module.get_output_embeddings().weight[:rows].detach().float()  # [R, H]
    n = tokens.shape[0]
    steps = math.ceil(n / config.batch_size)
    record = {**(record or {}), "chunks": n, "seq_len": tokens.shape[1], "config": asdict(config)}
    while epoch < config.epochs:
        order = torch.randperm(n, generator=torch.Generator().manual_seed(config.seed + epoch))
        bar = tqdm(total=steps, initial=step, desc=f"epoch {epoch + 1}/{config.epochs}", unit="step",
                   disable=not progress)
        while step < steps:
            batch = order[step * config.batch_size : (step + 1) * config.batch_size]
            chunk_tokens = tokens[batch].to(device)  # [B, T]
            chunk_features = features[batch].to(device).float()  # [B, T, H]
            # Noise seeded by position in the run: a resumed run draws what it would have drawn.
            draws = torch.Generator().manual_seed(config.seed * 1_000_003 + epoch * steps + step)
            noise = (torch.rand(chunk_features[:, 1:].shape, generator=draws) * 2 - 1).to(device)
            anchors = torch.randperm(chunk_tokens.shape[1] - config.reach, generator=draws)[:config.anchors].sort().values
            if config.kind == "medusa":
                feature_loss, cross_entropy, agreement, later = _medusa_loss(
                    head, out_rows, chunk_features, anchors.to(device))
            else:
                feature_loss, cross_entropy, agreement, later = _loss(
                    head, embed, out_rows, chunk_tokens, chunk_features, noise * config.feature_noise,
                    config.unroll, anchors.to(device))
            loss = _total(config, feature_loss, cross_entropy)
            for group in optimizer.param_groups:
                group["lr"] = config.lr * min(1.0, (epoch * steps + step + 1) / config.warmup_steps)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(head.parameters(), 0.5)
            optimizer.step()
            step += 1
            # Host sync once a step: the progress bar shows the running means.
            for i, value in enumerate((feature_loss, cross_entropy, agreement, later)):
                sums[i] += float(value.detach()) if config.reach > 1 or i < 3 else 0.0
            bar.update(1)
            shown = {"loss": f"{_total(config, *sums[:2]) / step:.4f}", "top1": f"{sums[2] / step:.3f}"}
            if config.reach > 1:
                shown[f"top1@2-{config.reach}"] = f"{sums[3] / step:.3f}"
            bar.set_postfix(shown)
            if step % config.save_every == 0 and step < steps:
                save_state()
        bar.close()
        history.append({"epoch": epoch + 1, "feature_loss": sums[0] / steps, "cross_entropy": sums[1] / steps,
                        "loss": _total(config, *sums[:2]) / steps, "top1_agreement": sums[2] / steps,
                        "later_top1_agreement": sums[3] / steps if config.reach > 1 else None})
        later_note = (f", draft tokens 2-{config.reach} {history[-1]['later_top1_agreement']:.3f}"
                      if config.reach > 1 else "")
        log(f"epoch {epoch + 1}: loss {history[-1]['loss']:.4f}, "
            f"top-1 agreement {history[-1]['top1_agreement']:.3f}{later_note}")
        epoch, step, sums = epoch + 1, 0, [0.0] * 4
        save_head(head, target, folder, {**record, "epochs_done": epoch, "history": history})
        save_state()
    return {**record, "epochs_done": epoch, "history": history}
