"""A soak: a steady mix of requests against a running server (launch/serve.py) for a while, its resources sampled
over time, and a verdict on whether anything grows without bound or a slot leaks.

    report = soak("http://127.0.0.1:8000", read_workload("docs/bench/serving_ende.jsonl"), seconds=600, rate=2.0)
    report["verdict"]   # {"ok": True, "reasons": []}
    plot(report, "soak.png")

After one request of each kind (a warm-up, not counted), requests go out at a steady rate (one every 1 / rate
seconds, whatever the answers), cycling through KINDS: a greedy completion, a sampled one (seeded), a streamed
one, a streamed one the client closes after its first chunk (a cancel: the server must free the slot) and a bad
one (a malformed body or an out-of-range field, each answered 4xx with OpenAI's error body). Every `sample_s`
seconds: the server process's resident memory and open file descriptors (its pid given, or found from the URL's
port through /proc; psutil when installed, else /proc), the active slots and queue length from /metrics, and the
P99 end-to-end latency of the requests that finished in the last `window_s`.

The verdict (`judge`) fails the run when
- a series grows: the median of its last third exceeds the median of its first third by more than its tolerance
  (`TOLERANCES`: a relative part and an absolute floor; `growth` is the detector, unit-tested on a synthetic
  growing series); RSS, file descriptors and P99 latency are judged (a run too short for thirds of 3 samples each
  is not judged for growth, and says so);
- a slot leaks: after the load stops and in-flight requests end (bounded wait), /metrics still reports an active
  slot or a queued request;
- a request got an answer its kind should not get (a 5xx, a 429, a timeout, a good request refused, a bad one
  accepted): the server failed a client.
"""

from __future__ import annotations

import asyncio
import dataclasses
import glob
import json
import os
import time
from typing import Sequence
from urllib.parse import urlparse

import numpy as np

from jaxspec.bench.serving import Item, parse_metrics, served_model
from jaxspec.errors import InputError

KINDS = ("greedy", "sampled", "stream", "cancel", "bad")
# Bad bodies, cycled: each must be answered 4xx (never 5xx, never a hang).
BAD_BODIES = ('{"model": "x", "prompt": "a", "max_tokens": 0}', '{"prompt": ', '{"model": "x", "prompt": 3}',
              '{"model": "x", "prompt": "a", "temperature": -1}')
# series: (relative, absolute) growth allowed from the first third's median to the last third's.
TOLERANCES = {"rss_mb": (0.05, 48.0), "open_fds": (0.0, 16.0), "p99_s": (1.0, 1.0)}
MIN_SAMPLES = 9  # thirds of 3 samples at least, or growth is not judged


@dataclasses.dataclass
class _Outcome:
  kind: str
  ok: bool  # the answer this kind should get
  e2e: float
  end: float  # perf_counter when it finished
  detail: str = ""


# --- the server's process ----------------------------------------------------------------------------------------


def listening_pid(port: int) -> int | None:
  """The pid of a process of this user listening on TCP `port` (IPv4 or IPv6), from /proc; None when none is
  found (another user's process, another machine, no /proc)."""
  inodes = set()
  for table in ("/proc/net/tcp", "/proc/net/tcp6"):
    try:
      with open(table, encoding="ascii") as f:
        next(f, None)
        for line in f:
          fields = line.split()
          if len(fields) > 9 and fields[3] == "0A" and int(fields[1].rsplit(":", 1)[1], 16) == port:
            inodes.add(f"socket:[{fields[9]}]")
    except OSError:
      continue
  for fd_dir in glob.glob("/proc/[0-9]*/fd"):
    try:
      for fd in os.listdir(fd_dir):
        if os.readlink(os.path.join(fd_dir, fd)) in inodes:
          return int(fd_dir.split("/")[2])
    except OSError:
      continue
  return None


def process_stats(pid: int) -> tuple[float, int] | None:
  """(resident memory in MB, open file descriptors) of `pid` (psutil when installed, else /proc); None once the
  process is gone or cannot be read."""
  try:
    import psutil  # pylint: disable=import-outside-toplevel
  except ImportError:
    psutil = None
  if psutil is not None:
    try:
      proc = psutil.Process(pid)
      return proc.memory_info().rss / 2**20, proc.num_fds()
    except psutil.Error:
      return None
  try:
    with open(f"/proc/{pid}/status", encoding="ascii") as f:
      rss_kb = next(int(line.split()[1]) for line in f if line.startswith("VmRSS:"))
    return rss_kb / 1024, len(os.listdir(f"/proc/{pid}/fd"))
  except (OSError, StopIteration, ValueError):
    return None


