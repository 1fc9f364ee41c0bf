"""The OpenAI request surface: a JSON body checked field by field into a `Request`, and OpenAI's error body.

    req = parse_completion(body, served_model="ende-target", tokenizer=tok, max_input_length=512, max_tokens=64)
    req = parse_chat(body, ...)        # messages through the tokenizer's chat template (400 without one)
    error_body(APIError(400, "temperature must be in [0, 2], got 3.", param="temperature"))
    # -> {"error": {"message": ..., "type": "invalid_request_error", "param": "temperature", "code": None}}

Every problem is one `APIError` (status 4xx, a message naming the field and the value, OpenAI's `type`, `param`
and `code`), never a traceback. Supported: prompt (a string, a list of one string, token ids), messages, model,
max_tokens (max_completion_tokens for chat), temperature [0, 2] (default 1, as OpenAI's), top_p (0, 1], top_k >= 0 (an extension), seed
[0, 2**31 - 1], stop (a string or up to 4, or null), n (1 only), stream, stream_options.include_usage. What
vLLM's and SGLang's benchmark clients send (guidellm, vLLM's benchmark_serving), as vLLM reads it: ignore_eos
(decode past EOS up to max_tokens), min_tokens (in [0, max_tokens]: no EOS before that many tokens; stop strings
still apply), stream_options.continuous_usage_stats (with include_usage: `usage` so far in every chunk). Fields
OpenAI defines that change nothing here (user, presence/frequency penalties at 0, logit_bias empty, ...) are
accepted; any other field is refused. `parse_json` reads the body (400 for what Python's JSON decoder or a
tokenizer cannot take: too deep, an over-long integer, a lone surrogate); a prompt text longer than
MAX_CHARS_PER_TOKEN characters per token of max_input_length is refused before it is encoded.
"""

from __future__ import annotations

import dataclasses
import json
import math
import re
from typing import Any

import numpy as np

from jaxspec.checks import MAX_SEED, check_seed, is_int  # the HTTP layer words its own 400s; the bound is the one
from jaxspec.decoding.settings import Sampling
from jaxspec.errors import SettingsError

MAX_STOPS = 4
MAX_DEPTH = 32  # JSON nesting a body may have (OpenAI's deepest field, a content part, is 4 levels down)
# The cheap pre-check before encoding: a prompt text longer than this many characters per token of
# --max_input_length is refused unencoded (real text runs 3 to 5 characters a token).
MAX_CHARS_PER_TOKEN = 64

# OpenAI fields that are accepted when left at a value that changes nothing: the values shown (None always is;
# True/False and 1/0 are told apart: `best_of: true` or `logprobs: 0` asks for something).
_NEUTRAL = {"user": (), "presence_penalty": (0,), "frequency_penalty": (0,), "logit_bias": ({},),
            "logprobs": (False,), "echo": (False,), "best_of": (1,), "suffix": ("",), "top_logprobs": (0,),
            "parallel_tool_calls": (True, False), "tools": ([],), "tool_choice": ("none",),
            "response_format": ({"type": "text"},), "service_tier": (), "store": (), "metadata": ()}
_FREE = ("user", "service_tier", "store", "metadata")  # any value: bookkeeping, no effect on the answer


class APIError(Exception):
  """An OpenAI-shaped error: HTTP status, message, type ('invalid_request_error', ...), param and code."""

  def __init__(self, status: int, message: str, *, type: str = "invalid_request_error",  # pylint: disable=redefined-builtin
               param: str | None = None, code: str | None = None):
    super().__init__(message)
    self.status, self.message, self.type, self.param, self.code = status, message, type, param, code

  def body(self) -> dict:
    return error_body(self)


def error_body(e: APIError) -> dict:
  """{"error": {"message", "type", "param", "code"}}: the body OpenAI's clients read."""
  return {"error": {"message": e.message, "type": e.type, "param": e.param, "code": e.code}}


@dataclasses.dataclass(frozen=True)
class Request:
  """One checked request: prompt_ids [S] (what the engine inserts: T5 encoder ids, or a decoder-only prompt), the
  sampling settings, stop strings and streaming options."""
  kind: str  # "completion" or "chat"
  model: str
  prompt_ids: tuple[int, ...]
  max_tokens: int
  temperature: float
  top_p: float
  top_k: int
  seed: int
  stop: tuple[str, ...]
  stream: bool
  include_usage: bool
  continuous_usage: bool = False  # stream_options.continuous_usage_stats (with include_usage): usage per chunk
  ignore_eos: bool = False  # vLLM's: EOS does not end the answer; it runs to max_tokens
  min_tokens: int = 0  # vLLM's: no EOS before this many new tokens


