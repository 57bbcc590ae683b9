"""The OpenAI wire format: request models, response bodies, stream chunks and error bodies.

Requests are validated by pydantic in strict JSON mode, so ``"max_tokens": "5"`` is refused
rather than coerced. Unknown fields are ignored (clients send ``user``, ``logit_bias`` ...);
known fields whose non-default values quickdraft does not implement are refused with a 400
(``n`` > 1, ``logprobs``, ``echo``, penalties, ``tools``, ``response_format``), never silently
dropped.

Responses are plain dicts shaped exactly like OpenAI's, plus one extension field,
``"quickdraft"``, with the request's own speculative statistics.
"""

from __future__ import annotations

import json
import time
import uuid
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

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


class CompletionRequest(SamplingRequest):
    """``POST /v1/completions``: one prompt, as text or as a list of token ids."""

    prompt: str | list[int] | list[str]
    max_tokens: int | None = None
    logprobs: int | None = None
    echo: bool = False
    best_of: int | None = None


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
    # Declared only to be refused (check_unsupported): a client relying on them must not get
    # plain text as if they had been honoured.
    tools: list[Any] | None = None
    tool_choice: Any = None
    functions: list[Any] | None = None
    function_call: Any = None
    response_format: dict[str, Any] | None = None


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
    if request.n is not None and request.n != 1:
        raise APIError(400, f"n must be 1: this server generates one choice per request (got {request.n})", param="n")
    for name in ("presence_penalty", "frequency_penalty"):
        if getattr(request, name) not in (None, 0, 0.0):
            raise APIError(400, f"{name} is not supported (it would change the target's distribution)", param=name)
    if getattr(request, "logprobs", None) not in (None, False):
        raise APIError(400, "logprobs are not supported", param="logprobs")
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
    response_format = getattr(request, "response_format", None)
    if response_format not in (None, {"type": "text"}):
        raise APIError(400, f"response_format {json.dumps(response_format)} is not supported yet: only "
                            '{"type": "text"}; ask for JSON in the prompt instead', param="response_format")


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
        "draft_forwards", "time_prefill", "time_total", "tokens_per_second",
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

    def _choice(self, text: str | None, finish_reason: str | None, chunk: bool, role: bool = False) -> dict:
        if not self.chat:
            return {"index": 0, "text": text or "", "logprobs": None, "finish_reason": finish_reason}
        if chunk:
            delta: dict[str, str] = {"role": "assistant"} if role else {}
            if text is not None:
                delta["content"] = text
            return {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish_reason}
        message = {"role": "assistant", "content": text}
        return {"index": 0, "message": message, "logprobs": None, "finish_reason": finish_reason}

    def whole(self, text: str, finish_reason: str, usage_: dict, extension: dict) -> dict[str, Any]:
        return {**self._envelope(chunk=False), "choices": [self._choice(text, finish_reason, chunk=False)],
                "usage": usage_, "quickdraft": extension}

    def first_chunk(self) -> dict[str, Any] | None:
        """Chat streams open with the assistant's role and empty content, as OpenAI's do."""
        if not self.chat:
            return None
        return {**self._envelope(chunk=True), "choices": [self._choice("", None, chunk=True, role=True)]}

    def text_chunk(self, text: str) -> dict[str, Any]:
        return {**self._envelope(chunk=True), "choices": [self._choice(text, None, chunk=True)]}

    def final_chunk(self, text: str, finish_reason: str, extension: dict) -> dict[str, Any]:
        """The chunk that carries ``finish_reason``; it also carries the request's statistics."""
        choice = self._choice(text or (None if self.chat else ""), finish_reason, chunk=True)
        return {**self._envelope(chunk=True), "choices": [choice], "quickdraft": extension}

    def usage_chunk(self, usage_: dict) -> dict[str, Any]:
        """OpenAI's ``stream_options.include_usage`` chunk: no choices, only usage."""
        return {**self._envelope(chunk=True), "choices": [], "usage": usage_}


def sse(data: dict[str, Any] | str) -> bytes:
    """One server-sent event, as OpenAI writes them: ``data: <json>`` and a blank line."""
    payload = data if isinstance(data, str) else json.dumps(data, separators=(",", ":"), ensure_ascii=False)
    return f"data: {payload}\n\n".encode()


SSE_DONE = sse("[DONE]")