# --- the verdict ---------------------------------------------------------------------------------------------------


def growth(values: Sequence[float | None], relative: float, absolute: float) -> dict:
  """Whether a series grows: the median of its last third against the median of its first third (None values
  dropped); grows when last > first * (1 + relative) + absolute. Fewer than MIN_SAMPLES values: not judged
  (grows None)."""
  xs = [float(v) for v in values if v is not None and np.isfinite(v)]
  if len(xs) < MIN_SAMPLES:
    return {"first": None, "last": None, "grows": None, "samples": len(xs)}
  third = len(xs) // 3
  first, last = float(np.median(xs[:third])), float(np.median(xs[-third:]))
  return {"first": first, "last": last, "grows": bool(last > first * (1 + relative) + absolute), "samples": len(xs),
          "limit": first * (1 + relative) + absolute}


def judge(samples: list[dict], after: dict, counts: dict, tolerances: dict | None = None) -> dict:
  """The verdict over the samples (dicts with the TOLERANCES series), the state after the run (`active_slots`,
  `queue_length`) and the outcome counts ({kind: {"ok": n, "unexpected": n}}): {"ok", "reasons", "growth"}."""
  tolerances = TOLERANCES if tolerances is None else tolerances
  reasons, checked = [], {}
  for name, (relative, absolute) in tolerances.items():
    g = checked[name] = growth([s.get(name) for s in samples], relative, absolute)
    if g["grows"]:
      reasons.append(f"{name} grew from {g['first']:.4g} to {g['last']:.4g} (first third's median to the last's; "
                     f"allowed {g['limit']:.4g})")
  for name in ("active_slots", "queue_length"):
    if after.get(name) is None:
      reasons.append(f"{name} after the run unknown (/metrics did not answer)")
    elif after[name] != 0:
      reasons.append(f"{name} is {after[name]:g} after the run and its requests ended: a slot leaked")
  unexpected = {k: c["unexpected"] for k, c in counts.items() if c.get("unexpected")}
  if unexpected:
    reasons.append(f"unexpected answers {unexpected}")
  notes = [f"{name}: {g['samples']} samples, fewer than {MIN_SAMPLES}: growth not judged"
           for name, g in checked.items() if g["grows"] is None]
  return {"ok": not reasons, "reasons": reasons, "growth": checked, "notes": notes}


# --- the load ------------------------------------------------------------------------------------------------------


