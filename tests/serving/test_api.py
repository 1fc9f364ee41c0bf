"""The HTTP layer (jaxspec.serving.app, scheduler, requests, text, metrics) with the official `openai` client against
a live uvicorn on 127.0.0.1, over a stub engine with known outputs (tests/serving/stub_engine.py): every bad request,
the queue bound, stop strings, streaming, cancellation and the metrics. The real engine's tests:
test_server.py."""

from __future__ import annotations

import concurrent.futures
import json
import time

import httpx
import openai
import pytest
from prometheus_client.parser import text_string_to_metric_families

import jaxspec
from jaxspec.serving import server as serving
from stub_engine import Settings, StubEngine

MODEL = "stub-ende"
SLOTS, QUEUE, MAX_TOKENS = 2, 1, 12


@pytest.fixture(scope="module")
def live():
  tokenizer = jaxspec.load("ende-draft").tokenizer
  engine = StubEngine(tokenizer, slots=SLOTS, max_input_length=24, max_new_tokens=16, per_step=2)
  scheduler, app = serving.build(engine, model_name=MODEL, max_tokens=MAX_TOKENS, queue_size=QUEUE,
                                 settings_type=Settings)
  with serving.Background(scheduler, app) as server:
    server.wait_ready(60)
    yield server, engine, scheduler


@pytest.fixture(scope="module")
def client(live):
  return openai.OpenAI(base_url=live[0].url + "/v1", api_key="none", max_retries=0, timeout=30)


def _wait(cond, timeout=10.0):
  deadline = time.monotonic() + timeout
  while not cond():
    assert time.monotonic() < deadline, "condition not reached"
    time.sleep(0.02)


def _expected_text(engine, prompt, max_tokens=MAX_TOKENS, temperature=0.0, **kw):
  ids = engine.tokenizer.encode(prompt)
  return engine.tokenizer.decode(engine.expected(ids, Settings(max_tokens, jaxspec.Sampling(temperature), **kw)))


def test_health_and_models(live, client):
  server, _, _ = live
  assert httpx.get(server.url + "/health").status_code == 200
  assert [m.id for m in client.models.list().data] == [MODEL]


def test_completion_text_usage_and_finish(live, client):
  _, engine, _ = live
  out = client.completions.create(model=MODEL, prompt="The house is small.", temperature=0, max_tokens=5,
                                  user="u1", presence_penalty=0, logit_bias={})  # neutral fields are accepted
  assert out.choices[0].text == _expected_text(engine, "The house is small.", max_tokens=5)
  assert out.choices[0].finish_reason == "length"
  n = len(engine.tokenizer.encode("The house is small."))
  assert (out.usage.prompt_tokens, out.usage.completion_tokens, out.usage.total_tokens) == (n, 5, n + 5)
  ids = engine.tokenizer.encode("A cat.")  # token ids as the prompt
  assert client.completions.create(model=MODEL, prompt=ids, temperature=0).choices[0].text == _expected_text(
      engine, "A cat.")


def test_stream_equals_whole_and_reports_usage(live, client):
  _, engine, _ = live
  chunks = list(client.completions.create(model=MODEL, prompt="Green water.", temperature=0.7, seed=3, stream=True,
                                          stream_options={"include_usage": True}))
  text = "".join(c.choices[0].text for c in chunks if c.choices)
  assert text == _expected_text(engine, "Green water.", temperature=0.7, seed=3)
  assert len([c for c in chunks if c.choices]) > 2  # deltas, not one piece
  assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == MAX_TOKENS
  assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "length"
  other = client.completions.create(model=MODEL, prompt="Green water.", temperature=0.7, seed=4).choices[0].text
  assert other != text  # the seed travels to the engine