@dataclasses.dataclass(frozen=True)
class RequestSettings:
  """One request's settings for the slot engine (`SlotEngine.insert`), all runtime values of its programs (a new
  value never recompiles).

  max_tokens: new tokens at most (EOS included), in [1, engine.max_new_tokens]. sampling: a `jaxspec.Sampling`
  (temperature 0 greedy, > 0 samples; top_k 0 off; top_p in (0, 1], 1 off); its `mode` picks the least general
  step program that decodes the request exactly. seed: in [0, 2**31 - 1]; a sampled request's tokens depend
  on its prompt, settings and seed (and on the step programs that decode it: engine.py's Exactness).
  ignore_eos: an EOS does not end the request, which decodes to max_tokens (its EOS tokens among its tokens).
  min_tokens: in [0, max_tokens]; the first min_tokens new tokens are never EOS (the target's EOS logits are
  masked for them), as vLLM's min_tokens."""

  max_tokens: int
  sampling: Sampling = Sampling()
  seed: int = 0
  ignore_eos: bool = False
  min_tokens: int = 0

  def __post_init__(self):
    if not is_int(self.max_tokens) or self.max_tokens < 1:
      raise SettingsError(f"max_tokens must be an integer >= 1, got {self.max_tokens!r}.")
    if not isinstance(self.sampling, Sampling):
      raise SettingsError(f"sampling must be a jaxspec.Sampling (temperature, top_k, top_p), got "
                          f"{type(self.sampling).__name__}.")
    check_seed(self.seed)
    if not isinstance(self.ignore_eos, (bool, np.bool_)):
      raise SettingsError(f"ignore_eos must be a boolean, got {self.ignore_eos!r}.")
    if not is_int(self.min_tokens) or not 0 <= self.min_tokens <= self.max_tokens:
      raise SettingsError(f"min_tokens must be an integer in [0, max_tokens={self.max_tokens}], got "
                          f"{self.min_tokens!r}.")


def _bad(message: str, param: str | None = None, code: str | None = None, status: int = 400) -> APIError:
  return APIError(status, message, param=param, code=code)


def _show(value, limit: int = 60) -> str:
  """repr(value), cut to `limit` characters (a 4000-digit integer or a long string is not echoed whole)."""
  text = repr(value)
  return text if len(text) <= limit else f"{text[:limit]}... ({len(text)} characters)"


def _bound(x: float) -> str:
  """A bound as people write it: 2147483647, not 2.14748e+09."""
  return str(int(x)) if float(x).is_integer() else f"{x:g}"


def _same(value, neutral) -> bool:
  """value == neutral with bools apart from numbers (True == 1 and False == 0 in Python)."""
  if isinstance(value, bool) or isinstance(neutral, bool):
    return value is neutral
  return value == neutral


def parse_json(raw: bytes) -> Any:
  """A request body -> its JSON value; APIError 400 for anything json.loads refuses (bad bytes, bad syntax, an
  integer of more than 4300 digits, nesting deeper than Python's recursion), nesting deeper than MAX_DEPTH, and a
  lone UTF-16 surrogate ("\\ud800") in any string or field name (no tokenizer nor UTF-8 encoder takes one)."""
  try:
    value = json.loads(raw)
  except RecursionError:
    raise _bad(f"the request body is nested deeper than {MAX_DEPTH} levels.", code="invalid_json") from None
  except (ValueError, UnicodeDecodeError) as e:  # JSONDecodeError, an integer too long to convert
    raise _bad(f"the request body is not valid JSON: {e}.", code="invalid_json") from None
  stack = [(value, 1, None)]
  while stack:  # iterative: a body nested 1000 deep must not exhaust the recursion limit here either
    item, depth, where = stack.pop()
    if isinstance(item, (dict, list)) and depth > MAX_DEPTH:
      raise _bad(f"the request body is nested deeper than {MAX_DEPTH} levels.", code="invalid_json")
    if isinstance(item, dict):
      for key, v in item.items():
        field = key if where is None else f"{where}.{key}"
        if _SURROGATE.search(key):
          raise _bad(f"a field name holds a lone UTF-16 surrogate: {_show(key)}.", code="invalid_json")
        stack.append((v, depth + 1, field))
    elif isinstance(item, list):
      stack.extend((v, depth + 1, where) for v in item)
    elif isinstance(item, str) and _SURROGATE.search(item):
      raise _bad(f"{where or 'the body'} holds a lone UTF-16 surrogate (not a character): {_show(item)}.",
                 where, "invalid_json")
  return value