def _body(kind: str, item: Item, model: str, i: int, max_tokens: int) -> tuple[str, dict | str]:
  """(path, body) of request i of `kind` (a str body: sent as it is, malformed on purpose)."""
  if kind == "bad":
    return "completions", BAD_BODIES[(i // len(KINDS)) % len(BAD_BODIES)]
  chat = item.messages is not None
  body = {"model": model, "max_tokens": item.max_tokens or max_tokens, "temperature": 1.0 if kind == "sampled" else 0.0,
          "seed": i, "stream": kind in ("stream", "cancel")}
  body.update({"messages": list(item.messages)} if chat else {"prompt": item.prompt})
  return "chat/completions" if chat else "completions", body


async def _send(client, url: str, kind: str, path: str, body, timeout: float) -> _Outcome:
  start = time.perf_counter()

  def done(ok: bool, detail: str = "") -> _Outcome:
    end = time.perf_counter()
    return _Outcome(kind, ok, end - start, end, detail)
  try:
    async with asyncio.timeout(timeout):
      if isinstance(body, str):
        r = await client.post(f"{url}/v1/{path}", content=body, headers={"content-type": "application/json"})
        good = 400 <= r.status_code < 500 and r.status_code != 429 and "error" in r.json()
        return done(good, "" if good else f"HTTP {r.status_code} for a bad body")
      if not body["stream"]:
        r = await client.post(f"{url}/v1/{path}", json=body)
        return done(r.status_code == 200, "" if r.status_code == 200 else f"HTTP {r.status_code}: {r.text[:120]}")
      async with client.stream("POST", f"{url}/v1/{path}", json=body) as r:
        if r.status_code != 200:
          return done(False, f"HTTP {r.status_code}: {(await r.aread())[:120]!r}")
        async for line in r.aiter_lines():
          if kind == "cancel" and line.startswith("data: "):
            return done(True)  # leaving the block closes the connection: the server must free the slot
          if line == "data: [DONE]":
            return done(True)
          if line.startswith("data: ") and '"error"' in line:
            return done(False, line[:160])
        return done(False, "the stream ended without [DONE]")
  except TimeoutError:
    return done(False, f"timed out after {timeout:g} s")
  except Exception as e:  # pylint: disable=broad-except  (a connection error: one unexpected answer, reported)
    return done(False, f"{type(e).__name__}: {e}")


async def _metrics(client, url: str) -> dict:
  try:
    r = await client.get(f"{url}/metrics", timeout=10)
    return parse_metrics(r.text)
  except Exception:  # pylint: disable=broad-except  (a missed sample is a gap in the series, not the run's end)
    return {}


async def _run(url: str, model: str, items: Sequence[Item], *, seconds: float, rate: float, pid: int | None,
               sample_s: float, window_s: float, max_tokens: int, timeout: float, drain_s: float,
               verbose: bool) -> dict:
  import httpx  # pylint: disable=import-outside-toplevel
  limits = httpx.Limits(max_connections=None, max_keepalive_connections=None)
  outcomes: list[_Outcome] = []
  samples: list[dict] = []
  async with httpx.AsyncClient(timeout=httpx.Timeout(timeout), limits=limits) as client:
    for i, kind in enumerate(KINDS):  # warm-up, not counted: a fresh server's first answers allocate, once
      await _send(client, url, kind, *_body(kind, items[i % len(items)], model, i, max_tokens), timeout)
    t0 = time.perf_counter()

    async def sample() -> dict:
      now = time.perf_counter()
      m = await _metrics(client, url)
      recent = [o.e2e for o in outcomes if o.kind != "bad" and o.ok and o.end >= now - window_s]
      stats = process_stats(pid) if pid else None
      s = {"t": now - t0, "rss_mb": stats[0] if stats else None, "open_fds": stats[1] if stats else None,
           "active_slots": m.get("jaxspec_active_slots"), "queue_length": m.get("jaxspec_queue_length"),
           "p99_s": float(np.percentile(recent, 99)) if recent else None, "finished": len(outcomes),
           "unexpected": sum(not o.ok for o in outcomes)}
      samples.append(s)
      if verbose:
        print(f"soak {s['t']:6.0f} s: rss {s['rss_mb'] or 0:.0f} MB, fds {s['open_fds']}, slots "
              f"{s['active_slots']}, queue {s['queue_length']}, p99 {s['p99_s'] or 0:.2f} s, {s['finished']} done, "
              f"{s['unexpected']} unexpected", flush=True)
      return s

    async def sampler(stop: asyncio.Event):
      n = 0
      while not stop.is_set():
        await sample()
        n += 1
        try:  # the next sample at t0 + n * sample_s: no drift
          await asyncio.wait_for(stop.wait(), max(0.0, t0 + n * sample_s - time.perf_counter()))
        except TimeoutError:
          pass

    stop = asyncio.Event()
    sampling = asyncio.create_task(sampler(stop))
    tasks, i = [], 0
    while (send_at := t0 + i / rate) < t0 + seconds:  # bounded: seconds * rate requests
      await asyncio.sleep(max(0.0, send_at - time.perf_counter()))
      kind = KINDS[i % len(KINDS)]
      path, body = _body(kind, items[i % len(items)], model, i, max_tokens)
      task = asyncio.create_task(_send(client, url, kind, path, body, timeout))
      task.add_done_callback(lambda t: outcomes.append(t.result()))
      tasks.append(task)
      i += 1
    await asyncio.gather(*tasks)  # each bounded by `timeout`
    stop.set()
    await sampling
    deadline, after = time.perf_counter() + drain_s, {}
    while True:  # the engine frees a slot at its next step: bounded wait for the counts to settle
      m = await _metrics(client, url)
      after = {"active_slots": m.get("jaxspec_active_slots"), "queue_length": m.get("jaxspec_queue_length")}
      if (after["active_slots"] == 0 and after["queue_length"] == 0) or time.perf_counter() > deadline:
        break
      await asyncio.sleep(0.2)
    after["rss_mb"], after["open_fds"] = (process_stats(pid) or (None, None)) if pid else (None, None)
    wall = time.perf_counter() - t0
  return {"outcomes": outcomes, "samples": samples, "after": after, "sent": i, "wall_s": wall}


def soak(url: str, items: Sequence[Item], *, seconds: float, rate: float = 2.0, pid: int | None = None,
         sample_s: float = 5.0, window_s: float | None = None, max_tokens: int = 16, timeout: float = 120.0,
         drain_s: float = 30.0, tolerances: dict | None = None, verbose: bool = True) -> dict:
  """Drives the server at `url` for `seconds` at `rate` requests a second (KINDS in turn), samples it every
  `sample_s` seconds, and returns the report: settings, samples, per-kind counts, the state after the run,
  the verdict (`judge`) and the first unexpected answers. `pid`: the server's process (None: found from the URL's
  port, when the server runs here as this user; else RSS and file descriptors are not sampled). window_s: the
  P99's window (default 3 * sample_s)."""
  for name, value in (("seconds", seconds), ("rate", rate), ("sample_s", sample_s)):
    if not isinstance(value, (int, float)) or not np.isfinite(value) or value <= 0:
      raise InputError(f"soak: {name} must be a number > 0, got {value!r}.")
  url = url.rstrip("/")
  model = served_model(url)
  if pid is None:
    port = urlparse(url).port or (443 if url.startswith("https") else 80)
    pid = listening_pid(port) if urlparse(url).hostname in ("127.0.0.1", "localhost", "::1") else None
  if pid is not None and process_stats(pid) is None:
    raise InputError(f"soak: no process {pid} to sample.")
  run = asyncio.run(_run(url, model, items, seconds=seconds, rate=rate, pid=pid, sample_s=sample_s,
                         window_s=window_s or 3 * sample_s, max_tokens=max_tokens, timeout=timeout,
                         drain_s=drain_s, verbose=verbose))
  counts = {k: {"ok": 0, "unexpected": 0} for k in KINDS}
  for o in run["outcomes"]:
    counts[o.kind]["ok" if o.ok else "unexpected"] += 1
  good = [o.e2e for o in run["outcomes"] if o.ok and o.kind in ("greedy", "sampled", "stream")]
  verdict = judge(run["samples"], run["after"], counts, tolerances)
  if pid is None:
    verdict["notes"].insert(0, "no server pid here: RSS and open file descriptors not sampled")
  return {"url": url, "model": model, "pid": pid, "seconds": seconds, "rate": rate, "sample_s": sample_s,
          "max_tokens": max_tokens, "sent": run["sent"], "wall_s": run["wall_s"], "counts": counts,
          "e2e_s": {f"p{p}": float(np.percentile(good, p)) if good else None for p in (50, 90, 99)},
          "samples": run["samples"], "after": run["after"], "verdict": verdict,
          "unexpected": [dataclasses.asdict(o) for o in run["outcomes"] if not o.ok][:10],
          "date": time.strftime("%Y-%m-%d %H:%M"), "load_average": os.getloadavg()[0]}


def summary(report: dict) -> str:
  """One line: passed or failed, and why."""
  v, c = report["verdict"], report["counts"]
  kinds = ", ".join(f"{k} {n['ok']}" for k, n in c.items())
  head = (f"soak {report['seconds']:g} s at {report['rate']:g} req/s: {report['sent']} requests, answered as "
          f"expected: {kinds}")
  return f"{head}: passed" if v["ok"] else f"{head}: FAILED: {'; '.join(v['reasons'])}"


def write(report: dict, prefix: str) -> list[str]:
  """PREFIX.json (the report) and PREFIX.png (`plot`); returns the paths."""
  with open(prefix + ".json", "w", encoding="utf-8") as f:
    json.dump(report, f, indent=1)
  plot(report, prefix + ".png")
  return [prefix + ".json", prefix + ".png"]


def plot(report: dict, path: str) -> None:
  """RSS, open file descriptors, active slots (and queue) and P99 latency against time (PNG), each growth limit
  dashed."""
  import matplotlib  # pylint: disable=import-outside-toplevel
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt  # pylint: disable=import-outside-toplevel
  samples, growth_of = report["samples"], report["verdict"]["growth"]
  t = [s["t"] for s in samples]
  fig, axes = plt.subplots(2, 2, figsize=(11, 6.5), sharex=True)
  panels = (("rss_mb", "server RSS (MB)"), ("open_fds", "server open file descriptors"),
            ("active_slots", "active slots / queue (from /metrics)"), ("p99_s", "P99 end-to-end latency (s)"))
  for ax, (key, title) in zip(axes.flat, panels):
    ys = [np.nan if s.get(key) is None else s[key] for s in samples]
    ax.plot(t, ys, marker=".", label=key)
    if key == "active_slots":
      ax.plot(t, [np.nan if s.get("queue_length") is None else s["queue_length"] for s in samples], marker=".",
              label="queue_length")
      ax.legend()
    if growth_of.get(key, {}).get("limit") is not None:
      ax.axhline(growth_of[key]["limit"], linestyle="--", color="grey", label="growth limit")
    ax.set_title(title)
  for ax in axes[1]:
    ax.set_xlabel("seconds")
  fig.suptitle(summary(report)[:150], fontsize=9)
  fig.tight_layout()
  fig.savefig(path, dpi=110)
  plt.close(fig)