def test_stop_string_cuts_text_and_frees_slot(live, client):
  _, engine, scheduler = live
  full = _expected_text(engine, "The river.")
  stop = full.split()[3]
  freed = len(engine.freed)
  for stream in (False, True):
    if stream:
      text = "".join(c.choices[0].text for c in client.completions.create(
          model=MODEL, prompt="The river.", temperature=0, stop=[stop, "zzzz"], stream=True))
    else:
      out = client.completions.create(model=MODEL, prompt="The river.", temperature=0, stop=stop)
      assert out.choices[0].finish_reason == "stop"
      text = out.choices[0].text
    assert text == full[:full.index(stop)]
  assert len(engine.freed) == freed + 2  # the scheduler freed the slot at the stop string
  _wait(lambda: scheduler.active == 0)


def test_concurrent_requests_join_and_leave(live, client):
  _, engine, _ = live
  prompts = [f"The {w} is small." for w in ("house", "cat", "dog", "tree", "stone", "book")]
  with concurrent.futures.ThreadPoolExecutor(SLOTS + QUEUE) as pool:  # more requests than slots + queue: some
    futures = [pool.submit(client.completions.create, model=MODEL, prompt=p, temperature=0, max_tokens=4 + 2 * i)
               for i, p in enumerate(prompts)]  # wait behind others, and retire at different steps
    texts = [f.result().choices[0].text for f in futures]
  assert texts == [_expected_text(engine, p, max_tokens=4 + 2 * i) for i, p in enumerate(prompts)]
  assert len(engine.threads) == 1  # only the engine thread ever called the engine


BAD = [  # (body, status, a word the message names)
    ({"prompt": "x"}, 400, "model"),
    ({"model": "gpt-4", "prompt": "x"}, 404, "gpt-4"),
    ({"model": MODEL}, 400, "prompt"),
    ({"model": MODEL, "prompt": "x", "temperature": 3}, 400, "temperature"),
    ({"model": MODEL, "prompt": "x", "temperature": "hot"}, 400, "temperature"),
    ({"model": MODEL, "prompt": "x", "top_p": 0}, 400, "top_p"),
    ({"model": MODEL, "prompt": "x", "top_k": -1}, 400, "top_k"),
    ({"model": MODEL, "prompt": "x", "max_tokens": 17}, 400, "max_tokens"),
    ({"model": MODEL, "prompt": "x", "max_tokens": 0}, 400, "max_tokens"),
    ({"model": MODEL, "prompt": "x", "max_tokens": 2.5}, 400, "max_tokens"),
    ({"model": MODEL, "prompt": "x", "seed": -1}, 400, "seed"),
    ({"model": MODEL, "prompt": "x", "n": 2}, 400, "n"),
    ({"model": MODEL, "prompt": "x", "stop": 5}, 400, "stop"),
    ({"model": MODEL, "prompt": "x", "stream": "yes"}, 400, "stream"),
    ({"model": MODEL, "prompt": "x", "frobnicate": 1}, 400, "frobnicate"),
    ({"model": MODEL, "prompt": "x", "presence_penalty": 0.5}, 400, "presence_penalty"),
    ({"model": MODEL, "prompt": "x", "logprobs": 2}, 400, "logprobs"),
    ({"model": MODEL, "prompt": "word " * 40}, 400, "maximum of 24"),
    ({"model": MODEL, "prompt": ""}, 400, "empty"),
    ({"model": MODEL, "prompt": [1, 99999]}, 400, "99999"),
    ({"model": MODEL, "prompt": ["a", "b"]}, 400, "one prompt"),
    ({"model": MODEL, "prompt": "x", "stream_options": {"include_usage": True}}, 400, "stream"),
    ([1, 2], 400, "JSON object"),
]


@pytest.mark.parametrize("body,status,word", BAD, ids=[str(i) for i in range(len(BAD))])
def test_bad_requests_get_openai_errors(live, body, status, word):
  r = httpx.post(live[0].url + "/v1/completions", json=body)
  assert r.status_code == status, r.text
  error = r.json()["error"]
  assert set(error) == {"message", "type", "param", "code"} and word in error["message"], error


