"""The OpenAI-compatible HTTP API (FastAPI) over a `Scheduler`.

    app = create_app(scheduler, model_name="ende-target", max_tokens=64)
    uvicorn.run(app, host="127.0.0.1", port=8000)

Routes: GET /health (503 until the engine is compiled, then 200), GET /v1/models, POST /v1/completions,
POST /v1/chat/completions (targets with a chat template), GET /metrics (Prometheus text). `stream: true` answers
server-sent events, one `data: {json}` chunk per text delta and `data: [DONE]` last; with
`stream_options.include_usage` a last chunk before [DONE] carries `usage` (choices empty), as OpenAI's does, and
with `continuous_usage_stats` too every chunk carries the usage so far (vLLM's extension, which guidellm asks). Every
refused request gets OpenAI's error body (`requests.error_body`) with a 4xx status; a streaming client that
disconnects cancels its request (its slot is freed before the engine's next step), and so does a non-streaming
one (checked every `_DISCONNECT_POLL_S`).

Hostile bodies: a body over `max_body_bytes` (default `body_limit(max_input_length)`) is answered 413 as soon as
its Content-Length or its bytes so far say so (a chunked body is never buffered beyond the limit); one not read
whole within `body_timeout_s` is answered 408 (a client trickling bytes); both close the connection (lingering:
jaxspec/serving/linger.py, so that a client still sending reads the answer, not a reset). The body is
parsed, checked and its prompt encoded in a worker thread, never on the event loop, so one client's large prompt
does not stall /health or the other streams. Anything unexpected is a 500 with OpenAI's body, counted in /metrics.
With `api_key`, every /v1 route wants `Authorization: Bearer <api_key>` (401 otherwise); /health and /metrics stay
open, as vLLM's --api-key leaves them.
"""

from __future__ import annotations

import asyncio
import hmac
import json
import logging
import time
import uuid

import anyio
from fastapi import FastAPI, Request as HTTPRequest
from fastapi.responses import JSONResponse, Response, StreamingResponse
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.requests import ClientDisconnect

from jaxspec.serving import requests
from jaxspec.serving.requests import APIError
from jaxspec.serving.scheduler import Handle, Scheduler

_DISCONNECT_POLL_S = 0.5
BODY_TIMEOUT_S = 30.0  # a request body not read whole in this time is answered 408
_BODY_BYTES = 1 << 20  # the body limit's floor: fields, messages' wrapping, stop strings
_BODY_BYTES_PER_TOKEN = 4 * requests.MAX_CHARS_PER_TOKEN  # a prompt text the pre-check accepts, as UTF-8


def body_limit(max_input_length: int) -> int:
  """The largest request body accepted (413 beyond): 1 MiB plus 256 bytes per token of --max_input_length, room
  for the longest prompt text the length pre-check lets through (requests.MAX_CHARS_PER_TOKEN characters a
  token, 4 bytes a character) or max_input_length token ids."""
  return _BODY_BYTES + _BODY_BYTES_PER_TOKEN * max_input_length


def _error(e: APIError) -> JSONResponse:
  return JSONResponse(e.body(), status_code=e.status)


class _RequireKey:
  """ASGI middleware: /v1 routes answer 401 (OpenAI's body) without `Authorization: Bearer <key>`."""

  def __init__(self, app, *, key: str, metrics):
    self.app, self.key, self.metrics = app, key.encode(), metrics

  async def __call__(self, scope, receive, send):
    if scope["type"] == "http" and scope["path"].startswith("/v1"):
      given = dict(scope["headers"]).get(b"authorization", b"")
      scheme, _, token = given.partition(b" ")
      if not (scheme.lower() == b"bearer" and hmac.compare_digest(token.strip(), self.key)):
        message = ("Incorrect API key provided." if given else "You didn't provide an API key: send it as "
                   "'Authorization: Bearer YOUR_KEY' (this server was started with --api_key).")
        self.metrics.requests.labels(status="401").inc()
        response = _error(APIError(401, message, code="invalid_api_key"))
        response.headers["www-authenticate"] = "Bearer"
        await response(scope, receive, send)
        return
    await self.app(scope, receive, send)