_SURROGATE = re.compile("[\ud800-\udfff]")


def _number(body: dict, name: str, default, *, lo: float, hi: float, integer: bool = False, lo_open: bool = False):
  value = body.get(name, default)
  if value is None:
    return default
  kind = "an integer" if integer else "a number"
  if isinstance(value, bool) or not isinstance(value, (int, float)) or (integer and not isinstance(value, int)):
    raise _bad(f"{name} must be {kind}, got {type(value).__name__} {_show(value)}.", name, "invalid_type")
  finite = isinstance(value, int) or math.isfinite(value)  # (math.isfinite of a 400-digit int overflows)
  if not finite or value < lo or value > hi or (lo_open and value == lo):
    bounds = f"{'(' if lo_open else '['}{_bound(lo)}, {_bound(hi)}]"
    raise _bad(f"{name} must be in {bounds}, got {_show(value)}.", name, "invalid_value")
  return int(value) if integer else float(value)


def _stop(body: dict) -> tuple[str, ...]:
  stop = body.get("stop")
  if stop is None:
    return ()
  stops = [stop] if isinstance(stop, str) else stop
  if not isinstance(stops, list) or not all(isinstance(s, str) for s in stops):
    raise _bad(f"stop must be a string or a list of strings, got {stop!r}.", "stop", "invalid_type")
  if len(stops) > MAX_STOPS:
    raise _bad(f"stop takes at most {MAX_STOPS} strings, got {len(stops)}.", "stop", "invalid_value")
  if any(not s for s in stops):
    raise _bad("stop strings must not be empty.", "stop", "invalid_value")
  return tuple(stops)


def _common(body: Any, kind: str, served_model: str, allowed: set[str], max_tokens_default: int,
            max_new_tokens: int) -> dict:
  if not isinstance(body, dict):
    raise _bad(f"the request body must be a JSON object, got {type(body).__name__}.")
  unknown = sorted(k for k in body if k not in allowed and k not in _NEUTRAL)
  if unknown:
    raise _bad(f"unknown or unsupported field(s): {', '.join(unknown)}.", unknown[0], "unsupported_parameter")
  for name, neutral in _NEUTRAL.items():  # a value that would change the answer is refused, named
    value = body.get(name)
    if not (name in _FREE or value is None or any(_same(value, v) for v in neutral)):
      allowed = " or ".join(json.dumps(v) for v in neutral)
      raise _bad(f"{name}={_show(value)} is not supported by this server (only null or {allowed}).", name,
                 "unsupported_parameter")
  model = body.get("model")
  if model is None:
    raise _bad("model is required (GET /v1/models lists what this server serves).", "model", "missing_required")
  if not isinstance(model, str):
    raise _bad(f"model must be a string, got {type(model).__name__}.", "model", "invalid_type")
  if model != served_model:
    raise APIError(404, f"The model {model!r} does not exist: this server serves {served_model!r}.",
                   param="model", code="model_not_found")
  n = _number(body, "n", 1, lo=1, hi=1e9, integer=True)
  if n != 1:
    raise _bad(f"n must be 1 (one choice per request), got {n}.", "n", "invalid_value")
  names = ("max_completion_tokens", "max_tokens") if kind == "chat" else ("max_tokens",)
  max_tokens = max_tokens_default
  for name in names:
    if body.get(name) is not None:
      max_tokens = _number(body, name, None, lo=1, hi=max_new_tokens, integer=True)
      if max_tokens is None:
        max_tokens = max_tokens_default
      break
  stream = body.get("stream", False)
  if stream is None:
    stream = False
  if not isinstance(stream, bool):
    raise _bad(f"stream must be a boolean, got {stream!r}.", "stream", "invalid_type")
  options = body.get("stream_options")
  include_usage = False
  if options is not None:
    if not stream:
      raise _bad("stream_options is only allowed with stream=true.", "stream_options", "invalid_value")
    if not isinstance(options, dict) or any(k not in _STREAM_OPTIONS for k in options):
      raise _bad(f"stream_options takes only {' and '.join(_STREAM_OPTIONS)}, got {options!r}.", "stream_options",
                 "invalid_value")
    include_usage = options.get("include_usage", False)
    if not isinstance(include_usage, bool):
      raise _bad(f"stream_options.include_usage must be a boolean, got {include_usage!r}.",
                 "stream_options.include_usage", "invalid_type")
  return dict(
      kind=kind, model=model, max_tokens=max_tokens,
      temperature=_number(body, "temperature", 1.0, lo=0, hi=2),  # OpenAI's default: 1
      top_p=_number(body, "top_p", 1.0, lo=0, hi=1, lo_open=True),
      top_k=_number(body, "top_k", 0, lo=0, hi=1e9, integer=True),
      seed=_number(body, "seed", 0, lo=0, hi=MAX_SEED, integer=True),
      stop=_stop(body), stream=stream, include_usage=include_usage,
      **_benchmark_fields(body, options if options is not None else {}, include_usage, max_tokens))


