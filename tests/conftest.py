"""Tiny random models built from a config: the plumbing tests run on these, on the CPU, in ms."""

from __future__ import annotations

import itertools
import math
import os

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

from quickdraft.models import DEMO_MODELS
from quickdraft.models.base import LoadedModel
from quickdraft.models.demo import missing_parts
from quickdraft.sampling import logits_to_probs

# Tiny models run thousands of forwards of a few hundred flops each: one thread avoids paying
# a thread hand-off per operation (about 7x faster here). Real-model tests raise it again.
torch.set_num_threads(1)


def make_tiny_model(
    seed: int,
    vocab_size: int = 8,
    hidden_size: int = 16,
    num_layers: int = 2,
    context: int = 128,
    init_scale: float = 0.6,
    name: str | None = None,
) -> LoadedModel:
    """A random Llama with a tiny vocabulary and no tokenizer (token ids only).

    ``init_scale`` (the init std) is large so that next-token distributions are far from
    uniform and depend on the context: a test with flat distributions would pass anything.
    """
    config = LlamaConfig(
        vocab_size=vocab_size,
        hidden_size=hidden_size,
        intermediate_size=2 * hidden_size,
        num_hidden_layers=num_layers,
        num_attention_heads=2,
        num_key_value_heads=1,
        max_position_embeddings=context,
        initializer_range=init_scale,
        tie_word_embeddings=False,
        bos_token_id=None,
        eos_token_id=None,
        pad_token_id=None,
    )
    torch.manual_seed(seed)
    module = LlamaForCausalLM(config).eval()
    return LoadedModel(module=module, tokenizer=None, name=name or f"tiny-{seed}")


def make_tiny_qwen2(seed: int, vocab_size: int = 16, sliding_window: int | None = None) -> LoadedModel:
    """A random Qwen2 (biases on queries, keys and values; grouped query heads); with
    ``sliding_window``, every layer attends to that many positions only."""
    config = Qwen2Config(
        vocab_size=vocab_size, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128, initializer_range=0.6,
        tie_word_embeddings=False, use_sliding_window=sliding_window is not None,
        sliding_window=sliding_window, max_window_layers=0,
        bos_token_id=None, eos_token_id=None, pad_token_id=None,
    )
    torch.manual_seed(seed)
    module = Qwen2ForCausalLM(config).eval()
    return LoadedModel(module=module, tokenizer=None, name=f"tiny-qwen2-{seed}")


@pytest.fixture(scope="session")
def tiny_target() -> LoadedModel:
    return make_tiny_model(seed=1, name="tiny-target")


@pytest.fixture(scope="session")
def tiny_draft() -> LoadedModel:
    """Another random model: a draft that is far from the target."""
    return make_tiny_model(seed=2, name="tiny-draft")


def chi_square_p_value(observed: torch.Tensor, expected_probs: torch.Tensor) -> float:
    """Pearson chi-square goodness-of-fit p-value.

    Cells with expected count < 5 are pooled into one cell (the test's approximation needs
    it). Observations in cells of probability 0 fail outright: the sampler produced something
    that is impossible under the target.
    """
    observed = observed.double()
    expected = expected_probs.double() * observed.sum()
    impossible = expected_probs == 0
    if observed[impossible].sum() > 0:
        return 0.0
    small = (expected < 5) & ~impossible
    obs_cells = torch.cat([observed[~small & ~impossible], observed[small].sum().reshape(1)])
    exp_cells = torch.cat([expected[~small & ~impossible], expected[small].sum().reshape(1)])
    keep = exp_cells > 0
    obs_cells, exp_cells = obs_cells[keep], exp_cells[keep]
    dof = obs_cells.numel() - 1
    if dof < 1:
        return 1.0
    stat = ((obs_cells - exp_cells) ** 2 / exp_cells).sum()
    # Survival function of chi-square(dof) = regularised upper incomplete gamma Q(dof/2, x/2).
    p = torch.special.gammaincc(torch.tensor(dof / 2.0, dtype=torch.float64), stat / 2.0)
    return float(p) if math.isfinite(float(p)) else 0.0


