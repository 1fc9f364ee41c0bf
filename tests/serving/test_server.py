"""launch/serve.py end to end: the embedded EN-DE pair speculating (gamma 2, under the verification budget: the
server's default; its warm-up times each step program once) in a subprocess on 127.0.0.1, driven by the official `openai` client. Greedy text equals
`jaxspec.generate`'s plain greedy text for each prompt whatever runs beside it, seeds change a sampled text (under
the budget a seeded request is an exact sample, not a reproducible one: the budget's choices follow what the server
served; a fixed gamma's seeded promise is tests/serving/test_slot_engine.py's and test_slot_engine_eos.py's),
/metrics has the budget's step-cost curves, its steps per draft length and the verifications (tau), streaming
equals the whole answer, a client that disconnects mid-stream frees its slot (GET /metrics: every slot free again)
and later requests are still right; the benchmark (jaxspec.bench.serving) runs against it. The HTTP layer's every
bad request, the 429 and stop strings: test_api.py."""

from __future__ import annotations

import concurrent.futures
import json
import os
import time

import httpx
import openai
import pytest

import jaxspec
from jaxspec.bench import serving as bench
from jaxspec.serving.server import free_port
from script_helpers import assert_one_line_error, run_script, run_scripts
from serve_helpers import EMBEDDED_MAX_NEW, EMBEDDED_SERVER, EMBEDDED_SLOTS, serve

MODEL = "ende-target"
SLOTS, MAX_NEW = EMBEDDED_SLOTS, EMBEDDED_MAX_NEW
PROMPTS = ["The house is small.", "I like green tea.", "Where is the station?", "The weather is nice today.",
           "We read a book.", "Click on the button to install the package on your computer."]  # the last: 16 tokens


@pytest.fixture(scope="module")
def server(tmp_path_factory):
  args = [*EMBEDDED_SERVER, "--queue=4"]
  log = tmp_path_factory.mktemp("serve") / "log.txt"
  with serve(args, log, while_compiling=_greedy_reference) as live:
    yield (*live, log)  # (url, health codes, greedy references, the server's log)


@pytest.fixture(scope="module")
def client(server):
  return openai.OpenAI(base_url=server[0] + "/v1", api_key="none", max_retries=0, timeout=120)


@pytest.fixture(scope="module")
def greedy(server):
  return server[2]


def _greedy_reference() -> dict[str, str]:
  """jaxspec.generate's plain greedy text of each prompt alone, max_tokens MAX_NEW."""
  target = jaxspec.load(MODEL)
  out = jaxspec.generate(target, PROMPTS, max_new_tokens=MAX_NEW, max_input_length=16)
  assert out.lengths[-1] == MAX_NEW  # the long one runs to max_tokens
  return {p: target.tokenizer.decode(out.tokens[i, :out.lengths[i]]) for i, p in enumerate(PROMPTS)}


def _metric(url, name):
  return bench.scrape(url)[name]


def test_health_is_503_until_compiled(server):
  codes = server[1]
  assert codes[-1] == 200 and 503 in codes  # it answered while compiling, then became ready


def test_greedy_equals_generate_while_requests_join_and_leave(client, greedy):
  # More requests than slots, with different lengths: they wait, join free slots and retire at other steps.
  def ask(i, p):
    return client.completions.create(model=MODEL, prompt=p, temperature=0, max_tokens=MAX_NEW - (i % 3))
  with concurrent.futures.ThreadPoolExecutor(len(PROMPTS)) as pool:
    outs = list(pool.map(ask, range(len(PROMPTS)), PROMPTS))
  for i, (p, out) in enumerate(zip(PROMPTS, outs)):
    want = MAX_NEW - (i % 3)
    if out.choices[0].finish_reason == "length":
      assert out.usage.completion_tokens == want
    assert greedy[p].startswith(out.choices[0].text), (p, out.choices[0].text, greedy[p])
    if out.usage.completion_tokens < want or want == MAX_NEW:
      assert out.choices[0].text == greedy[p]
  stream = client.completions.create(model=MODEL, prompt=PROMPTS[0], temperature=0, stream=True,
                                     stream_options={"include_usage": True})
  chunks = list(stream)
  assert "".join(c.choices[0].text for c in chunks if c.choices) == greedy[PROMPTS[0]]
  assert chunks[-1].usage.completion_tokens == outs[0].usage.completion_tokens


