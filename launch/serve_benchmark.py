r"""Benchmarks running servers (launch/serve.py) over HTTP: TTFT, inter-token and end-to-end latency (P50 / P90 /
P99), output tokens per second and acceptance, at fixed concurrency levels and Poisson request rates.

    python launch/serve_benchmark.py --url=http://127.0.0.1:8000 --workload=docs/bench/serving_ende.jsonl
    # speculative against plain, side by side (two servers started with the same settings but --draft):
    python launch/serve_benchmark.py --url=http://127.0.0.1:8000 --baseline_url=http://127.0.0.1:8001 \
        --labels=speculative,plain --concurrency=1,4,16,64 --rate=2,8 --output=docs/bench/serving_ende

    # the peers' grid (issue 39): three arms in one run, their order alternating per round, each against plain:
    python launch/serve_benchmark.py --servers=budget=http://127.0.0.1:8100,fixed=http://127.0.0.1:8101,\
plain=http://127.0.0.1:8102 --concurrency=1,4,8,16,32,64 --rounds=2 --output=docs/bench/serving/grid_ende
    # (docs/bench/serving/grid.sh starts the three servers and runs it; final_restarts.sh starts them afresh
    # before every round: --before_round)

Writes OUTPUT.md (the table: output tokens/s, the speedup against the last server, tau, TTFT mean / P50 / P99,
TPOT, chunk ITL P50 / P99, e2e, acceptance), OUTPUT.json (every figure) and OUTPUT.png (tokens/s, its ratio to the
last server's and TPOT against concurrency);
without --output prints the table. `jaxspec.bench.serving` has the definitions. --output's directory and --labels
are checked before anything is sent.

A soak instead (`jaxspec.bench.soak`): greedy, sampled, streamed, cancelled and bad requests at a steady
--soak_rate for --soak_s seconds; the server's RSS and open file descriptors (its pid found from --url's port, or
--server_pid), active slots and P99 latency sampled every --soak_sample_s; exit status 1 with one line when any of
them grows (last third's median against the first third's) or a slot is still active after the run:

    python launch/serve_benchmark.py --url=http://127.0.0.1:8000 --soak_s=600 --output=docs/bench/serving/soak_ende
"""

import logging
import os

from absl import flags

from jaxspec.bench import serving, soak
from jaxspec.cli import flags as cli_flags, resume
from jaxspec.errors import OutputError, SettingsError

_URL = flags.DEFINE_string("url", "http://127.0.0.1:8000", "The server to measure.")
_BASELINE = flags.DEFINE_string("baseline_url", "", "A second server measured the same way (e.g. --draft=none); "
                                "the table then gives the speedup of --url against it.")
_SERVERS = flags.DEFINE_list("servers", [], "LABEL=URL,... : any number of servers measured side by side (in place "
                              "of --url / --baseline_url / --labels); the last is the baseline of the speedups "
                              "(list plain last).")
_LABELS = flags.DEFINE_list("labels", ["speculative", "plain"], "Names of --url and --baseline_url in the table.")
_WORKLOAD = flags.DEFINE_string("workload", "docs/bench/serving_ende.jsonl", "JSONL: {\"prompt\": ...} or "
                                "{\"messages\": [...]} a line, optionally \"max_tokens\"; requests cycle through it.")
cli_flags.define_number_list("concurrency", [1, 4, 16, 64], "Closed-loop levels: concurrent requests.", lower_bound=1)
cli_flags.define_number_list("rate", [], "Open-loop levels: Poisson arrivals, requests per second.", kind=float,
                             lower_bound=0.001)
_REQUESTS = flags.DEFINE_integer("requests", 0, "Requests per level (0: max(8, 2 x concurrency) or 4 s of the "
                                 "rate, at least 8).", lower_bound=0)
_MAX_TOKENS = flags.DEFINE_integer("max_tokens", 64, "max_tokens of a workload line that gives none.", lower_bound=1)
_TEMPERATURE = flags.DEFINE_float("temperature", 0.0, "Sampling temperature of every request (0: greedy).",
                                  lower_bound=0.0, upper_bound=2.0)
_SEED = flags.DEFINE_integer("seed", 0, "Request i is sent with seed + i; also seeds the Poisson gaps.",
                             lower_bound=0)
_TIMEOUT = flags.DEFINE_float("timeout", 600.0, "Seconds a request may take before it counts as failed.",
                              lower_bound=1.0)
_ROUNDS = flags.DEFINE_integer("rounds", 1, "Times each level runs on each server, the servers' order reversed "
                                "every other round (A B, B A, ...); figures over all rounds' requests.", lower_bound=1)