def create_app(scheduler: Scheduler, *, model_name: str, max_tokens: int, api_key: str | None = None,
               max_body_bytes: int | None = None, body_timeout_s: float = BODY_TIMEOUT_S) -> FastAPI:
  """The FastAPI app serving `scheduler`'s engine as `model_name`; requests without max_tokens get `max_tokens`.
  api_key: required on /v1 routes when given. max_body_bytes (default `body_limit` of the engine's
  max_input_length) and body_timeout_s bound what one request body may cost."""
  engine, metrics, tokenizer = scheduler.engine, scheduler.metrics, scheduler.tokenizer
  created = int(time.time())
  max_body_bytes = max_body_bytes or body_limit(engine.max_input_length)
  app = FastAPI(title="jaxspec", docs_url=None, redoc_url=None, openapi_url=None)
  if api_key:
    app.add_middleware(_RequireKey, key=api_key, metrics=metrics)
  limits = dict(served_model=model_name, tokenizer=tokenizer, max_input_length=engine.max_input_length,
                max_tokens=max_tokens, max_new_tokens=engine.max_new_tokens)
  vocab_size = tokenizer.vocab_size

  @app.exception_handler(StarletteHTTPException)
  async def http_error(_, exc: StarletteHTTPException):  # unknown routes, wrong methods: OpenAI's body too
    return _error(APIError(exc.status_code, str(exc.detail), code=None))

  @app.get("/health")
  async def health():
    if scheduler.ready.is_set():
      return {"status": "ok"}
    return JSONResponse({"status": "failed" if scheduler.failure else "starting", "detail": scheduler.failure},
                        status_code=503)

  @app.get("/v1/models")
  async def models():
    return {"object": "list", "data": [{"id": model_name, "object": "model", "created": created,
                                        "owned_by": "jaxspec", "max_model_len": engine.max_input_length}]}

  @app.get("/metrics")
  async def prometheus():
    body, content_type = metrics.render()
    return Response(body, media_type=content_type)

  too_big = (f"the request body is larger than this server's limit of {max_body_bytes} bytes (sized from "
             f"--max_input_length={engine.max_input_length}).")

  async def _body(http: HTTPRequest) -> bytes:
    """The raw body: 413 past max_body_bytes (by Content-Length, or as the bytes arrive), 408 past the deadline."""
    length = http.headers.get("content-length", "")
    if length.isdigit() and int(length) > max_body_bytes:
      raise APIError(413, too_big, code="request_too_large")
    chunks, size = [], 0
    try:
      with anyio.fail_after(body_timeout_s):
        async for chunk in http.stream():
          size += len(chunk)
          if size > max_body_bytes:
            raise APIError(413, too_big, code="request_too_large")
          chunks.append(chunk)
    except TimeoutError:
      raise APIError(408, f"the request body was not received within {body_timeout_s:g} s.",
                     code="request_timeout") from None
    return b"".join(chunks)

  def _parse(raw: bytes, kind: str) -> requests.Request:  # in a worker thread: json, checks, the tokenizer
    body = requests.parse_json(raw)
    if kind == "chat":
      return requests.parse_chat(body, **limits)
    return requests.parse_completion(body, vocab_size=vocab_size, **limits)

  async def _serve(http: HTTPRequest, kind: str):
    try:
      request = await anyio.to_thread.run_sync(_parse, await _body(http), kind)
      handle = scheduler.submit(request, asyncio.get_running_loop())
      if request.stream:
        metrics.requests.labels(status="200").inc()
        return _EventStream(handle, _stream(handle, kind, model_name))
      response = await _complete(http, handle, kind, model_name)
    except APIError as e:
      response = _error(e)
      if e.status in (408, 413):  # the rest of the body is not read: the connection cannot be reused
        response.headers["connection"] = "close"
    except ClientDisconnect:  # gone while its body was read
      response = _error(APIError(499, "client disconnected", type="client_closed"))
    except Exception as e:  # pylint: disable=broad-except  (a bug: OpenAI's body and a count, not a raw 500)
      logging.exception("request failed")
      response = _error(APIError(500, f"internal error: {type(e).__name__}: {e}", type="server_error",
                                 code="internal_error"))
    metrics.requests.labels(status=str(response.status_code)).inc()
    return response

  @app.post("/v1/completions")
  async def completions(http: HTTPRequest):
    return await _serve(http, "completion")

  @app.post("/v1/chat/completions")
  async def chat_completions(http: HTTPRequest):
    return await _serve(http, "chat")

  return app


class _EventStream(StreamingResponse):
  """Server-sent events that watch the connection while they stream, whatever ASGI version the server speaks:
  `http.disconnect` cancels the stream and the request at once (not at the next chunk a dead socket refuses, nor
  when the garbage collector closes the generator)."""

  def __init__(self, handle: Handle, content):
    super().__init__(content, media_type="text/event-stream", headers={"Cache-Control": "no-cache"})
    self.handle = handle

  async def __call__(self, scope, receive, send) -> None:
    try:
      async with anyio.create_task_group() as group:
        async def stream():
          try:
            await self.stream_response(send)
          except OSError:  # the socket went away under a send
            pass
          group.cancel_scope.cancel()
        group.start_soon(stream)
        await self.listen_for_disconnect(receive)
        group.cancel_scope.cancel()
    finally:
      self.handle.cancel()  # a no-op when the request had finished


