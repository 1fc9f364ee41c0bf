"""What vLLM's and SGLang's benchmark clients send (guidellm, vLLM's benchmark_serving), through the HTTP layer over
the stub engine (tests/serving/stub_engine.py, which ends every answer with EOS after 3 tokens): ignore_eos and
min_tokens reach the engine, stop: null is no stop, stream_options.continuous_usage_stats puts the usage so far in
every chunk (with include_usage, as vLLM), and bad values get OpenAI's 400. guidellm itself: test_guidellm.py;
the engine's exactness with these settings: test_slot_engine_eos.py."""

from __future__ import annotations

import json

import httpx
import pytest

import jaxspec
from jaxspec.serving import requests
from jaxspec.serving import server as serving
from stub_engine import Settings, StubEngine

MODEL = "stub-ende"
EOS_AFTER, MAX_TOKENS = 3, 10


@pytest.fixture(scope="module")
def live():
  tokenizer = jaxspec.load("ende-draft").tokenizer
  engine = StubEngine(tokenizer, slots=2, max_input_length=24, max_new_tokens=16, per_step=2, eos_after=EOS_AFTER)
  scheduler, app = serving.build(engine, model_name=MODEL, max_tokens=MAX_TOKENS, queue_size=2,
                                 settings_type=Settings)
  with serving.Background(scheduler, app) as server:
    server.wait_ready(60)
    yield server.url, engine


def _post(url, **body):
  return httpx.post(url + "/v1/completions", json={"model": MODEL, "prompt": "The house.", **body}, timeout=30)


def _chunks(url, **body) -> list[dict]:
  with httpx.stream("POST", url + "/v1/completions", json={"model": MODEL, "prompt": "The house.", "stream": True,
                                                            **body}, timeout=30) as r:
    assert r.status_code == 200, r.read()
    lines = [line[len("data: "):] for line in r.iter_lines() if line.startswith("data: ")]
  assert lines[-1] == "[DONE]"
  return [json.loads(line) for line in lines[:-1]]


def test_ignore_eos_min_tokens_and_stop_null_reach_the_engine(live):
  url, _ = live
  cases = [({}, EOS_AFTER + 1, "stop"), ({"ignore_eos": True, "stop": None}, MAX_TOKENS, "length"),
           ({"min_tokens": 6}, 7, "stop"), ({"ignore_eos": False, "min_tokens": 0}, EOS_AFTER + 1, "stop")]
  for fields, tokens, reason in cases:
    r = _post(url, **fields)
    assert r.status_code == 200, r.text
    out = r.json()
    assert (out["usage"]["completion_tokens"], out["choices"][0]["finish_reason"]) == (tokens, reason), fields


def test_continuous_usage_stats_gives_the_usage_so_far_in_every_chunk(live):
  url, _ = live
  chunks = _chunks(url, ignore_eos=True, stream_options={"include_usage": True, "continuous_usage_stats": True})
  assert all(c["usage"] is not None for c in chunks)
  counts = [c["usage"]["completion_tokens"] for c in chunks]
  prompt = chunks[0]["usage"]["prompt_tokens"]
  assert counts == sorted(counts) and counts[-1] == MAX_TOKENS and len(set(counts)) > 2  # growing, per step
  assert all(c["usage"]["total_tokens"] == prompt + c["usage"]["completion_tokens"] for c in chunks)
  assert chunks[-1]["choices"] == []  # the usage chunk last, as without continuous stats
  # include_usage alone: null in every chunk but the last (OpenAI); continuous stats alone: no usage (vLLM).
  plain = _chunks(url, stream_options={"include_usage": True})
  assert [c["usage"] for c in plain[:-1]] == [None] * (len(plain) - 1) and plain[-1]["usage"]["completion_tokens"]
  assert all("usage" not in c for c in _chunks(url, stream_options={"continuous_usage_stats": True}))


BAD = [  # (fields, the param OpenAI's error names)
    ({"ignore_eos": "yes"}, "ignore_eos"),
    ({"min_tokens": -1}, "min_tokens"),
    ({"min_tokens": 1.5}, "min_tokens"),
    ({"min_tokens": MAX_TOKENS + 1}, "min_tokens"),  # above the default max_tokens
    ({"min_tokens": 5, "max_tokens": 4}, "min_tokens"),
    ({"stream": True, "stream_options": {"continuous_usage_stats": 1}}, "stream_options.continuous_usage_stats"),
    ({"stream": True, "stream_options": {"include_usage": True, "extra": True}}, "stream_options"),
]


@pytest.mark.parametrize("fields,param", BAD, ids=[str(i) for i in range(len(BAD))])
def test_bad_values_get_openai_errors(live, fields, param):
  r = _post(live[0], **fields)
  assert r.status_code == 400, r.text
  error = r.json()["error"]
  assert error["param"] == param and param.split(".")[-1] in error["message"], error


def test_chat_takes_the_same_fields():
  class Tokenizer:  # a chat template that joins the contents
    hf_tokenizer = type("HF", (), {"chat_template": "{{ messages }}"})()

    def apply_chat_template(self, messages):
      return " ".join(m["content"] for m in messages)

    def encode(self, text):
      return [5] * len(text.split())

  body = {"model": MODEL, "messages": [{"role": "user", "content": "a b c"}], "max_completion_tokens": 8,
          "stream": True, "stream_options": {"include_usage": True, "continuous_usage_stats": True},
          "ignore_eos": True, "min_tokens": 2, "stop": None}
  req = requests.parse_chat(body, served_model=MODEL, tokenizer=Tokenizer(), max_input_length=16, max_tokens=4,
                            max_new_tokens=16)
  assert (req.ignore_eos, req.min_tokens, req.continuous_usage, req.stop, req.max_tokens) == (True, 2, True, (), 8)
