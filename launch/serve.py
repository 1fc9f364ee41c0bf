r"""An OpenAI-compatible server: continuous batching over a slot engine, speculative decoding inside its step.

    python launch/serve.py                                    # the embedded EN-DE pair on 127.0.0.1:8000
    python launch/serve.py --target=DIR --draft=DIR --gamma=4 --slots=16 --port=8000
    python launch/serve.py --target=DIR --draft=none          # plain decoding (the baseline)
    python launch/serve.py --target=DIR --draft=HEAD_DIR --tree=4,16   # an EAGLE-3 head drafting token trees
    python launch/serve.py --target=DIR --draft=ngram         # prompt lookup, no draft model

Then any OpenAI client: `openai.OpenAI(base_url="http://127.0.0.1:8000/v1", api_key="none")`. GET /health answers
503 while the engine compiles (every prompt bucket and step program, before the first request) and 200 after;
GET /metrics is Prometheus text. --draft as in generate.py ('' or 'none': plain decoding). With a draft, each step
chooses every request's draft length by default (--speculation=budget, the verification budget: up to --gamma, from
per-request acceptance estimates and step costs timed during the warm-up, which are printed when it ends and
exported as jaxspec_step_cost_seconds); --speculation=fixed drafts --gamma (or the --tree) at every step;
--speculation_table a JSON file of `jaxspec.serving.SpeculationTable` (the draft length per number of active slots,
measured by the tuner) overrides both (--gamma / --tree are then ignored, said on stderr). --api_key (or the
JAXSPEC_API_KEY environment variable) makes every /v1 route want `Authorization: Bearer KEY`; binding beyond
loopback without one is warned about. The start-up line names the real port (--port=0 picks a free one). A failed
warm-up ends the server (status 1, the reason on one line); Ctrl-C ends it with status 130, at once during the
warm-up. Over several processes (--coordinator_address, --num_processes, --process_id, or the environment),
process 0 serves HTTP and decides each step; the others make the same engine calls on their devices
(jaxspec.serving.server.serve, jaxspec/serving/hosts.py). docs/serving.md has the API, its limits and the benchmark.
"""

import os
import sys

from absl import flags

from jaxspec.cli import flags as cli_flags, jobs
from jaxspec.serving.budget import PROBE, REPEATS

cli_flags.define_models(target="ende-target", draft="ende-draft")
cli_flags.define_decoding(gamma=4, max_new_tokens=128, max_input_length=128)
delattr(flags.FLAGS, "batch_size")  # the engine's batch is --slots
cli_flags.define_mesh()
_SLOTS = flags.DEFINE_integer("slots", 8, "Requests decoded together (the engine's static batch).", lower_bound=1)
_MAX_TOKENS = flags.DEFINE_integer("max_tokens", 0, "max_tokens of a request that gives none (0: "
                                   "--max_new_tokens, which is also the most a request may ask).", lower_bound=0)
_ITERATIONS = flags.DEFINE_integer("iterations_per_step", 4, "Loop iterations per engine step (a step returns "
                                   "tokens once; requests join and leave between steps).", lower_bound=1)
_QUEUE = flags.DEFINE_integer("queue", 64, "Requests that may wait for a slot; one more is answered 429.",
                              lower_bound=0)
_TABLE = flags.DEFINE_string("speculation_table", "", "A SpeculationTable JSON file: the draft length (or tree, "
                             "or plain) per number of active slots; '' uses --gamma / --tree at every load.")
_SPECULATION = flags.DEFINE_enum(
    "speculation", "budget", ["budget", "fixed"], "With a draft and no --speculation_table: 'budget' chooses each "
    "step's draft length (one of the compiled --budget_tiers, 0 = plain) and each request's limit within it from "
    "its acceptance so far and the step costs timed in warm-up (docs/serving.md); 'fixed' drafts --gamma (or "
    "--tree) at every step.")
_BUDGET_TIERS = flags.DEFINE_list("budget_tiers", [], "The draft lengths the budget compiles (0 and --gamma always "
                                  "among them; each one more step program per row bucket and mode); [] = 0,1,2,4 "
                                  "and --gamma, those <= --gamma. A --tree budget has two: plain and the tree.")
_BUDGET_THETA = flags.DEFINE_float("budget_theta", 0.2, "The budget drafts a request's j-th token only while its "
                                   "estimated probability of being accepted (the survival) is at least this.",
                                   lower_bound=0.0, upper_bound=1.0)
_BUDGET_MARGIN = flags.DEFINE_float("budget_margin", 0.0, "The share a drafting step's cost is raised by when the "
                                    "budget chooses (what one step's ratio omits: docs/serving.md).",
                                    lower_bound=0.0, upper_bound=9.0)
_BUDGET_REPEATS = flags.DEFINE_integer("budget_repeats", REPEATS, "The warm-up's step-cost curves time "
                                       "every step program in 2 x this many interleaved rounds: fewer start the "
                                       "server sooner, with noisier curves.", lower_bound=1)
_BUDGET_PROBE = flags.DEFINE_float("budget_probe", PROBE, "The share of the serving time the budget's probes may "
                                   "lose: now and then two steps of the side it does not run (drafting when it "
                                   "decodes plain, plain when it drafts), which measure that side's cost against "
                                   "the running side's; 0: no probes.", lower_bound=0.0, upper_bound=0.5)
_ROWS = flags.DEFINE_list("row_buckets", [], "Batch sizes a step may decode (the active slots gathered into the "
                          "smallest that holds them); [] = powers of two below --slots (from 2 on one CPU device), "
                          "and --slots. A seeded "
                          "request's tokens are the same alone and under load within one bucket and sampling mode "
                          "with --speculation=fixed: --row_buckets=SLOTS with one sampled --modes makes that any "
                          "load (docs/serving.md).")