def exact_continuation_probs(model, prompt, length, params) -> torch.Tensor:
    """``[V ** length]`` probability of each continuation under plain sampling from ``model``."""
    vocab = model.vocab_size
    joint = torch.ones(1, dtype=torch.float64)
    for depth in range(length):
        prefixes = [list(prompt) + list(c) for c in itertools.product(range(vocab), repeat=depth)]
        with torch.inference_mode():
            logits = model.module(input_ids=torch.tensor(prefixes)).logits[:, -1]  # [V**d, V]
        step = logits_to_probs(logits, params).double()
        joint = (joint[:, None] * step).reshape(-1)  # continuation index = base-V digits
    return joint


def requires_demo(*names: str) -> pytest.MarkDecorator:
    """Skip unless every part package of the named demo models is installed."""
    missing = [name for name in names if missing_parts(DEMO_MODELS[name])]
    commands = sorted({DEMO_MODELS[name].install_command for name in missing})
    return pytest.mark.skipif(
        bool(missing), reason=f"part packages of {', '.join(missing)} not installed: {'; '.join(commands)}"
    )


@pytest.fixture
def real_threads():
    """Real models use every core; tiny-model tests run on one."""
    torch.set_num_threads(os.cpu_count() or 1)
    yield
    torch.set_num_threads(1)


def char_tokenizer(alphabet: str):
    """A tokenizer with one token per character (ids 2..), ``<unk>`` = 0 and eos ``</s>`` = 1;
    decoding concatenates characters exactly, so text positions map to tokens one to one."""
    from tokenizers import Regex, Tokenizer, decoders, pre_tokenizers
    from tokenizers.models import WordLevel
    from transformers import PreTrainedTokenizerFast

    symbols = ["<unk>", "</s>", *alphabet]
    backend = Tokenizer(WordLevel({s: i for i, s in enumerate(symbols)}, unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.Split(Regex("."), "isolated")
    backend.decoder = decoders.Fuse()
    return PreTrainedTokenizerFast(tokenizer_object=backend, unk_token="<unk>", eos_token="</s>")


@pytest.fixture(scope="session")
def char_model() -> LoadedModel:
    """A tiny random model over the characters ``abcd`` and space, with its tokenizer."""
    tokenizer = char_tokenizer("abcd ")
    model = make_tiny_model(seed=5, vocab_size=len(tokenizer), name="tiny-chars")
    return LoadedModel(module=model.module, tokenizer=tokenizer, name=model.name)


def byte_level_char_tokenizer(alphabet: str):
    """One token per character (ids 2..), ``<unk>`` = 0, eos ``</s>`` = 1, with a byte-level
    decoder, the kind llguidance reads (structured output); the space is byte-level ``Ġ``."""
    from tokenizers import Regex, Tokenizer, decoders, pre_tokenizers
    from tokenizers.models import WordLevel
    from transformers import PreTrainedTokenizerFast

    symbols = ["<unk>", "</s>", *alphabet.replace(" ", "Ġ")]
    backend = Tokenizer(WordLevel({s: i for i, s in enumerate(symbols)}, unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.Sequence(
        [pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False), pre_tokenizers.Split(Regex("."), "isolated")]
    )
    backend.decoder = decoders.ByteLevel()
    return PreTrainedTokenizerFast(tokenizer_object=backend, unk_token="<unk>", eos_token="</s>")


def json_model(seed: int) -> LoadedModel:
    """A tiny random model over the characters of small JSON documents, with its tokenizer."""
    tokenizer = byte_level_char_tokenizer('{}[]":,ab0123456789truefls ')
    model = make_tiny_model(seed=seed, vocab_size=len(tokenizer), name=f"tiny-json-{seed}")
    return LoadedModel(module=model.module, tokenizer=tokenizer, name=model.name)

