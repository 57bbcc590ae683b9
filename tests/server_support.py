"""What the server tests share: tiny random Llamas with a tiny word-level tokenizer and a chat
template, real uvicorn servers on 127.0.0.1 in background threads (configured as ``quickdraft
serve`` configures them), and small client helpers.

A test module imports what it uses from here (which skips the module when the server or dev
extra is missing) and names this module in ``pytest_plugins`` for its fixtures.
"""

from __future__ import annotations

import json
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

pytest.importorskip("fastapi", reason="the server extra is not installed: pip install 'quickdraft[server]'")
httpx = pytest.importorskip("httpx", reason="the dev extra is not installed: pip install 'quickdraft[dev]'")
openai = pytest.importorskip("openai", reason="the dev extra is not installed: pip install 'quickdraft[dev]'")

from prometheus_client.parser import text_string_to_metric_families  # noqa: E402
from tokenizers import Tokenizer, decoders, models, pre_tokenizers  # noqa: E402
from transformers import PreTrainedTokenizerFast  # noqa: E402

from conftest import make_tiny_model  # noqa: E402
from quickdraft import FixedK, LoadedModel, SamplingParams, SpeculativeDecoder  # noqa: E402
from quickdraft.server.app import ServerConfig, create_app  # noqa: E402
from quickdraft.server.http import HTTPLimits, make_server  # noqa: E402

MODEL = "tiny"
API_KEY = "sk-test"
K = 3
CONTEXT = 256
# Both tiny models hold 2 layers x 1 KV head x 8 dims x K and V x 4 bytes = 128 bytes per
# token, 256 together: this budget admits prompt + max_tokens up to 163 tokens.
KV_BUDGET_MB = 0.04
KV_BUDGET_TOKENS = int(KV_BUDGET_MB * 2**20) // 256

WORDS = (
    "the a cat dog sat on mat hello world quick brown fox jumps over lazy red blue green one two "
    "three is was and or not code python def return if else for while print list"
).split()
SPECIAL = ["<unk>", "<s>", "</s>", "<|system|>", "<|user|>", "<|assistant|>"]
CHAT_TEMPLATE = (
    "{% for m in messages %}<|{{ m['role'] }}|> {{ m['content'] }} {% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}"
)
PROMPT = "hello world the quick brown fox"
MESSAGES = [{"role": "system", "content": "one two three"}, {"role": "user", "content": "the cat sat on the mat"}]


def make_tokenizer() -> PreTrainedTokenizerFast:
    """A word-level tokenizer over ``WORDS``: ids are stable, decoding joins words with spaces."""
    vocab = {token: i for i, token in enumerate(SPECIAL + WORDS)}
    backend = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    backend.decoder = decoders.WordPiece(prefix="##")  # no word has the prefix: joins with spaces
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=backend, unk_token="<unk>", bos_token="<s>",
                                        eos_token="</s>")
    tokenizer.chat_template = CHAT_TEMPLATE
    return tokenizer


def tiny(seed: int, tokenizer: PreTrainedTokenizerFast, name: str, delay: float = 0.0,
         delay_per_token: float = 0.0) -> LoadedModel:
    """A tiny random Llama speaking ``tokenizer``; each forward takes ``delay`` seconds more, plus
    ``delay_per_token`` per position it is fed (as a real model's prefill does). The delay is on
    the decoder stack and on its lean forward, one of which every forward runs."""
    model = make_tiny_model(seed, vocab_size=len(tokenizer), context=CONTEXT)
    loaded = LoadedModel(model.module, tokenizer, name)
    if delay or delay_per_token:
        def slow_down(module, args, kwargs) -> None:
            ids = kwargs["input_ids"] if "input_ids" in kwargs else args[0]
            time.sleep(delay + delay_per_token * ids.shape[-1])

        for stack in (model.module.get_decoder(), loaded.lean):
            if stack is not None:
                stack.register_forward_pre_hook(slow_down, with_kwargs=True)
    return loaded


