"""The OpenAI-compatible HTTP API (FastAPI) over a `Scheduler`.

    app = create_app(scheduler, model_name="ende-target", max_tokens=64)
    uvicorn.run(app, host="127.0.0.1", port=8000)

Routes: GET /health (503 until the engine is compiled, then 200), GET /v1/models, POST /v1/completions,
POST /v1/chat/completions (targets with a chat template), GET /metrics (Prometheus text). `stream: true` answers
server-sent events, one `data: {json}` chunk per text delta and `data: [DONE]` last; with
`stream_options.include_usage` a last chunk before [DONE] carries `usage` (choices empty), as OpenAI's does, and
with `continuous_usage_stats` too every chunk carries the usage so far (vLLM's extension, which guidellm asks). Every
refused request gets OpenAI's error body (`protocol.error_body`) with a 4xx status; a streaming client that
disconnects cancels its request (its slot is freed before the engine's next step), and so does a non-streaming
one (checked every `_DISCONNECT_POLL_S`).
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid

import anyio
from fastapi import FastAPI, Request as HTTPRequest
from fastapi.responses import JSONResponse, Response, StreamingResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from jaxspec.serving import protocol
from jaxspec.serving.protocol import APIError
from jaxspec.serving.scheduler import Handle, Scheduler

_DISCONNECT_POLL_S = 0.5


def _error(e: APIError) -> JSONResponse:
  return JSONResponse(e.body(), status_code=e.status)


def create_app(scheduler: Scheduler, *, model_name: str, max_tokens: int) -> FastAPI:
  """The FastAPI app serving `scheduler`'s engine as `model_name`; requests without max_tokens get `max_tokens`."""
  engine, metrics, tokenizer = scheduler.engine, scheduler.metrics, scheduler.tokenizer
  created = int(time.time())
  app = FastAPI(title="jaxspec", docs_url=None, redoc_url=None, openapi_url=None)
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

  async def _body(http: HTTPRequest):
    raw = await http.body()
    try:
      return json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
      raise APIError(400, f"the request body is not valid JSON: {e}.", code="invalid_json") from None

  async def _serve(http: HTTPRequest, kind: str):
    try:
      body = await _body(http)
      if kind == "chat":
        request = protocol.parse_chat(body, **limits)
      else:
        request = protocol.parse_completion(body, vocab_size=vocab_size, **limits)
      handle = scheduler.submit(request, asyncio.get_running_loop())
    except APIError as e:
      metrics.requests.labels(status=str(e.status)).inc()
      return _error(e)
    if request.stream:
      metrics.requests.labels(status="200").inc()
      return _EventStream(handle, _stream(handle, kind, model_name))
    response = await _complete(http, handle, kind, model_name)
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