_STREAM_OPTIONS = ("include_usage", "continuous_usage_stats")
_BENCHMARK_FIELDS = ("ignore_eos", "min_tokens")  # vLLM's sampling extensions that benchmark clients send


def _flag(value, name: str) -> bool:
  if value is None:
    return False
  if not isinstance(value, bool):
    raise _bad(f"{name} must be a boolean, got {value!r}.", name, "invalid_type")
  return value


def _benchmark_fields(body: dict, options: dict, include_usage: bool, max_tokens: int) -> dict:
  """ignore_eos, min_tokens and stream_options.continuous_usage_stats, read as vLLM reads them (continuous usage
  only with include_usage; min_tokens at most the request's max_tokens)."""
  continuous = _flag(options.get("continuous_usage_stats"), "stream_options.continuous_usage_stats")
  min_tokens = _number(body, "min_tokens", 0, lo=0, hi=1e9, integer=True)
  if min_tokens > max_tokens:
    raise _bad(f"min_tokens must be at most max_tokens={max_tokens}, got {min_tokens}.", "min_tokens",
               "invalid_value")
  return dict(continuous_usage=include_usage and continuous, ignore_eos=_flag(body.get("ignore_eos"), "ignore_eos"),
              min_tokens=min_tokens)


def _check_chars(chars: int, max_input_length: int, param: str) -> None:
  """The pre-check before encoding: a text of more than MAX_CHARS_PER_TOKEN characters per allowed token."""
  if chars > MAX_CHARS_PER_TOKEN * max_input_length:
    raise _bad(f"the prompt has {chars} characters, more than this server encodes for its maximum of "
               f"{max_input_length} tokens (--max_input_length; {MAX_CHARS_PER_TOKEN} characters a token at most).",
               param, "context_length_exceeded")


def _check_length(ids: list[int], max_input_length: int, param: str) -> tuple[int, ...]:
  if not ids:
    raise _bad(f"{param} is empty: nothing to continue.", param, "invalid_value")
  if len(ids) > max_input_length:
    raise _bad(f"the prompt has {len(ids)} tokens, more than this server's maximum of {max_input_length} "
               f"(--max_input_length).", param, "context_length_exceeded")
  return tuple(ids)


_COMPLETION_FIELDS = {"model", "prompt", "max_tokens", "temperature", "top_p", "top_k", "seed", "stop", "n",
                      "stream", "stream_options", *_BENCHMARK_FIELDS}
_CHAT_FIELDS = (_COMPLETION_FIELDS - {"prompt"}) | {"messages", "max_completion_tokens"}


def parse_completion(body: Any, *, served_model: str, tokenizer, vocab_size: int, max_input_length: int,
                     max_tokens: int, max_new_tokens: int) -> Request:
  """POST /v1/completions' body -> Request. prompt: a string (encoded as `tokenizer.encode` does, special tokens
  included), a list of one string, or token ids (ints in [0, vocab_size)); APIError otherwise."""
  common = _common(body, "completion", served_model, _COMPLETION_FIELDS, max_tokens, max_new_tokens)
  prompt = body.get("prompt")
  if prompt is None:
    raise _bad("prompt is required.", "prompt", "missing_required")
  if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], (str, list)):
    prompt = prompt[0]
  if isinstance(prompt, str):
    _check_chars(len(prompt), max_input_length, "prompt")
    ids = list(tokenizer.encode(prompt)) if prompt else []
  elif isinstance(prompt, list) and all(isinstance(t, (int, float)) for t in prompt):  # ([]: empty, below)
    odd = [t for t in prompt if isinstance(t, bool) or not isinstance(t, int)]
    if odd:
      raise _bad(f"prompt token ids must be integers, got {type(odd[0]).__name__} {odd[0]!r}.", "prompt",
                 "invalid_type")
    if len(prompt) > max_input_length:  # before looking at each id
      _check_length(prompt, max_input_length, "prompt")
    bad = [t for t in prompt if not 0 <= t < vocab_size]
    if bad:
      raise _bad(f"prompt token ids must be in [0, {vocab_size}), got {_show(bad[0])}.", "prompt", "invalid_value")
    ids = list(prompt)
  elif isinstance(prompt, list) and len(prompt) > 1 and all(isinstance(p, (str, list)) for p in prompt):
    raise _bad(f"one prompt per request (n=1): got a list of {len(prompt)} prompts.", "prompt", "invalid_value")
  else:
    raise _bad(f"prompt must be a string or a list of token ids, got {type(prompt).__name__}.", "prompt",
               "invalid_type")
  return Request(prompt_ids=_check_length(ids, max_input_length, "prompt"), **common)


