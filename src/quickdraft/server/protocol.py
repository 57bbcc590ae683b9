"""The OpenAI wire format: request models, response bodies, stream chunks and error bodies.

Requests are validated by pydantic in strict JSON mode, so ``"max_tokens": "5"`` is refused
rather than coerced. Unknown fields are ignored (clients send ``user`` ...); known fields whose
non-default values quickdraft does not implement are refused with a 400 (``echo``,
``best_of``, ``tools`` and function calling), never silently dropped. Every sampling option is
implemented, lossless under speculation (docs/sampling.md): penalties, ``min_p``,
``logit_bias``, ``logprobs``, ``n``, ``stop_token_ids``, ``response_format`` and the ``regex`` /
``grammar`` extensions.

Responses are plain dicts shaped exactly like OpenAI's, plus one extension field,
``"quickdraft"``, with the request's own speculative statistics.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Callable
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from quickdraft.engine import TokenLogprob
from quickdraft.stats import DecodeStats

# Completions without max_tokens generate this many tokens, as OpenAI's /v1/completions does.
COMPLETIONS_DEFAULT_MAX_TOKENS = 16


class APIError(Exception):
    """An error the client caused (4xx) or the server reports (5xx), in OpenAI's shape.

    The body is ``{"error": {"message", "type", "param", "code"}}``.
    """

    def __init__(
        self,
        status: int,
        message: str,
        type: str = "invalid_request_error",
        param: str | None = None,
        code: str | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.type = type
        self.param = param
        self.code = code
        self.headers = headers or {}

    def body(self) -> dict[str, Any]:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}


class StreamOptions(BaseModel):
    model_config = ConfigDict(strict=True, extra="ignore")

    include_usage: bool = False


class JsonSchemaFormat(BaseModel):
    model_config = ConfigDict(strict=True, extra="ignore")

    name: str | None = None
    schema_: dict[str, Any] | bool = Field(default_factory=dict, alias="schema")
    strict: bool | None = None


class ResponseFormat(BaseModel):
    """OpenAI's ``response_format``: ``text``, ``json_object`` or ``json_schema``."""

    model_config = ConfigDict(strict=True, extra="ignore")

    type: Literal["text", "json_object", "json_schema"]
    json_schema: JsonSchemaFormat | None = None

    def as_dict(self) -> dict[str, Any]:
        """The ``SamplingParams.response_format`` form."""
        if self.json_schema is None:
            return {"type": self.type}
        return {"type": self.type, "json_schema": {"name": self.json_schema.name, "schema": self.json_schema.schema_}}


class SamplingRequest(BaseModel):
    """Fields shared by both endpoints, named as OpenAI names them."""

    model_config = ConfigDict(strict=True, extra="ignore")

    model: str | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    temperature: float | None = Field(default=None, ge=0, le=2, description="OpenAI's range and default (1.0)")
    top_p: float | None = None
    top_k: int | None = Field(default=None, description="extension (vLLM's name); 0 or -1 = off")
    stop: str | list[str] | None = None
    seed: int | None = None
    n: int | None = None
    ignore_eos: bool = Field(default=False, description="extension (vLLM's name): generate max_tokens exactly")
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    logit_bias: dict[str, float] | None = None
    response_format: ResponseFormat | None = None
    min_p: float | None = Field(default=None, description="extension (vLLM's name)")
    repetition_penalty: float | None = Field(default=None, description="extension (vLLM's name)")
    stop_token_ids: list[int] | None = Field(default=None, description="extension (vLLM's name)")
    regex: str | None = Field(default=None, description="extension: the output matches this regular expression")
    grammar: str | None = Field(default=None, description="extension: the output follows this Lark grammar")
    num_speculative_tokens: int | None = Field(
        default=None, description="extension: the most tokens drafted per step for this request, up to the server's "
        "K (0: no speculation); the output does not depend on it")

    def top_logprobs_asked(self) -> int | None:
        """None: no logprobs; else how many most likely tokens to report per position."""
        raise NotImplementedError


class CompletionRequest(SamplingRequest):
    """``POST /v1/completions``: one prompt, as text or as a list of token ids."""

    prompt: str | list[int] | list[str]
    max_tokens: int | None = None
    logprobs: int | None = Field(default=None, description="report this many most likely tokens (0-5)")
    echo: bool = False
    best_of: int | None = None

    def top_logprobs_asked(self) -> int | None:
        return self.logprobs


class TextPart(BaseModel):
    model_config = ConfigDict(strict=True, extra="ignore")

    type: Literal["text"]
    text: str


