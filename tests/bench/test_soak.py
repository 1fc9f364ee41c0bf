"""The soak's judge (`jaxspec.bench.soak`, issue 40 item 17) on synthetic series: a growing series fails it (the
negative control), a flat noisy one passes, a leaked slot or an unexpected answer fails the run; the server's
process found from its port and sampled (psutil and /proc). And launch/serve_benchmark.py's checks before anything
is sent (items 10 and 13): --output into a missing directory, a label given twice, a URL ending in /v1."""

import os
import socket
import sys

import numpy as np
import pytest

from jaxspec.bench import soak
from script_helpers import assert_one_line_error, run_scripts

FLAT = {"active_slots": 0, "queue_length": 0}
OK_COUNTS = {k: {"ok": 3, "unexpected": 0} for k in soak.KINDS}


def _samples(rss, fds=None, p99=None):
  n = len(rss)
  fds = [40] * n if fds is None else fds
  p99 = [0.5] * n if p99 is None else p99
  return [{"t": float(i), "rss_mb": r, "open_fds": f, "p99_s": p} for i, (r, f, p) in enumerate(zip(rss, fds, p99))]


def test_growth_detector_fails_a_growing_series_and_passes_a_flat_one():
  rng = np.random.default_rng(0)
  flat = list(1200 + rng.normal(0, 20, 60))  # RSS in MB, noisy but bounded
  leak = [1200 + 5.0 * i + x for i, x in enumerate(rng.normal(0, 20, 60))]  # +5 MB a sample: 300 MB over the run
  assert soak.growth(flat, 0.05, 48)["grows"] is False
  g = soak.growth(leak, 0.05, 48)
  assert g["grows"] is True and g["last"] > g["limit"] > g["first"]
  assert soak.growth(leak[:soak.MIN_SAMPLES - 1], 0.05, 48)["grows"] is None  # too short to judge
  assert soak.growth([None, *flat, None, float("nan")], 0.05, 48)["grows"] is False  # gaps dropped
  # One spike does not make growth (medians), a step that stays does.
  assert soak.growth(flat[:59] + [5000.0], 0.05, 48)["grows"] is False
  assert soak.growth(flat[:40] + [2000.0] * 20, 0.05, 48)["grows"] is True


def test_judge_names_what_grew_leaked_or_failed():
  rng = np.random.default_rng(1)
  flat = list(1000 + rng.normal(0, 5, 30))
  passed = soak.judge(_samples(flat), FLAT, OK_COUNTS)
  assert passed["ok"] and passed["reasons"] == [] and sorted(passed["growth"]) == ["open_fds", "p99_s", "rss_mb"]
  assert all(g["grows"] is False for g in passed["growth"].values())
  fds = [40 + i for i in range(30)]  # one descriptor more every sample
  verdict = soak.judge(_samples(flat, fds=fds), FLAT, OK_COUNTS)
  assert not verdict["ok"] and verdict["reasons"][0].startswith("open_fds grew")
  latency = [0.5] * 20 + [9.0] * 10
  assert soak.judge(_samples(flat, p99=latency), FLAT, OK_COUNTS)["reasons"][0].startswith("p99_s grew")
  leaked = soak.judge(_samples(flat), {"active_slots": 1, "queue_length": 0}, OK_COUNTS)
  assert not leaked["ok"] and "active_slots is 1 after the run" in leaked["reasons"][0]
  failed = soak.judge(_samples(flat), FLAT, {**OK_COUNTS, "bad": {"ok": 2, "unexpected": 1}})
  assert not failed["ok"] and failed["reasons"] == ["unexpected answers {'bad': 1}"]
  short = soak.judge(_samples(flat[:soak.MIN_SAMPLES - 1]), FLAT, OK_COUNTS)
  assert short["ok"] and len(short["notes"]) == 3 and "growth not judged" in short["notes"][0]
  unknown = soak.judge(_samples(flat), {"active_slots": None, "queue_length": None}, OK_COUNTS)
  assert not unknown["ok"] and "unknown" in unknown["reasons"][0]


@pytest.mark.parametrize("without_psutil", [False, True])
def test_the_listening_process_is_found_and_sampled(monkeypatch, without_psutil):
  if without_psutil:
    monkeypatch.setitem(sys.modules, "psutil", None)  # import psutil fails: /proc
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    s.listen()
    assert soak.listening_pid(s.getsockname()[1]) == os.getpid()
  rss_mb, fds = soak.process_stats(os.getpid())
  assert 10 < rss_mb < 1e6 and fds >= 3
  assert soak.process_stats(2**22 + 7) is None  # no such process


def test_benchmark_checks_before_sending():
  url = "--url=http://127.0.0.1:9"
  cases = [(["--output=/nonexistent-dir/out", url], "--output=/nonexistent-dir/out: the directory"),
           (["--labels=a,a", url, "--baseline_url=http://127.0.0.1:9"], "'a' names both servers"),
           (["--url=http://127.0.0.1:9/v1/"], "drop the trailing /v1 (http://127.0.0.1:9)"),
           (["--soak_s=5", url, "--baseline_url=http://127.0.0.1:9"], "--soak_s drives one server"),
           (["--soak_s=5", url, "--output=/nonexistent-dir/soak"], "--output=/nonexistent-dir/soak: the directory"),
           (["--servers=a=http://127.0.0.1:9,b"], "--servers takes LABEL=URL entries, got 'b'"),
           (["--servers=a=http://127.0.0.1:9,a=http://127.0.0.1:8"], "'a' names two servers")]
  for (_, needle), res in zip(cases, run_scripts([["launch/serve_benchmark.py", *a] for a, _ in cases], timeout=300)):
    assert_one_line_error(res, needle)
    if "/v1" not in needle:  # refused before any request: nothing is asked of the (absent) server
      assert "no OpenAI-compatible server" not in res.stderr