def test_seeded_sampling_is_a_sample_that_seeds_change(client):
  """Under the budget a seeded request's draws follow the budget's choices, which follow what the server served
  (its refined costs, its requests' end rate, the previous step's tier): an exact sample, not a reproducible one
  (a fixed gamma's seeded promise: test_slot_engine_eos.py). Seeds still change the sample, alone and under load."""
  kw = dict(model=MODEL, prompt=PROMPTS[1], temperature=1.0, max_tokens=MAX_NEW)
  with concurrent.futures.ThreadPoolExecutor(4) as pool:  # under load
    load = [pool.submit(client.completions.create, model=MODEL, prompt=p, temperature=0.8, seed=i)
            for i, p in enumerate(PROMPTS[2:])]
    loaded = client.completions.create(seed=11, **kw).choices[0].text
    [f.result() for f in load]
  texts = {client.completions.create(seed=s, **kw).choices[0].text for s in range(12, 18)}
  assert loaded and all(texts) and len(texts | {loaded}) > 1  # seeds change the sample (a greedy server would fail)


def test_disconnect_mid_stream_frees_the_slot(server, client, greedy):
  # (test_api.py holds the slot for seconds with a slow stub engine; here a step takes milliseconds, so the request
  # may also have ended on its own by the time the server sees the socket close.)
  url = server[0]
  with httpx.Client(timeout=60) as http:
    with http.stream("POST", url + "/v1/completions", json={
        "model": MODEL, "prompt": PROMPTS[-1], "max_tokens": MAX_NEW, "stream": True, "temperature": 0}) as r:
      for line in r.iter_lines():
        if line.startswith("data: {"):
          break  # one chunk arrived: the request holds a slot; now the client goes away
  deadline = time.monotonic() + 10
  while _metric(url, "jaxspec_active_slots") != 0:
    assert time.monotonic() < deadline, "the slot was not freed"
    time.sleep(0.05)
  assert _metric(url, "jaxspec_queue_length") == 0
  assert _metric(url, "jaxspec_active_slots") == 0  # every slot free again
  for p in (PROMPTS[-1], PROMPTS[3]):  # later requests (one in the slot the cancelled request left) are right
    assert client.completions.create(model=MODEL, prompt=p, temperature=0).choices[0].text == greedy[p]


def test_metrics_count_acceptance(server):
  m = bench.scrape(server[0])
  assert m["jaxspec_slots"] == SLOTS and m["jaxspec_requests_total{200}"] >= 10
  # Whether the budget drafted here follows the timings of this machine (its choice weighs measured step costs;
  # tests/serving/test_budget.py forces the costs to check each choice); what it drafted, the metrics count.
  drafted, accepted = m["jaxspec_draft_tokens_total"], m["jaxspec_accepted_tokens_total"]
  # A probe's few steps may draft a handful of tokens that are all rejected (probes.py); of 16 or more, the embedded
  # pair (about 0.7 of its drafts accepted) rejecting every one would be a counting error.
  assert 0 <= accepted <= drafted and (drafted < 16 or accepted > 0), (drafted, accepted)
  assert m["jaxspec_time_to_first_token_seconds_count"] >= 10
  # The verification budget: its cost curve at the one row bucket (--row_buckets=SLOTS) for each tier, the steps
  # each tier ran, and the verify calls (tau = (accepted + verifications) / verifications, >= 1).
  costs = [f"jaxspec_step_cost_seconds{{{k},{SLOTS}}}" for k in (0, 1, 2)]  # {gamma,rows}: labels by name
  assert sorted(k for k in m if k.startswith("jaxspec_step_cost_seconds")) == costs
  assert all(m[k] > 0 for k in costs)
  steps = {k: v for k, v in m.items() if k.startswith("jaxspec_steps_total")}
  assert steps and sum(steps.values()) > 0 and m["jaxspec_verifications_total"] > 0
  log = server[3].read_text()  # the banner names the budget's tiers; the curves are printed once it is ready
  assert "verification budget over draft lengths [0, 1, 2]" in log and f"rows {SLOTS}: k=0 " in log, log