class ChatMessage(BaseModel):
    model_config = ConfigDict(strict=True, extra="ignore")

    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[TextPart] | None = None

    def text(self) -> str:
        if self.content is None:
            return ""
        if isinstance(self.content, str):
            return self.content
        return "".join(part.text for part in self.content)


class ChatCompletionRequest(SamplingRequest):
    """``POST /v1/chat/completions``: messages rendered through the tokenizer's chat template."""

    messages: list[ChatMessage] = Field(min_length=1)
    max_tokens: int | None = None
    max_completion_tokens: int | None = None
    logprobs: bool | None = None
    top_logprobs: int | None = None
    # Declared only to be refused (check_unsupported): a client relying on them must not get
    # plain text as if they had been honoured.
    tools: list[Any] | None = None
    tool_choice: Any = None
    functions: list[Any] | None = None
    function_call: Any = None

    def top_logprobs_asked(self) -> int | None:
        if self.top_logprobs is not None and not self.logprobs:
            raise APIError(400, "top_logprobs needs logprobs: true", param="top_logprobs")
        return (self.top_logprobs or 0) if self.logprobs else None


def parse_request(body: bytes, model: type[SamplingRequest]) -> Any:
    """Validate a JSON body into ``model``; raise a 400 ``APIError`` naming the bad field."""
    try:
        return model.model_validate_json(body)
    except ValidationError as error:
        first = error.errors()[0]
        if first["type"] == "json_invalid":
            raise APIError(400, f"the request body is not valid JSON: {first['msg']}", code="invalid_json") from None
        if first["type"] == "model_type" and not first["loc"]:
            raise APIError(400, "the request body must be a JSON object", code="invalid_json") from None
        param = _param_name(first["loc"])
        if first["type"] == "model_type":
            raise APIError(400, f"{param} must be a JSON object", param=param, code="invalid_type") from None
        if first["type"] == "missing":
            raise APIError(400, f"{param} is required", param=param, code="missing_required_parameter") from None
        raise APIError(400, f"{param}: {first['msg']}", param=param, code="invalid_type") from None


def _param_name(loc: tuple) -> str:
    """The field a validation error is about: ``temperature``, or ``messages.0.role``.

    pydantic appends the union alternative it tried (``('stop', 'list[str]', 0)``); a client
    wants the field's name only.
    """
    if loc[0] == "messages" and len(loc) >= 3:
        return f"messages.{loc[1]}.{loc[2]}"
    return str(loc[0])


def check_unsupported(request: SamplingRequest) -> None:
    """Refuse OpenAI features this server does not implement, naming the parameter."""
    if getattr(request, "echo", False):
        raise APIError(400, "echo is not supported", param="echo")
    if getattr(request, "best_of", None) not in (None, 1):
        raise APIError(400, "best_of must be 1", param="best_of")
    for name in ("tools", "functions"):
        if getattr(request, name, None):
            raise APIError(400, f"{name} are not supported: this server does not call tools; send the request "
                                f"without {name}", param=name)
    for name in ("tool_choice", "function_call"):
        if getattr(request, name, None) not in (None, "none"):
            raise APIError(400, f"{name} is not supported: this server does not call tools", param=name)


def new_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:24]}"


def usage(prompt_tokens: int, completion_tokens: int) -> dict[str, int]:
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
    }


def speculative_stats(stats: DecodeStats, queue_seconds: float) -> dict[str, Any]:
    """The ``"quickdraft"`` extension field: this request's speculative statistics.

    Conventions are ``DecodeStats``'s: ``mean_tokens_per_step`` counts the bonus/recovered
    token; times are seconds. ``queue_seconds`` is the time spent waiting for the decoder.
    """
    data = stats.to_dict()
    keys = (
        "steps", "drafted_tokens", "accepted_tokens", "drafted_by_position", "accepted_by_position",
        "acceptance_rate", "acceptance_by_position", "mean_tokens_per_step", "target_forwards",
        "draft_forwards", "time_prefill", "time_total", "tokens_per_second", "lookup_accepted_tokens",
        "grammar_tokens", "grammar_accepted_tokens",
    )
    out = {key: data[key] for key in keys}
    out["queue_seconds"] = queue_seconds
    return out