def _usage(handle: Handle, completion_tokens: int | None = None) -> dict:
  """The request's usage: its completion tokens so far (`completion_tokens`, an event's count) or all of them."""
  done = handle.completion_tokens if completion_tokens is None else completion_tokens
  return {"prompt_tokens": handle.prompt_tokens, "completion_tokens": done,
          "total_tokens": handle.prompt_tokens + done}


def _ids(kind: str) -> tuple[str, str, str]:
  """(id, object of a whole response, object of a chunk)."""
  if kind == "chat":
    return f"chatcmpl-{uuid.uuid4().hex}", "chat.completion", "chat.completion.chunk"
  return f"cmpl-{uuid.uuid4().hex}", "text_completion", "text_completion"


async def _complete(http: HTTPRequest, handle: Handle, kind: str, model: str) -> JSONResponse:
  """Waits for the whole text (cancelling the request if the client goes away) and answers it in one body."""
  parts, last, checked = [], None, time.monotonic()
  try:
    while last is None:
      if time.monotonic() - checked >= _DISCONNECT_POLL_S:
        checked = time.monotonic()
        if await http.is_disconnected():
          handle.cancel()
          return JSONResponse({"error": {"message": "client disconnected", "type": "client_closed",
                                         "param": None, "code": None}}, status_code=499)
      try:  # (the queue, not handle.events(): a timeout cancelling an async generator's anext would close it)
        event = await asyncio.wait_for(handle.queue.get(), _DISCONNECT_POLL_S)
      except asyncio.TimeoutError:
        continue
      parts.append(event.text)
      if event.finish_reason is not None or event.error is not None:
        last = event
  finally:
    if last is None:
      handle.cancel()
  if last.error is not None:
    return _error(APIError(500, last.error, type="server_error", code="generation_failed"))
  rid, obj, _ = _ids(kind)
  text = "".join(parts)
  choice = ({"index": 0, "message": {"role": "assistant", "content": text}, "logprobs": None,
             "finish_reason": last.finish_reason} if kind == "chat" else
            {"index": 0, "text": text, "logprobs": None, "finish_reason": last.finish_reason})
  return JSONResponse({"id": rid, "object": obj, "created": int(time.time()), "model": model, "choices": [choice],
                       "usage": _usage(handle)})


def _sse(data) -> str:
  return f"data: {json.dumps(data, ensure_ascii=False)}\n\n"


async def _stream(handle: Handle, kind: str, model: str):
  """SSE chunks of one request; a client that disconnects cancels the generator, and with it the request."""
  rid, _, obj = _ids(kind)
  created = int(time.time())
  include_usage, continuous = handle.request.include_usage, handle.request.continuous_usage

  def chunk(choices, completion_tokens: int = 0):
    usage = {}
    if include_usage:  # OpenAI's: null in every chunk but the last; vLLM's continuous stats: the usage so far
      usage = {"usage": _usage(handle, completion_tokens) if continuous else None}
    return _sse({"id": rid, "object": obj, "created": created, "model": model, "choices": choices, **usage})

  finished = False
  try:
    if kind == "chat":
      yield chunk([{"index": 0, "delta": {"role": "assistant", "content": ""}, "logprobs": None,
                    "finish_reason": None}])
    async for event in handle.events():
      if event.error is not None:
        finished = True
        yield _sse(APIError(500, event.error, type="server_error", code="generation_failed").body())
        break
      if event.text or event.finish_reason is not None:
        if kind == "chat":
          delta = {"content": event.text} if event.text else {}
          yield chunk([{"index": 0, "delta": delta, "logprobs": None, "finish_reason": event.finish_reason}],
                      event.completion_tokens)
        else:
          yield chunk([{"index": 0, "text": event.text, "logprobs": None, "finish_reason": event.finish_reason}],
                      event.completion_tokens)
      if event.finish_reason is not None:
        finished = True
    if finished and include_usage:
      yield _sse({"id": rid, "object": obj, "created": created, "model": model, "choices": [],
                  "usage": _usage(handle)})
    yield "data: [DONE]\n\n"
  finally:
    if not finished:
      handle.cancel()