_MODES = flags.DEFINE_multi_enum("modes", ["greedy", "sampled", "filtered"], ["greedy", "sampled", "filtered"],
                                 "Sampling modes compiled (a request no compiled mode decodes is answered 400).")
_NAME = flags.DEFINE_string("served_model_name", "", "The model id clients send ('' = --target, a local "
                            "directory's name).")
_HOST = flags.DEFINE_string("host", "127.0.0.1", "Address to listen on (0.0.0.0 exposes the server).")
_PORT = flags.DEFINE_integer("port", 8000, "Port to listen on (0: a free one, printed).", lower_bound=0,
                             upper_bound=65535)
_API_KEY = flags.DEFINE_string("api_key", "", "A key clients must send as 'Authorization: Bearer KEY' on the /v1 "
                               "routes ('' = the JAXSPEC_API_KEY environment variable, else none).")
_LOG = flags.DEFINE_enum("log_level", "info", ["critical", "error", "warning", "info", "debug"], "uvicorn's log level.")
flags.register_validator("tree", lambda v: v != cli_flags.AUTO, message="--tree takes 'K,N' or '' here")
flags.register_validator("gamma", lambda v: v != cli_flags.AUTO, message="--gamma takes an integer here")
flags.register_multi_flags_validator(
    ["max_tokens", "max_new_tokens"], lambda v: v["max_tokens"] <= v["max_new_tokens"],
    message="--max_tokens (the default of a request) must be at most --max_new_tokens (the most a request may ask)")


def _draft_spec(target) -> str:
  """--draft ('' for 'none'), or '' (plain decoding, said on stderr) when it is left at its default and cannot
  draft for target (as generate.py does)."""
  FLAGS = flags.FLAGS  # pylint: disable=invalid-name
  if FLAGS.draft.strip().lower() == "none":
    return ""
  return jobs.default_draft(target, FLAGS.draft, FLAGS["draft"].present, FLAGS.target, "serving")


def _row_buckets() -> list[int] | None:
  from jaxspec.errors import SettingsError  # pylint: disable=import-outside-toplevel
  try:
    return [int(v) for v in _ROWS.value] or None
  except ValueError:
    raise SettingsError(f"--row_buckets takes integers, got {','.join(_ROWS.value)}.") from None


def main(argv):
  try:
    sys.exit(_serve(argv))
  except KeyboardInterrupt:  # Ctrl-C while the models load (after that, server.run handles it)
    print("interrupted.", file=sys.stderr)
    sys.exit(130)


def _serve(argv) -> int:
  del argv
  from jaxspec.errors import InputError  # pylint: disable=import-outside-toplevel
  from jaxspec.serving import SlotEngine, SpeculationTable  # pylint: disable=import-outside-toplevel
  from jaxspec.serving import budget, server  # pylint: disable=import-outside-toplevel
  FLAGS = flags.FLAGS  # pylint: disable=invalid-name
  api_key = _API_KEY.value or os.environ.get("JAXSPEC_API_KEY", "")
  server.warn_if_exposed(_HOST.value, api_key)
  table = SpeculationTable.read(_TABLE.value, f"--speculation_table={_TABLE.value}") if _TABLE.value else None
  if table is not None:
    ignored = [f"--{n}" for n in ("gamma", "tree") if FLAGS[n].present]
    if ignored:
      print(f"warning: {' and '.join(ignored)} ignored: --speculation_table={_TABLE.value} sets the speculation at "
            "each load.", file=sys.stderr, flush=True)
  mesh = cli_flags.mesh()
  target = jobs.load_target(FLAGS.target, mesh)
  spec = _draft_spec(target)
  if spec and table is not None and table.max_gamma == 0:  # e.g. a tuned table where no draft paid
    print(f"warning: --speculation_table={_TABLE.value} has no drafting entry (gamma 0 at every load): decoding "
          f"plainly, the draft ({spec}) is not loaded.", file=sys.stderr, flush=True)
    spec = ""
  drafts = jobs.load_drafts(spec, target, mesh)
  if len(drafts) > 1:
    raise InputError(f"--draft={spec}: one draft expected here, got {len(drafts)}.")
  draft = next(iter(drafts.values()), None)
  engine = SlotEngine(target, cli_flags.speculation(draft), slots=_SLOTS.value,
                      max_input_length=FLAGS.max_input_length, max_new_tokens=FLAGS.max_new_tokens,
                      iterations_per_step=_ITERATIONS.value, table=table, mesh=mesh,
                      row_buckets=_row_buckets(), modes=_MODES.value,
                      budget=budget.from_flags(speculation=_SPECULATION.value, drafts=draft is not None,
                                               table=table is not None, tiers=_BUDGET_TIERS.value,
                                               theta=_BUDGET_THETA.value, margin=_BUDGET_MARGIN.value,
                                               repeats=_BUDGET_REPEATS.value, probe=_BUDGET_PROBE.value))
  drafting = "plain" if draft is None else f"draft {spec}"
  if table is not None:
    drafting += f", table {_TABLE.value}"
  elif engine.budget is not None:
    drafting += f", verification budget over draft lengths {[e.gamma for e in engine.table.entries]}"
  return server.serve(engine, model_name=_NAME.value or server.model_id(FLAGS.target), drafting=drafting,
                      host=_HOST.value, port=_PORT.value, log_level=_LOG.value, max_tokens=_MAX_TOKENS.value or None,
                      queue_size=_QUEUE.value, api_key=api_key or None)


if __name__ == "__main__":
  cli_flags.run(main)