class ResponseBuilder:
    """Builds the bodies of one response (whole or streamed) for either endpoint.

    A stream carries ``usage`` once, as OpenAI's do: only with ``stream_options.include_usage``,
    in the last chunk (empty ``choices``); every other chunk then has ``"usage": null``.
    """

    def __init__(self, chat: bool, model: str, include_usage: bool = False) -> None:
        self.chat = chat
        self.model = model
        self.include_usage = include_usage
        self.id = new_id("chatcmpl" if chat else "cmpl")
        self.created = int(time.time())

    def _envelope(self, chunk: bool) -> dict[str, Any]:
        if self.chat:
            obj = "chat.completion.chunk" if chunk else "chat.completion"
        else:
            obj = "text_completion"
        envelope = {"id": self.id, "object": obj, "created": self.created, "model": self.model}
        if chunk and self.include_usage:
            envelope["usage"] = None
        return envelope

    def _choice(self, text: str | None, finish_reason: str | None, chunk: bool, role: bool = False,
                index: int = 0, logprobs: dict | None = None) -> dict:
        if not self.chat:
            return {"index": index, "text": text or "", "logprobs": logprobs, "finish_reason": finish_reason}
        if chunk:
            delta: dict[str, str] = {"role": "assistant"} if role else {}
            if text is not None:
                delta["content"] = text
            return {"index": index, "delta": delta, "logprobs": logprobs, "finish_reason": finish_reason}
        message = {"role": "assistant", "content": text}
        return {"index": index, "message": message, "logprobs": logprobs, "finish_reason": finish_reason}

    def whole(self, choices: list[tuple[str, str, dict | None]], usage_: dict, extension: dict) -> dict[str, Any]:
        """``choices``: (text, finish_reason, logprobs) of each of the ``n`` samples."""
        return {**self._envelope(chunk=False),
                "choices": [self._choice(text, finish, chunk=False, index=i, logprobs=logprobs)
                            for i, (text, finish, logprobs) in enumerate(choices)],
                "usage": usage_, "quickdraft": extension}

    def first_chunk(self, index: int = 0) -> dict[str, Any] | None:
        """Chat streams open each choice with the assistant's role and empty content, as OpenAI's do."""
        if not self.chat:
            return None
        return {**self._envelope(chunk=True), "choices": [self._choice("", None, chunk=True, role=True, index=index)]}

    def text_chunk(self, text: str, index: int = 0, logprobs: dict | None = None) -> dict[str, Any]:
        return {**self._envelope(chunk=True), "choices": [self._choice(text, None, chunk=True, index=index,
                                                                       logprobs=logprobs)]}

    def final_chunk(self, text: str, finish_reason: str, extension: dict | None,
                    index: int = 0, logprobs: dict | None = None) -> dict[str, Any]:
        """The chunk that carries a choice's ``finish_reason``; the last choice's also carries
        the request's statistics (``extension``). Usage comes apart (``usage_chunk``)."""
        choice = self._choice(text or (None if self.chat else ""), finish_reason, chunk=True, index=index,
                              logprobs=logprobs)
        chunk = {**self._envelope(chunk=True), "choices": [choice]}
        if extension is not None:
            chunk["quickdraft"] = extension
        return chunk

    def logprobs(self, entries: list[TokenLogprob], token_text: Callable[[int], str]) -> dict | None:
        """OpenAI's ``logprobs`` object for emitted tokens (None when there are none).

        Chat: ``{"content": [{"token", "logprob", "bytes", "top_logprobs": [...]}]}``;
        completions: ``{"tokens", "token_logprobs", "top_logprobs": [{token: logprob}], "text_offset"}``.
        A token top-k/top-p removed has logprob -inf, which JSON cannot carry: -9999.0, as OpenAI.
        """
        if not entries:
            return None

        def finite(value: float) -> float:
            return max(value, -9999.0)

        if self.chat:
            def item(token: int, value: float) -> dict:
                text = token_text(token)
                return {"token": text, "logprob": finite(value), "bytes": list(text.encode())}
            return {"content": [{**item(e.token_id, e.logprob), "top_logprobs": [item(t, v) for t, v in e.top]}
                                for e in entries]}
        tokens = [token_text(e.token_id) for e in entries]
        offsets = [sum(len(t) for t in tokens[:i]) for i in range(len(tokens))]
        return {"tokens": tokens, "token_logprobs": [finite(e.logprob) for e in entries],
                "top_logprobs": [{token_text(t): finite(v) for t, v in e.top} for e in entries],
                "text_offset": offsets}

    def usage_chunk(self, usage_: dict) -> dict[str, Any]:
        """OpenAI's ``stream_options.include_usage`` chunk: no choices, only usage."""
        return {**self._envelope(chunk=True), "choices": [], "usage": usage_}


def sse(data: dict[str, Any] | str) -> bytes:
    """One server-sent event, as OpenAI writes them: ``data: <json>`` and a blank line."""
    payload = data if isinstance(data, str) else json.dumps(data, separators=(",", ":"), ensure_ascii=False)
    return f"data: {payload}\n\n".encode()


SSE_DONE = sse("[DONE]")