def test_benchmark_drives_the_server(server, tmp_path):
  (tmp_path / "w.jsonl").write_text("".join(f'{{"prompt": "{p}", "max_tokens": 8}}\n' for p in PROMPTS[:3]))
  res = run_script(["launch/serve_benchmark.py", f"--url={server[0]}", f"--baseline_url={server[0]}",
                    "--labels=a,b", f"--workload={tmp_path / 'w.jsonl'}", "--concurrency=1,2", "--rate=20",
                    "--requests=3", "--rounds=2", "--timeout=120", f"--output={tmp_path / 'out'}",
                    f"--before_round=echo $ROUND >> {tmp_path / 'rounds'}"], timeout=300)
  assert res.returncode == 0, res.stderr[-3000:]
  assert (tmp_path / "rounds").read_text() == "0\n1\n"  # once before each round (each runs every level)
  rows = json.loads((tmp_path / "out.json").read_text())
  assert [(r["server"], r["mode"], r["level"]) for r in rows] == [
      ("a", "concurrency", 1), ("a", "concurrency", 2), ("a", "rate", 20.0)] + [
      ("b", "concurrency", 1), ("b", "concurrency", 2), ("b", "rate", 20.0)]
  for r in rows:
    assert r["failed"] == 0 and r["requests"] == 6 and r["output_tokens"] > 0, r  # 3 a round, 2 rounds
    assert r["rounds"] == 2 and len(r["round_tokens_per_s"]) == 2 and min(r["round_tokens_per_s"]) > 0
    base = next(b for b in rows if b["server"] == "b" and (b["mode"], b["level"]) == (r["mode"], r["level"]))
    assert r["round_ratios"] == pytest.approx([x / y for x, y in zip(r["round_tokens_per_s"],
                                                                      base["round_tokens_per_s"])])
    assert r["ttft"]["p50"] <= r["e2e"]["p50"] and r["output_tokens_per_s"] > 0
    assert r["acceptance"] is None or 0 <= r["acceptance"] <= 1  # None: the budget drafted nothing in that run
  table = (tmp_path / "out.md").read_text()
  assert table.count("\n") == 2 + len(rows) and "speedup" in table and "by round" in table and "c=2" in table and table in res.stdout
  assert os.path.getsize(tmp_path / "out.png") > 1000


def test_a_mode_the_server_did_not_compile_is_a_400(server, client):
  """This server compiled greedy and sampled programs only (--modes): a top-p request is refused, naming it."""
  with pytest.raises(openai.BadRequestError, match="needs 'filtered'"):
    client.completions.create(model=MODEL, prompt=PROMPTS[0], temperature=0.8, top_p=0.9, max_tokens=4)


def test_script_errors_are_one_line(tmp_path):
  bad_table = tmp_path / "t.json"
  bad_table.write_text('{"entries": 3}')
  runs = [(["launch/serve.py", "--slots=0"], "--slots"),
          (["launch/serve.py", f"--speculation_table={bad_table}"], "SpeculationTable"),
          (["launch/serve.py", "--row_buckets=2,x"], "--row_buckets"),
          (["launch/serve.py", "--max_tokens=100", "--max_new_tokens=16"], "--max_tokens (the default of a request) "
           "must be at most --max_new_tokens"),
          (["launch/serve.py", "--host=0.0.0.0", f"--target={tmp_path / 'missing'}"], "no --api_key is set"),
          (["launch/serve_benchmark.py", f"--url=http://127.0.0.1:{free_port()}",
            "--workload=docs/bench/serving_ende.jsonl"], "no OpenAI-compatible server"),
          (["launch/serve_benchmark.py", f"--url=http://127.0.0.1:{free_port()}", "--before_round=exit 3"],
           "--before_round exited with status 3 before round 0")]
  for (args, needle), res in zip(runs, run_scripts([a for a, _ in runs], timeout=300)):
    assert_one_line_error(res, needle)
