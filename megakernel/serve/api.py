"""The OpenAI-compatible HTTP API (FastAPI): /v1/completions, /v1/chat/completions, /v1/models,
/health and /metrics.

Bodies follow OpenAI's schema closely enough for the official ``openai`` client; vLLM's extensions
``top_k``, ``ignore_eos``, ``return_token_ids`` and ``chat_template_kwargs`` are taken as vLLM takes
them. ``/v1/completions`` takes a list of prompts (strings or token-id lists) as OpenAI's API and
vLLM do: one choice per prompt (``n`` per prompt), in order, choice ``p * n + j`` the ``j``-th of
prompt ``p``, streamed or not. A request may leave out ``model``, as vLLM allows (OpenAI's spec
requires it): it gets the one model served; a ``model`` that names another is a 400. Every error is answered with OpenAI's error body ``{"error": {"message", "type", "param",
"code"}}``: 400 for a request that cannot be served as asked, 503 where the queue is full, 500
where the engine failed.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
import uuid
from contextlib import asynccontextmanager
from dataclasses import dataclass, field

from fastapi import FastAPI
from fastapi.responses import JSONResponse, Response, StreamingResponse
from pydantic import BaseModel, ConfigDict, ValidationError
from starlette.exceptions import HTTPException
from starlette.requests import Request as HTTPRequest

from models.qwen3.sampling import SamplingParams

from .engine import Delta, Engine, EngineStopped, Failure, GenParams, QueueFull, Request
from .metrics import Metrics
from .text import PromptError, TextCodec

log = logging.getLogger("megakernel.serve")

COMPLETION_DEFAULT_MAX_TOKENS = 16    # OpenAI's default for /v1/completions
# Settings this server does not implement: a request that sets them gets a 400, never a silent default.
UNSUPPORTED = ("logprobs", "top_logprobs", "echo", "suffix", "logit_bias", "tools", "functions",
               "function_call", "prompt_logprobs")


class BadRequest(Exception):
    def __init__(self, message: str, param: str | None = None):
        super().__init__(message)
        self.param = param


@dataclass
class ServerConfig:
    model_name: str
    max_seq_len: int
    stop_ids: frozenset
    # sampling defaults for settings a request leaves out (the checkpoint's generation_config.json,
    # as vLLM applies it; OpenAI's where it says nothing)
    defaults: dict = field(default_factory=dict)
    log_prompts: bool = False


class StreamOptions(BaseModel):
    include_usage: bool = False


class _Common(BaseModel):
    model_config = ConfigDict(extra="allow")
    model: str | None = None
    max_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    seed: int | None = None
    stop: str | list[str] | None = None
    n: int = 1
    best_of: int | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    repetition_penalty: float | None = None
    response_format: dict | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    ignore_eos: bool = False
    return_token_ids: bool = False
    user: str | None = None


class CompletionRequest(_Common):
    prompt: str | list[int] | list[str | list[int]]    # a list may mix strings and id lists


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="allow")
    role: str
    content: str | list[dict] | None = None


class ChatRequest(_Common):
    messages: list[ChatMessage]
    max_completion_tokens: int | None = None
    chat_template_kwargs: dict | None = None
    add_generation_prompt: bool = True


def error_body(status: int, message: str, type_: str | None = None, param: str | None = None) -> JSONResponse:
    type_ = type_ or {400: "invalid_request_error", 404: "not_found_error", 503: "server_overloaded"}.get(
        status, "server_error")
    return JSONResponse({"error": {"message": message, "type": type_, "param": param, "code": status}},
                        status_code=status)


def create_app(engine: Engine, codec: TextCodec, config: ServerConfig, metrics: Metrics) -> FastAPI:
    created = int(time.time())

    @asynccontextmanager
    async def lifespan(app):
        yield
        await asyncio.to_thread(engine.stop)

    app = FastAPI(title="megakernel", lifespan=lifespan)

    def bad_request(message: str, param: str | None = None) -> JSONResponse:
        metrics.requests.labels("bad_request").inc()
        return error_body(400, message, param=param)

    @app.exception_handler(HTTPException)
    async def _http(request, exc: HTTPException):
        return error_body(exc.status_code, str(exc.detail))

    @app.get("/health")
    async def health():
        if not engine.running:
            return error_body(503, f"the engine is not running{f': {engine.error}' if engine.error else ''}")
        return {"status": "ok", **engine.status()}

    @app.get("/metrics")
    async def prometheus():
        from prometheus_client import CONTENT_TYPE_LATEST
        return Response(metrics.render(), media_type=CONTENT_TYPE_LATEST)

    @app.get("/v1/models")
    async def models():
        return {"object": "list", "data": [{"id": config.model_name, "object": "model", "created": created,
                                             "owned_by": "megakernel", "max_model_len": config.max_seq_len}]}

    async def parse(raw: HTTPRequest, model: type[BaseModel]):
        """The body as ``model``; JSON is read whatever the Content-Type says (curl -d sends a form's)."""
        try:
            return model.model_validate(json.loads(await raw.body()))
        except json.JSONDecodeError as e:
            raise BadRequest(f"the request body is not valid JSON ({e})") from None
        except UnicodeDecodeError:
            raise BadRequest("the request body is not UTF-8 text") from None
        except ValidationError as e:
            parts = []
            for err in e.errors()[:3]:
                loc = ".".join(str(x) for x in err.get("loc", ())) or "body"
                parts.append(f"{loc}: {err.get('msg')}")
            loc = e.errors()[0].get("loc", ()) if e.errors() else ()
            raise BadRequest("invalid request: " + "; ".join(parts), str(loc[0]) if loc else None) from None

    @app.post("/v1/completions")
    async def completions(raw: HTTPRequest):
        try:
            body = await parse(raw, CompletionRequest)
            params = _params(body, config, codec, engine)
            prompts = _prompts(body.prompt)
            if len(prompts) * params.n > engine.max_queue:
                raise BadRequest(f"{len(prompts)} prompts x n={params.n} are more sequences than the server's "
                                 f"queue holds ({engine.max_queue})", "prompt")
            ids = [codec.encode(p) if isinstance(p, str) else codec.check_ids(list(p)) for p in prompts]
            # one max_tokens for the request: checked against (and by default fitted to) the longest prompt
            params = _fit(params, max(map(len, ids)), body.max_tokens, COMPLETION_DEFAULT_MAX_TOKENS, config,
                          "max_tokens")
        except (BadRequest, PromptError) as e:
            return bad_request(str(e), getattr(e, "param", "prompt"))
        if config.log_prompts:
            log.info("prompt: %r", body.prompt)
        show_ids = body.return_token_ids or not codec.has_text
        return await _serve(raw, ids, params, body, chat=False, show_ids=show_ids)

    @app.post("/v1/chat/completions")
    async def chat_completions(raw: HTTPRequest):
        try:
            body = await parse(raw, ChatRequest)
            params = _params(body, config, codec, engine)
            if not body.messages:
                raise BadRequest("messages is empty", "messages")
            messages = [_message(m) for m in body.messages]
            ids = codec.chat_ids(messages, body.chat_template_kwargs, body.add_generation_prompt)
            asked = body.max_completion_tokens if body.max_completion_tokens is not None else body.max_tokens
            params = _fit(params, len(ids), asked, None, config,
                          "max_completion_tokens" if body.max_completion_tokens is not None else "max_tokens")
        except (BadRequest, PromptError) as e:
            return bad_request(str(e), getattr(e, "param", "messages"))
        if config.log_prompts:
            log.info("messages: %r", messages)
        return await _serve(raw, [ids], params, body, chat=True, show_ids=body.return_token_ids)

    async def _serve(raw: HTTPRequest, prompts: list[list[int]], params: GenParams, body: _Common, chat: bool,
                     show_ids: bool):
        req = Request(prompts, params, codec.decode)
        try:
            engine.submit(req)
        except (QueueFull, EngineStopped) as e:
            metrics.requests.labels("rejected").inc()
            log.warning("request refused: %s", e)
            return error_body(503, str(e))
        log.info("request %d: %d prompt(s) of %d tokens, n=%d, max_tokens=%d%s", req.id, len(prompts),
                 req.prompt_tokens, params.n, params.max_tokens, ", streamed" if body.stream else "")
        rid = f"{'chatcmpl' if chat else 'cmpl'}-{uuid.uuid4().hex}"
        head = {"id": rid, "object": "chat.completion.chunk" if body.stream and chat else
                "chat.completion" if chat else "text_completion", "created": int(time.time()),
                "model": config.model_name}
        watch = asyncio.ensure_future(_disconnected(raw))
        streaming = False
        try:
            # the first event decides the status: a request that fails before its first token gets
            # a real 500 rather than an error inside a 200 stream
            first = await _next(req, watch)
            if first is None:
                return Response(status_code=499)   # the client is gone; nobody reads this
            if isinstance(first, Failure):
                return error_body(first.status, first.message, first.type)
            if body.stream:
                streaming = True
                usage = bool(body.stream_options and body.stream_options.include_usage)
                return _SSEResponse(_stream(req, first, head, chat, show_ids, usage),
                                    on_close=lambda: engine.cancel(req), media_type="text/event-stream",
                                    headers={"Cache-Control": "no-cache"})
            events = [first]
            while not _all_finished(events, len(req.seqs)):
                ev = await _next(req, watch)
                if ev is None:
                    return Response(status_code=499)
                if isinstance(ev, Failure):
                    return error_body(ev.status, ev.message, ev.type)
                events.append(ev)
            return _full_response(head, req, events, chat, show_ids)
        finally:
            watch.cancel()
            if not streaming:
                engine.cancel(req)     # where the client went away; a no-op for a finished request

    return app


class _SSEResponse(StreamingResponse):
    """A stream whose sequence is cancelled however it ends (the client going away included)."""

    def __init__(self, content, on_close, **kwargs):
        super().__init__(content, **kwargs)
        self.on_close = on_close

    async def __call__(self, scope, receive, send):
        try:
            await super().__call__(scope, receive, send)
        finally:
            self.on_close()


async def _disconnected(raw: HTTPRequest):
    """Returns once the client has gone away (the body is read by then, so receive() only
    ever brings the disconnect)."""
    while True:
        message = await raw.receive()
        if message["type"] == "http.disconnect":
            return


async def _next(req: Request, watch: asyncio.Future):
    """The request's next event, or None where the client went away first."""
    if not req.events.empty():
        return req.events.get_nowait()
    get = asyncio.ensure_future(req.events.get())
    await asyncio.wait({get, watch}, return_when=asyncio.FIRST_COMPLETED)
    if get.done():
        return get.result()
    get.cancel()
    return None


def _all_finished(events: list, n: int) -> bool:
    return sum(1 for e in events if isinstance(e, Delta) and e.finish_reason) >= n


def _usage(req: Request) -> dict:
    p, c = req.prompt_tokens, req.completion_tokens
    return {"prompt_tokens": p, "completion_tokens": c, "total_tokens": p + c}


def _full_response(head: dict, req: Request, events: list, chat: bool, show_ids: bool) -> dict:
    n = len(req.seqs)
    texts, ids, finish = [[] for _ in range(n)], [[] for _ in range(n)], [None] * n
    for e in events:
        texts[e.index].append(e.text)
        ids[e.index] += e.token_ids
        finish[e.index] = e.finish_reason or finish[e.index]
    choices = []
    for i in range(n):
        text = "".join(texts[i])
        choice = {"index": i, "message": {"role": "assistant", "content": text}} if chat else \
            {"index": i, "text": text}
        choice.update(logprobs=None, finish_reason=finish[i])
        if show_ids:
            choice["token_ids"] = ids[i]
        choices.append(choice)
    out = dict(head, choices=choices, usage=_usage(req))
    if show_ids:
        # one prompt's ids as a flat list; several prompts' as one list each, in order
        out["prompt_token_ids"] = req.prompts[0] if len(req.prompts) == 1 else req.prompts
    return out


async def _stream(req: Request, first, head: dict, chat: bool, show_ids: bool, include_usage: bool):
    def chunk(choices, **extra) -> str:
        return f"data: {json.dumps(dict(head, choices=choices, **extra))}\n\n"

    n, finished = len(req.seqs), 0
    out = []
    if chat:   # OpenAI's first chunk of each choice names the role
        out += [chunk([{"index": i, "delta": {"role": "assistant", "content": ""}, "logprobs": None,
                        "finish_reason": None}]) for i in range(n)]
    pending = [first]
    while True:
        for ev in pending:
            if isinstance(ev, Failure):
                error = {"message": ev.message, "type": ev.type, "param": None, "code": ev.status}
                out += [f"data: {json.dumps({'error': error})}\n\n", "data: [DONE]\n\n"]
                yield "".join(out)
                return
            finished += ev.finish_reason is not None
            if not ev.text and not ev.finish_reason and not show_ids:
                continue      # text held back: nothing to say yet
            if chat:
                choice = {"index": ev.index, "delta": {"content": ev.text} if ev.text else {}}
            else:
                choice = {"index": ev.index, "text": ev.text}
            choice.update(logprobs=None, finish_reason=ev.finish_reason)
            if show_ids:
                choice["token_ids"] = ev.token_ids
            out.append(chunk([choice]))
        if finished >= n:
            break
        if out:
            yield "".join(out)
            out = []
        pending = [await req.events.get()]
        while not req.events.empty():
            pending.append(req.events.get_nowait())
    if include_usage:
        out.append(chunk([], usage=_usage(req)))
    out.append("data: [DONE]\n\n")
    yield "".join(out)


def _prompts(prompt) -> list:
    """A completion request's prompts, as OpenAI's API takes them: a string, a list of token ids,
    or a list of either (one choice, or n, per prompt, in order)."""
    if isinstance(prompt, str) or (prompt and isinstance(prompt[0], int)):
        return [prompt]
    if not prompt:
        raise BadRequest("prompt is empty", "prompt")
    return list(prompt)


def _message(m: ChatMessage) -> dict:
    """A message as the chat template reads it: OpenAI's list of content parts joined into text."""
    d = m.model_dump(exclude_none=True)
    content = m.content
    if isinstance(content, list):
        texts = []
        for part in content:
            if part.get("type") != "text" or not isinstance(part.get("text"), str):
                raise BadRequest(f"content parts of type {part.get('type')!r} are not supported (text only)",
                                 "messages")
            texts.append(part["text"])
        content = "\n".join(texts)
    d["content"] = content or ""
    return d


def _params(body: _Common, config: ServerConfig, codec: TextCodec, engine: Engine) -> GenParams:
    """The request's generation settings, checked before any work (max_tokens comes in ``_fit``,
    once the prompt's length is known)."""
    if body.model is not None and body.model != config.model_name:
        raise BadRequest(f"the model {body.model!r} does not exist: this server serves "
                         f"{config.model_name!r}", "model")
    extra = body.model_extra or {}
    for name in UNSUPPORTED:
        if extra.get(name) not in (None, False, [], {}):
            raise BadRequest(f"{name} is not supported by this server", name)
    if "tool_choice" in extra and extra["tool_choice"] not in (None, "none"):
        raise BadRequest("tool_choice is not supported by this server", "tool_choice")
    for name, neutral in (("presence_penalty", 0.0), ("frequency_penalty", 0.0), ("repetition_penalty", 1.0)):
        if getattr(body, name) not in (None, neutral):
            raise BadRequest(f"{name} is not supported by this server", name)
    if body.response_format not in (None, {"type": "text"}):
        raise BadRequest("response_format other than text is not supported by this server", "response_format")
    if body.n < 1:
        raise BadRequest(f"n must be at least 1, got {body.n}", "n")
    if body.n > engine.max_queue:
        raise BadRequest(f"n={body.n} is more than the server's queue holds ({engine.max_queue})", "n")
    if body.best_of is not None and body.best_of != body.n:
        raise BadRequest("best_of other than n is not supported by this server", "best_of")
    d = config.defaults
    temperature = body.temperature if body.temperature is not None else d.get("temperature", 1.0)
    top_p = body.top_p if body.top_p is not None else d.get("top_p")
    top_k = body.top_k if body.top_k is not None else d.get("top_k")
    if top_k is not None and top_k in (0, -1):   # vLLM's and transformers' "no top-k"
        top_k = None
    if top_p == 1.0:
        top_p = None
    try:
        sampling = SamplingParams(float(temperature), top_k, top_p, body.seed)
    except ValueError as e:
        raise BadRequest(str(e).replace("top-k", "top_k").replace("top-p", "top_p")) from None
    if body.seed is not None and not 0 <= body.seed < 2**63 - body.n:
        raise BadRequest(f"seed must be in [0, 2^63), got {body.seed}", "seed")
    stop = [body.stop] if isinstance(body.stop, str) else list(body.stop or [])
    if any(s == "" for s in stop):
        raise BadRequest("stop strings must not be empty", "stop")
    if stop and not codec.has_text:
        raise BadRequest("stop strings need a tokenizer, and this model has none (its output is token ids)", "stop")
    stop_ids = frozenset() if body.ignore_eos else config.stop_ids
    return GenParams(sampling, max_tokens=1, stop_ids=stop_ids, stop=tuple(stop), n=body.n)


def _fit(params: GenParams, prompt_len: int, asked: int | None, default: int | None, config: ServerConfig,
         name: str) -> GenParams:
    """``params`` with max_tokens set: the request's, checked against the context, or the default
    (where none is given, all the room the prompt leaves)."""
    S = config.max_seq_len
    if asked is not None and asked < 1:
        raise BadRequest(f"{name} must be at least 1, got {asked}", name)
    if prompt_len >= S:
        raise BadRequest(f"this model's maximum context length is {S} tokens, and the prompt has {prompt_len}: "
                         f"no room to generate", "prompt")
    room = S - prompt_len
    if asked is not None and asked > room:
        raise BadRequest(f"this model's maximum context length is {S} tokens; you asked for {prompt_len + asked} "
                         f"({prompt_len} in the prompt, {asked} to generate)", name)
    max_tokens = asked if asked is not None else min(default, room) if default is not None else room
    return GenParams(params.sampling, max_tokens, params.stop_ids, params.stop, params.n)