class RunningServer:
    """uvicorn serving ``app`` on a free port of 127.0.0.1, in a background thread, with the
    limits ``quickdraft serve`` sets (``make_server``). Setting ``server.should_exit`` is what
    SIGTERM does (signal handlers can only be installed in the main thread)."""

    def __init__(self, app, limits: HTTPLimits) -> None:
        self.app = app
        self.socket = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.socket.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.socket.bind(("127.0.0.1", 0))
        self.port = self.socket.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self.server = make_server(app, limits, log_level="warning")
        self.thread = threading.Thread(target=self.server.run, kwargs={"sockets": [self.socket]}, daemon=True)

    def __enter__(self) -> RunningServer:
        self.thread.start()
        deadline = time.monotonic() + 10
        while not self.server.started:
            assert self.thread.is_alive() and time.monotonic() < deadline, "the server did not start"
            time.sleep(0.01)
        return self

    def __exit__(self, *exc) -> None:
        self.server.should_exit = True
        self.thread.join(15)
        self.socket.close()
        assert not self.thread.is_alive(), "the server did not stop"

    def metrics(self) -> dict[tuple[str, tuple], float]:
        """Every sample of /metrics, keyed by (name, sorted labels)."""
        text = httpx.get(f"{self.url}/metrics", headers=auth()).text
        return {(s.name, tuple(sorted(s.labels.items()))): s.value
                for family in text_string_to_metric_families(text) for s in family.samples}


def auth(key: str = API_KEY) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


def serve(decoder: SpeculativeDecoder, limits: HTTPLimits = HTTPLimits(shutdown_timeout=2), **options) -> RunningServer:
    """A server for ``decoder``; ``options`` are ``ServerConfig``'s."""
    options = {"model_name": MODEL, "kv_cache_budget_mb": KV_BUDGET_MB, "api_key": API_KEY, **options}
    return RunningServer(create_app(decoder, ServerConfig(**options)), limits)


@pytest.fixture(scope="module")
def tokenizer() -> PreTrainedTokenizerFast:
    return make_tokenizer()


@pytest.fixture(scope="module")
def target(tokenizer) -> LoadedModel:
    return tiny(1, tokenizer, "tiny-target")


@pytest.fixture(scope="module")
def draft(tokenizer) -> LoadedModel:
    return tiny(2, tokenizer, "tiny-draft")


@pytest.fixture(scope="module")
def server(target, draft) -> Iterator[RunningServer]:
    with serve(speculative(target, draft), max_queue=8) as running:
        yield running


@pytest.fixture(scope="module")
def slow_server(tokenizer) -> Iterator[RunningServer]:
    """Forwards take >= 30 ms, so a generation lasts long enough to disconnect from it; a batch
    of one request, so that a second one queues."""
    slow = tiny(1, tokenizer, "tiny-slow", delay=0.03)
    with serve(SpeculativeDecoder(slow, None), max_queue=1, api_key=None, max_batch_size=1) as running:
        yield running


@pytest.fixture(scope="module")
def client(server) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{server.url}/v1", api_key=API_KEY, max_retries=0, timeout=30)


def speculative(target: LoadedModel, draft: LoadedModel) -> SpeculativeDecoder:
    """A decoder drafting K tokens every step (``quickdraft serve --fixed-k``)."""
    return SpeculativeDecoder(target, draft, num_speculative_tokens=K, policy=FixedK(K))


def plain_greedy(target: LoadedModel, prompt, max_tokens: int, **params) -> str:
    """The reference: the target alone, greedy."""
    return SpeculativeDecoder(target, None).generate(prompt, SamplingParams(max_new_tokens=max_tokens, **params)).text




def first_sse_with_text(lines: Iterator[str]) -> dict:
    for line in lines:
        if line.startswith("data: ") and line != "data: [DONE]":
            chunk = json.loads(line[6:])
            if chunk["choices"] and chunk["choices"][0].get("text"):
                return chunk
    raise AssertionError("no text chunk arrived")


def wait_for(predicate, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.02)


def rss_bytes() -> int | None:
    status = Path("/proc/self/status")
    if not status.exists():
        return None
    line = next(line for line in status.read_text().splitlines() if line.startswith("VmRSS:"))
    return int(line.split()[1]) * 1024