def _special_texts(tokenizer) -> tuple[str, ...]:
  """The texts the tokenizer reads as one added token (<|im_start|>, </s>, ...): special tokens and added ones."""
  hf = getattr(tokenizer, "hf_tokenizer", None)
  if hf is None:
    return ()
  texts = set(getattr(hf, "all_special_tokens", ()))
  texts.update(str(t) for t in getattr(hf, "added_tokens_decoder", {}).values())
  return tuple(sorted((t for t in texts if t), key=len, reverse=True))


def parse_chat(body: Any, *, served_model: str, tokenizer, max_input_length: int, max_tokens: int,
               max_new_tokens: int) -> Request:
  """POST /v1/chat/completions' body -> Request: messages ({"role", "content": str}) rendered by the target
  tokenizer's chat template with the assistant's turn opened; APIError (400) when the target has none. A message
  with another field holding a value (name, tool_calls, ...) is refused, not dropped; so is content holding one of
  the tokenizer's special or added tokens' text (<|im_start|>, ...): the rendered text is encoded with special
  tokens parsed, so such content would forge the template's turn markers."""
  common = _common(body, "chat", served_model, _CHAT_FIELDS, max_tokens, max_new_tokens)
  messages = body.get("messages")
  if messages is None:
    raise _bad("messages is required.", "messages", "missing_required")
  if not isinstance(messages, list) or not messages:
    raise _bad("messages must be a non-empty list of {role, content} objects.", "messages", "invalid_type")
  clean = []
  for i, m in enumerate(messages):
    if not isinstance(m, dict) or not isinstance(m.get("role"), str):
      raise _bad(f"messages[{i}] must be an object with a string role, got {m!r}.", f"messages[{i}]", "invalid_type")
    if m["role"] not in ("system", "user", "assistant", "developer"):
      raise _bad(f"messages[{i}].role {m['role']!r} is not supported (system, user, assistant, developer).",
                 f"messages[{i}].role", "invalid_value")
    extra = sorted(k for k, v in m.items() if k not in ("role", "content") and v not in (None, [], ""))
    if extra:  # said, never dropped: a name or tool calls the template would not see
      raise _bad(f"messages[{i}].{extra[0]} is not supported by this server (messages take role and content).",
                 f"messages[{i}].{extra[0]}", "unsupported_parameter")
    content = m.get("content")
    if isinstance(content, list):  # [{"type": "text", "text": ...}, ...]
      if not all(isinstance(p, dict) and p.get("type") == "text" and isinstance(p.get("text"), str) for p in content):
        raise _bad(f"messages[{i}].content: only text parts are supported.", f"messages[{i}].content",
                   "invalid_value")
      content = "".join(p["text"] for p in content)
    if not isinstance(content, str):
      raise _bad(f"messages[{i}].content must be a string, got {type(content).__name__}.",
                 f"messages[{i}].content", "invalid_type")
    clean.append({"role": "system" if m["role"] == "developer" else m["role"], "content": content})
  _check_chars(sum(len(m["content"]) for m in clean), max_input_length, "messages")
  if not getattr(getattr(tokenizer, "hf_tokenizer", None), "chat_template", None):
    raise _bad(f"the model {served_model!r} has no chat template (not a chat or instruct model): use "
               "/v1/completions with a plain prompt.", "messages", "no_chat_template")
  specials = _special_texts(tokenizer)
  for i, m in enumerate(clean):  # the rendered text is encoded with special tokens parsed: this would forge a turn
    marker = next((t for t in specials if t in m["content"]), None)
    if marker is not None:
      raise _bad(f"messages[{i}].content holds the special token {marker!r}, which the chat template's text would "
                 "read as a marker of its own: not allowed in message content.", f"messages[{i}].content",
                 "invalid_value")
  try:
    text = tokenizer.apply_chat_template(clean)
  except Exception as e:  # pylint: disable=broad-except  (a template's own error: a role order it refuses)
    raise _bad(f"the model's chat template cannot render these messages: {e}", "messages", "invalid_value") from None
  return Request(prompt_ids=_check_length(list(tokenizer.encode(text)), max_input_length, "messages"), **common)
