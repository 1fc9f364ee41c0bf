"""A serving benchmark: drives a running OpenAI-compatible server (launch/serve.py) over HTTP and measures what its
clients see.

    items = read_workload("docs/bench/serving_ende.jsonl")          # {"prompt" | "messages", "max_tokens"?} a line
    rows = run_levels("http://127.0.0.1:8000", items, concurrencies=(1, 4, 16, 64), rates=(2.0,))
    print(markdown(rows)); plot(rows, "serving.png")
    both = compare({"speculative": URL_A, "plain": URL_B}, items, concurrencies=(1, 16), rounds=2)  # A B, B A
    grid = compare({"budget": URL_A, "fixed": URL_B, "plain": URL_C}, items, rounds=2)  # A B C, C B A; vs plain

Each level sends `requests` streaming requests (stream=true, include_usage), either from `concurrency` workers that
each send their next request as soon as the last one ends (a closed loop), or at a Poisson rate (exponential
gaps, an open loop, `rate` requests a second). Every request and every level is bounded by a timeout. Per request:
TTFT (send -> first non-empty text chunk), end-to-end latency (send -> [DONE]), completion tokens (the usage
chunk) and inter-token latency = (e2e - TTFT) / (tokens - 1), the time per output token after the first (vLLM's
TPOT: the row's "itl" percentiles, and "tpot" with its mean), and the gaps between successive text chunks after the
first ("chunk_itl": vLLM's ITL; a chunk holds a step's tokens). A level reports P50 / P90 / P99 of each over its
requests (TTFT and TPOT also their means), output tokens per second (all completion tokens over the level's wall
time), acceptance (draft tokens accepted / proposed, the difference of the server's /metrics counters over the
level; '-' for a plain server) and tau (tokens per verify call: (accepted + verifications) / verifications, from
the counters too; '-' for a server that does not export verifications), and each server's "ratio": its output
tokens/s over the last server's at the same level (the baseline: plain decoding). Failed requests are counted and
reported, never dropped silently. Servers (two, or more: plain, a fixed gamma and the budget) are compared level
by level, each level on one then the next, and with `rounds` > 1 again in the reverse order (A B, B A; A B C,
C B A): on a machine whose speed drifts (a shared CPU: the same plain
server measured 9.6 and 7.4 tok/s in two runs an hour apart, docs/serving.md), one order alone can make equal
servers look 15 % apart.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import os
import subprocess
import time
from typing import Callable, Sequence

import numpy as np

from jaxspec.errors import InputError

PERCENTILES = (50, 90, 99)


@dataclasses.dataclass(frozen=True)
class Item:
  """One request of a workload: a completion prompt or chat messages, and its max_tokens (None: the default)."""
  prompt: str | None = None
  messages: tuple | None = None
  max_tokens: int | None = None


def read_workload(path: str) -> list[Item]:
  """JSONL: one object a line with "prompt" (a string) or "messages" (chat), and optionally "max_tokens"."""
  try:
    with open(path, encoding="utf-8") as f:
      lines = [line for line in f if line.strip()]
  except OSError as e:
    raise InputError(f"workload {path}: {e.strerror}.") from None
  items = []
  for n, line in enumerate(lines, 1):
    try:
      row = json.loads(line)
    except json.JSONDecodeError as e:
      raise InputError(f"workload {path} line {n}: not JSON ({e}).") from None
    if not isinstance(row, dict) or (not isinstance(row.get("prompt"), str)) == (not isinstance(
        row.get("messages"), list)):
      raise InputError(f'workload {path} line {n}: expected {{"prompt": str}} or {{"messages": [...]}}, got {line!r}.')
    max_tokens = row.get("max_tokens")
    if max_tokens is not None and (not isinstance(max_tokens, int) or max_tokens < 1):
      raise InputError(f"workload {path} line {n}: max_tokens must be an integer >= 1, got {max_tokens!r}.")
    items.append(Item(row.get("prompt"), tuple(row["messages"]) if "messages" in row else None, max_tokens))
  if not items:
    raise InputError(f"workload {path} has no requests.")
  return items


@dataclasses.dataclass(frozen=True)
class Result:
  """One request as the client saw it (seconds; ttft None when no text came)."""
  ok: bool
  ttft: float | None
  e2e: float
  tokens: int
  error: str | None = None
  chunks: tuple[float, ...] = ()  # seconds from the send to each non-empty text chunk

  @property
  def gaps(self) -> list[float]:
    """The gaps between successive text chunks (vLLM's ITL), after the first."""
    return [b - a for a, b in zip(self.chunks, self.chunks[1:])]

  @property
  def itl(self) -> float | None:
    if not self.ok or self.ttft is None or self.tokens < 2:
      return None
    return (self.e2e - self.ttft) / (self.tokens - 1)


async def _one(client, url: str, model: str, item: Item, *, max_tokens: int, temperature: float, seed: int,
               timeout: float) -> Result:
  chat = item.messages is not None
  body = {"model": model, "stream": True, "stream_options": {"include_usage": True}, "temperature": temperature,
          "seed": seed, "max_tokens": item.max_tokens or max_tokens}
  body.update({"messages": list(item.messages)} if chat else {"prompt": item.prompt})
  start, ttft, tokens, chunks = time.perf_counter(), None, 0, []
  try:
    async with asyncio.timeout(timeout):
      async with client.stream("POST", f"{url}/v1/{'chat/completions' if chat else 'completions'}",
                               json=body) as r:
        if r.status_code != 200:
          text = (await r.aread()).decode("utf-8", "replace")
          return Result(False, None, time.perf_counter() - start, 0, f"HTTP {r.status_code}: {text[:200]}")
        async for line in r.aiter_lines():
          if not line.startswith("data: "):
            continue
          data = line[len("data: "):]
          if data == "[DONE]":
            break
          chunk = json.loads(data)
          if "error" in chunk:
            return Result(False, ttft, time.perf_counter() - start, tokens, chunk["error"].get("message"))
          for choice in chunk.get("choices") or ():
            text = choice.get("delta", {}).get("content") if chat else choice.get("text")
            if text:
              chunks.append(time.perf_counter() - start)
            if text and ttft is None:
              ttft = chunks[-1]
          if chunk.get("usage"):
            tokens = chunk["usage"]["completion_tokens"]
  except TimeoutError:
    return Result(False, ttft, time.perf_counter() - start, tokens, f"timed out after {timeout:g} s")
  except Exception as e:  # pylint: disable=broad-except  (a connection error is one failed request, reported)
    return Result(False, ttft, time.perf_counter() - start, tokens, f"{type(e).__name__}: {e}")
  return Result(True, ttft, time.perf_counter() - start, tokens, chunks=tuple(chunks))


def scrape(url: str) -> dict[str, float]:
  """The server's /metrics samples {name: value} (unlabelled ones; jaxspec_requests_total by status as
  'jaxspec_requests_total{status}')."""
  import httpx  # pylint: disable=import-outside-toplevel
  return parse_metrics(httpx.get(f"{url}/metrics", timeout=30).text)


def parse_metrics(text: str) -> dict[str, float]:
  """Prometheus text as `scrape` returns it."""
  from prometheus_client.parser import text_string_to_metric_families  # pylint: disable=import-outside-toplevel
  out = {}
  for family in text_string_to_metric_families(text):
    for s in family.samples:
      out[s.name + ("{" + ",".join(s.labels.values()) + "}" if s.labels else "")] = s.value
  return out


def served_model(url: str) -> str:
  """The first model id of GET /v1/models; InputError when nothing answers there as a server of this API."""
  import httpx  # pylint: disable=import-outside-toplevel
  try:
    r = httpx.get(f"{url}/v1/models", timeout=30)
    r.raise_for_status()
    return r.json()["data"][0]["id"]
  except (httpx.HTTPError, ValueError, KeyError, IndexError) as e:
    root = url.rstrip("/")
    hint = f" The URL is the server's root: drop the trailing /v1 ({root[:-3]})." if root.endswith("/v1") else ""
    raise InputError(f"no OpenAI-compatible server answers GET {url}/v1/models ({type(e).__name__}: {e}); start "
                     f"one with launch/serve.py.{hint}") from None


async def _level(url: str, model: str, items: Sequence[Item], *, concurrency: int | None, rate: float | None,
                 requests: int, max_tokens: int, temperature: float, seed: int, timeout: float,
                 rng: np.random.Generator) -> tuple[list[Result], float]:
  import httpx  # pylint: disable=import-outside-toplevel
  limits = httpx.Limits(max_connections=None, max_keepalive_connections=None)
  async with httpx.AsyncClient(timeout=httpx.Timeout(timeout), limits=limits) as client:
    def send(i: int):
      return _one(client, url, model, items[i % len(items)], max_tokens=max_tokens, temperature=temperature,
                  seed=seed + i, timeout=timeout)
    start = time.perf_counter()
    if concurrency is not None:
      counter = iter(range(requests))
      results: list[Result] = []

      async def worker():
        for i in counter:  # a shared iterator: every request sent once, the loop bounded by `requests`
          results.append(await send(i))
      await asyncio.gather(*(worker() for _ in range(min(concurrency, requests))))
    else:
      tasks = []
      for i in range(requests):
        tasks.append(asyncio.create_task(send(i)))
        if i + 1 < requests:
          await asyncio.sleep(float(rng.exponential(1.0 / rate)))
      results = list(await asyncio.gather(*tasks))
    return results, time.perf_counter() - start


def _pct(values: list[float]) -> dict[str, float | None]:
  return {f"p{p}": (float(np.percentile(values, p)) if values else None) for p in PERCENTILES}


def _mean(values: list[float]) -> float | None:
  return float(np.mean(values)) if values else None


def summarize(results: list[Result], wall: float) -> dict:
  """The level's figures: requests, failed, output tokens/s, and TTFT / ITL (TPOT) / chunk ITL / e2e percentiles in
  seconds (TTFT and TPOT with their means)."""
  ok = [r for r in results if r.ok]
  ttfts, tpots = [r.ttft for r in ok if r.ttft is not None], [r.itl for r in ok if r.itl is not None]
  return {"requests": len(results), "failed": len(results) - len(ok),
          "errors": sorted({r.error for r in results if r.error})[:3],
          "output_tokens": int(sum(r.tokens for r in ok)), "wall_s": wall,
          "output_tokens_per_s": sum(r.tokens for r in ok) / wall if wall > 0 else 0.0,
          "ttft": {"mean": _mean(ttfts), **_pct(ttfts)},
          "itl": _pct(tpots), "tpot": {"mean": _mean(tpots), **_pct(tpots)},
          "chunk_itl": _pct([g for r in ok for g in r.gaps]),
          "e2e": _pct([r.e2e for r in ok])}


def _measure(url: str, model: str, items: Sequence[Item], kind: str, value: float, *, requests: int,
             max_tokens: int, temperature: float, seed: int, timeout: float, rng: np.random.Generator) -> dict:
  """One level against one server: its requests' results, wall time and the draft counters' differences."""
  n = requests or (max(8, 2 * value) if kind == "concurrency" else max(8, int(np.ceil(4 * value))))
  before = scrape(url)
  results, wall = asyncio.run(_level(
      url, model, items, concurrency=value if kind == "concurrency" else None,
      rate=value if kind == "rate" else None, requests=n, max_tokens=max_tokens, temperature=temperature,
      seed=seed, timeout=timeout, rng=rng))
  after = scrape(url)
  counted = {k: after.get(f"jaxspec_{k}_total", 0) - before.get(f"jaxspec_{k}_total", 0)
             for k in ("draft_tokens", "accepted_tokens", "verifications")}
  return {"results": results, "wall": wall, "drafted": counted["draft_tokens"], "accepted": counted["accepted_tokens"],
          "verifications": counted["verifications"]}


def run_levels(url: str, items: Sequence[Item], *, label: str = "", **kwargs) -> list[dict]:
  """One row per level (each concurrency, then each Poisson rate) against the server at `url` (`compare`'s
  arguments)."""
  return compare({label or url.rstrip("/"): url}, items, **kwargs)


def compare(servers: dict[str, str], items: Sequence[Item], *, concurrencies: Sequence[int] = (1, 4, 16, 64),
            rates: Sequence[float] = (), requests: int = 0, max_tokens: int = 64, temperature: float = 0.0,
            seed: int = 0, timeout: float = 600.0, warmup: int = 1, rounds: int = 1,
            before_round: Callable[[int], None] | None = None) -> list[dict]:
  """Each level on each server ({label: url}; e.g. speculative and plain with the same settings), the servers
  side by side in time: level by level, `rounds` times, the servers' order reversed every other round (A B, B A,
  ...), so that a machine's drift over the run falls on both alike. A row per server and level (the servers in
  order, then the levels), its figures over every round's requests pooled (tokens / s: all tokens over all rounds'
  wall time); `markdown` puts them side by side with the speedup against the last server.

  requests: per level and round (0: max(8, 2 * concurrency), or 4 * rate rounded up, at least 8). warmup:
  requests sent to each server first and not counted (a fresh server's first request pays for anything left to
  compile). A Poisson level's gaps are the same for every server (drawn from seed, round and level).

  before_round: called with the round's index (from 0) before each round, which then runs every level (rounds
  outermost, each round's servers warmed up again): e.g. one that starts the servers afresh, so that what one
  process keeps through a run (two processes of one plain server kept 13 % between them at concurrency 16 in
  every round on this project's 2-core CPU, docs/serving.md) falls on each server by chance, round by round."""
  if not isinstance(rounds, int) or rounds < 1:
    raise InputError(f"rounds must be an integer >= 1, got {rounds!r}.")
  urls = {label: url.rstrip("/") for label, url in servers.items()}
  models: dict[str, str] = {}

  def warm():
    for label, url in urls.items():
      models[label] = served_model(url)
      if warmup:
        asyncio.run(_level(url, models[label], items, concurrency=1, rate=None, requests=warmup,
                           max_tokens=max_tokens, temperature=temperature, seed=seed, timeout=timeout,
                           rng=np.random.default_rng(seed)))

  levels = [("concurrency", c) for c in concurrencies] + [("rate", r) for r in rates]
  order = ([(r, index) for r in range(rounds) for index in range(len(levels))] if before_round is not None
           else [(r, index) for index in range(len(levels)) for r in range(rounds)])
  parts: dict[tuple[str, int], list[dict]] = {}
  if before_round is None:
    warm()
  for r, index in order:
    if before_round is not None and index == 0:
      before_round(r)
      warm()
    kind, value = levels[index]
    for label in (list(urls) if r % 2 == 0 else list(urls)[::-1]):
      parts.setdefault((label, index), []).append(_measure(
          urls[label], models[label], items, kind, value, requests=requests, max_tokens=max_tokens,
          temperature=temperature, seed=seed, timeout=timeout, rng=np.random.default_rng((seed, r, index))))
  rows = []
  for label in urls:
    for index, (kind, value) in enumerate(levels):
      got = parts[(label, index)]
      drafted, accepted = sum(p["drafted"] for p in got), sum(p["accepted"] for p in got)
      verifications = sum(p["verifications"] for p in got)
      rows.append({"server": label, "url": urls[label], "model": models[label], "mode": kind, "level": value,
                   "temperature": temperature, "rounds": rounds,
                   **summarize([x for p in got for x in p["results"]], sum(p["wall"] for p in got)),
                   "round_tokens_per_s": [sum(x.tokens for x in p["results"] if x.ok) / p["wall"] for p in got],
                   "drafted": drafted, "accepted": accepted, "acceptance": accepted / drafted if drafted else None,
                   "verifications": verifications,
                   "tau": (accepted + verifications) / verifications if verifications else None})
  baseline = {(r["mode"], r["level"]): r for r in rows if r["server"] == list(urls)[-1]}
  for r in rows:
    b = baseline.get((r["mode"], r["level"]))
    r["ratio"] = r["output_tokens_per_s"] / b["output_tokens_per_s"] if b and b["output_tokens_per_s"] else None
    # Each round's ratio: the two ran next to each other in time, so a machine's drift over the run (on a shared
    # 2-core VM, 30 % between minutes) falls on both alike.
    r["round_ratios"] = [x / y if y else None for x, y in zip(r["round_tokens_per_s"], b["round_tokens_per_s"])]
  return rows


def shell_before_round(command: str, name: str = "before_round") -> Callable[[int], None]:
  """`compare`'s before_round from a shell command, run with ROUND=0, 1, ... in its environment; InputError
  (naming it as `name`) when it exits with a non-zero status."""
  def run(index: int) -> None:
    done = subprocess.run(command, shell=True, env={**os.environ, "ROUND": str(index)}, check=False)
    if done.returncode:
      raise InputError(f"{name} exited with status {done.returncode} before round {index}: {command}")
  return run


def write(rows: list[dict], prefix: str) -> list[str]:
  """PREFIX.md (`markdown`), PREFIX.json (the rows) and PREFIX.png (`plot`); returns the paths."""
  with open(prefix + ".md", "w", encoding="utf-8") as f:
    f.write(markdown(rows) + "\n")
  with open(prefix + ".json", "w", encoding="utf-8") as f:
    json.dump(rows, f, indent=1)
  plot(rows, prefix + ".png")
  return [prefix + ".md", prefix + ".json", prefix + ".png"]


def _ms(d: dict, p: str) -> str:
  return "-" if d.get(p) is None else f"{1000 * d[p]:.0f}"


def markdown(rows: list[dict]) -> str:
  """The table: a row per server and level; with several servers, 'speedup' is output tokens/s against the last
  server's at the same level (over all rounds) and, with several rounds, 'by round' each round's. tau: tokens per
  verify call; TPOT: per request (e2e - TTFT) / (tokens - 1), its mean and P50 / P90 / P99 (the ITL column of
  earlier tables); chunk ITL: the gaps between streamed chunks."""
  servers = list(dict.fromkeys(r["server"] for r in rows))
  base = {(r["mode"], r["level"]): r for r in rows if r["server"] == servers[-1]}
  rounds = len(servers) > 1 and max(r["rounds"] for r in rows) > 1
  head = ("| server | load | requests (failed) | output tok/s | " + ("speedup | " if len(servers) > 1 else "") +
          ("by round | " if rounds else "") +
          "tau | TTFT ms mean / P50 / P99 | TPOT ms mean / P50 / P90 / P99 | chunk ITL ms P50 / P99 | "
          "e2e ms P50 / P90 / P99 | acceptance |")
  lines = [head, "|" + "---|" * (head.count("|") - 1)]
  order = sorted(rows, key=lambda r: (r["mode"] != "concurrency", r["level"], servers.index(r["server"])))
  for r in order:
    load = f"c={r['level']}" if r["mode"] == "concurrency" else f"{r['level']:g} req/s"
    b = base.get((r["mode"], r["level"]))
    speed = (f"{r['output_tokens_per_s'] / b['output_tokens_per_s']:.2f}x | " if b and b["output_tokens_per_s"]
             else "- | ") if len(servers) > 1 else ""
    if rounds:
      speed += " / ".join("-" if x is None else f"{x:.2f}" for x in r.get("round_ratios", [])) + " | "
    ttft = " / ".join(_ms(r["ttft"], k) for k in ("mean", "p50", "p99"))
    tpot = " / ".join(_ms(r.get("tpot", r["itl"]), k) for k in ("mean", "p50", "p90", "p99"))
    chunks = " / ".join(_ms(r.get("chunk_itl", {}), k) for k in ("p50", "p99"))
    e2e = " / ".join(_ms(r["e2e"], f"p{p}") for p in PERCENTILES)
    acc = "-" if r["acceptance"] is None else f"{r['acceptance']:.2f}"
    tau = "-" if r.get("tau") is None else f"{r['tau']:.2f}"
    lines.append(f"| {r['server']} | {load} | {r['requests']} ({r['failed']}) | {r['output_tokens_per_s']:.1f} | "
                 f"{speed}{tau} | {ttft} | {tpot} | {chunks} | {e2e} | {acc} |")
  return "\n".join(lines)


def plot(rows: list[dict], path: str) -> None:
  """Output tokens/s, its ratio to the last server's (the baseline) and P50 time per output token against
  concurrency, a line per server (PNG)."""
  import matplotlib  # pylint: disable=import-outside-toplevel
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt  # pylint: disable=import-outside-toplevel
  fig, (a, c, b) = plt.subplots(1, 3, figsize=(15, 4))
  for server in dict.fromkeys(r["server"] for r in rows):
    mine = sorted((r for r in rows if r["server"] == server and r["mode"] == "concurrency"),
                  key=lambda r: r["level"])
    x = [r["level"] for r in mine]
    a.plot(x, [r["output_tokens_per_s"] for r in mine], marker="o", label=server)
    c.plot(x, [np.nan if r.get("ratio") is None else r["ratio"] for r in mine], marker="o", label=server)
    b.plot(x, [1000 * (r["itl"]["p50"] or np.nan) for r in mine], marker="o", label=server)
  c.axhline(1.0, color="grey", linewidth=0.8)
  levels = [r["level"] for r in rows if r["mode"] == "concurrency"] or [1]
  for ax, title in ((a, "output tokens/s"), (c, "output tokens/s over the last server's"),
                    (b, "time per output token P50 (ms)")):
    ax.set_xscale("log", base=2)
    ax.set_xlim(min(levels) / 1.25, max(levels) * 1.25)  # also when a panel has no finite point (every request failed)
    ax.set_xlabel("concurrent requests")
    ax.set_title(title)
    ax.legend()
  fig.tight_layout()
  fig.savefig(path, dpi=120)
  plt.close(fig)