_BEFORE_ROUND = flags.DEFINE_string(
    "before_round", "", "A shell command run before each round (ROUND=0, 1, ... in its environment), which returns "
    "once the servers answer: e.g. one that starts them afresh (docs/bench/serving/restarts.sh), so that what one "
    "process keeps through a run falls on each server by chance. With it the rounds are outermost (each runs every "
    "level); a non-zero exit stops the run.")
_OUTPUT = flags.DEFINE_string("output", "", "Path prefix for .md, .json and .png ('' prints the table), in an "
                              "existing directory.")
_SOAK = flags.DEFINE_float("soak_s", 0.0, "Seconds of a soak (0: the levels above instead).", lower_bound=0.0)
_SOAK_RATE = flags.DEFINE_float("soak_rate", 2.0, "Requests a second during the soak (steady).", lower_bound=0.001)
_SOAK_SAMPLE = flags.DEFINE_float("soak_sample_s", 5.0, "Seconds between the soak's samples.", lower_bound=0.05)
_PID = flags.DEFINE_integer("server_pid", 0, "The server's process for the soak's RSS and file descriptors (0: "
                            "the process listening on --url's port here, if any).", lower_bound=0)


def _servers() -> dict[str, str]:
  """{label: url}; SettingsError for a label given twice or a --servers entry that is not LABEL=URL."""
  if _SERVERS.value:
    servers = {}
    for entry in _SERVERS.value:
      label, _, url = entry.partition("=")
      if not label or not url:
        raise SettingsError(f"--servers takes LABEL=URL entries, got {entry!r}.")
      if label in servers:
        raise SettingsError(f"--servers: {label!r} names two servers; give each its own label.")
      servers[label] = url
    if _BASELINE.value:
      raise SettingsError("--servers names every server: leave out --baseline_url.")
    return servers
  labels = _LABELS.value
  servers = {labels[0] if labels else "server": _URL.value}
  if _BASELINE.value:
    second = labels[1] if len(labels) > 1 else "baseline"
    if second in servers:
      raise SettingsError(f"--labels={','.join(labels)}: {second!r} names both servers; give each its own label.")
    servers[second] = _BASELINE.value
  return servers


def _check_output(prefix: str, suffixes: tuple[str, ...]) -> None:
  """Before anything is sent: PREFIX's directory exists and each PREFIX + suffix can be written."""
  directory = os.path.dirname(os.path.abspath(prefix))
  if not os.path.isdir(directory):
    raise OutputError(f"--output={prefix}: the directory {directory} does not exist; create it first.")
  for suffix in suffixes:
    resume.check_output_file(prefix + suffix, "--output")


def _soak(items) -> None:
  if _BASELINE.value:
    raise SettingsError("--soak_s drives one server (--url): leave out --baseline_url.")
  if _OUTPUT.value:
    _check_output(_OUTPUT.value, (".json", ".png"))
  report = soak.soak(_URL.value, items, seconds=_SOAK.value, rate=_SOAK_RATE.value, pid=_PID.value or None,
                     sample_s=_SOAK_SAMPLE.value, max_tokens=_MAX_TOKENS.value, timeout=_TIMEOUT.value)
  if _OUTPUT.value:
    print("wrote " + ", ".join(soak.write(report, _OUTPUT.value)))
  line = soak.summary(report)
  if not report["verdict"]["ok"]:
    raise SystemExit(line)
  print(line)


def main(argv):
  del argv
  logging.getLogger("httpx").setLevel(logging.WARNING)  # not one INFO line per request
  items = serving.read_workload(_WORKLOAD.value)
  if _SOAK.value:
    _soak(items)
    return
  servers = _servers()
  if _OUTPUT.value:
    _check_output(_OUTPUT.value, (".md", ".json", ".png"))
  rows = serving.compare(servers, items, concurrencies=flags.FLAGS.concurrency, rates=flags.FLAGS.rate,
                         requests=_REQUESTS.value, max_tokens=_MAX_TOKENS.value, temperature=_TEMPERATURE.value,
                         seed=_SEED.value, timeout=_TIMEOUT.value,
                         rounds=_ROUNDS.value, before_round=(
                             serving.shell_before_round(_BEFORE_ROUND.value, "--before_round")
                             if _BEFORE_ROUND.value else None))
  print(serving.markdown(rows))
  if _OUTPUT.value:
    serving.write(rows, _OUTPUT.value)
    print(f"wrote {_OUTPUT.value}.md, .json and .png")
  if any(r["failed"] for r in rows):
    first = next(r for r in rows if r["failed"])
    raise SystemExit(f"{sum(r['failed'] for r in rows)} requests failed; the first at {first['server']} "
                     f"{first['mode']} {first['level']}: {(first['errors'] or ['?'])[0]}")


if __name__ == "__main__":
  cli_flags.run(main)