def test_malformed_json_and_chat_without_template(live, client):
  r = httpx.post(live[0].url + "/v1/completions", content=b'{"model": ', headers={"content-type": "application/json"})
  assert r.status_code == 400 and "not valid JSON" in r.json()["error"]["message"]
  with pytest.raises(openai.BadRequestError, match="no chat template"):
    client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "hi"}])
  with pytest.raises(openai.BadRequestError, match="messages"):
    client.chat.completions.create(model=MODEL, messages=[])
  with pytest.raises(openai.NotFoundError, match="does not exist"):
    client.completions.create(model="nope", prompt="x")


def test_queue_bound_429_and_disconnect_frees_slots(live, client):
  server, engine, scheduler = live
  engine.step_s, engine.per_step = 0.5, 1  # each request now holds its slot for 8 s
  try:
    with httpx.Client(base_url=server.url, timeout=30) as http:
      streams = []
      for i in range(SLOTS + QUEUE):  # every slot busy and the queue full
        s = http.stream("POST", "/v1/completions", json={"model": MODEL, "prompt": f"Cat {i}.", "stream": True,
                                                          "max_tokens": 16})
        streams.append((s, s.__enter__()))
      _wait(lambda: scheduler.active + scheduler.waiting == SLOTS + QUEUE)
      with pytest.raises(openai.RateLimitError, match="queue is full"):
        client.completions.create(model=MODEL, prompt="one too many")
      first = next(streams[0][1].iter_lines())  # a chunk arrived: decoding had begun
      assert first.startswith("data: {")
      for s, _ in streams:  # the clients go away mid-stream
        s.__exit__(None, None, None)
    _wait(lambda: scheduler.active == 0 and scheduler.waiting == 0 and not engine.state, timeout=2)
    assert sorted(engine.free_slots()) == list(range(SLOTS))
  finally:
    engine.step_s, engine.per_step = 0.0, 2
  out = client.completions.create(model=MODEL, prompt="After the storm.", temperature=0)  # later requests: correct
  assert out.choices[0].text == _expected_text(engine, "After the storm.")


def test_slow_whole_answers_and_their_disconnects(live, client):
  server, engine, scheduler = live
  engine.step_s, engine.per_step = 0.3, 1  # answers take longer than the server's disconnect poll
  try:
    out = client.completions.create(model=MODEL, prompt="A slow cat.", temperature=0, max_tokens=5)
    assert out.choices[0].text == _expected_text(engine, "A slow cat.", max_tokens=5)
    freed = len(engine.freed)
    with pytest.raises(httpx.ReadTimeout):  # a non-streaming client that gives up
      httpx.post(server.url + "/v1/completions", json={"model": MODEL, "prompt": "Gone.", "max_tokens": 16},
                 timeout=1.0)
    _wait(lambda: scheduler.active == 0 and not engine.state, timeout=5)
    assert len(engine.freed) == freed + 1
  finally:
    engine.step_s, engine.per_step = 0.0, 2


def test_metrics_parse_and_count(live, client):
  server, _, _ = live
  def scrape():
    text = httpx.get(server.url + "/metrics").text
    return {s.name + json.dumps(s.labels, sort_keys=True): s.value
            for f in text_string_to_metric_families(text) for s in f.samples}
  before = scrape()
  client.completions.create(model=MODEL, prompt="The cat.", temperature=0, max_tokens=6)
  httpx.post(server.url + "/v1/completions", json={"model": MODEL, "prompt": "x", "top_p": 7})
  after = scrape()
  diff = lambda k: after.get(k, 0) - before.get(k, 0)
  assert diff('jaxspec_requests_total{"status": "200"}') == 1
  assert diff('jaxspec_requests_total{"status": "400"}') == 1
  assert diff("jaxspec_completion_tokens_total{}") == 6
  assert diff("jaxspec_time_to_first_token_seconds_count{}") == 1
  assert diff("jaxspec_inter_token_latency_seconds_count{}") == 5
  # The stub's steps after the insert's first token give 2, 2, 1 tokens: 2 drafted per token, n - 1 accepted.
  assert diff("jaxspec_draft_tokens_total{}") == 10 and diff("jaxspec_accepted_tokens_total{}") == 2
  assert after["jaxspec_slots{}"] == SLOTS and after["jaxspec_queue_length{}"] == 0
  assert after["jaxspec_active_slots{}"] == 0
