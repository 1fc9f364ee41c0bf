r"""Text generation with any target and draft jaxspec loads, speculatively, next to plain decoding.

    echo "Summarize: the house is small." | python launch/generate.py --target=DIR --draft=DIR
    python launch/generate.py --target=DIR --draft=DIR --input=prompts.txt --output=out.txt --chat \
        --temperature=0.7 --top_p=0.9 --batch_size=8

Every line of --input (a text file, or '-' for stdin) is one prompt and gives exactly one output line (an empty
prompt, an empty line); newlines inside an output are written as \n (`jaxspec.tools.outputs.escape_line`). With --chat
each prompt goes through the target tokenizer's chat template first (decoder-only instruction models). With
--output, lines are written as they are made and a rerun resumes after the last complete line, only when this
script wrote the file with the same input lines and settings (`jaxspec.cli.resume`; --resume_with_new_settings
lets a sampled run continue with another --draft or --gamma). Then the same speed summary as translate.py. Prompt
i is sampled with a seed derived from --seed and i.

--draft left at its default (the embedded EN-DE draft) with a target it cannot draft for (another tokenizer or
family) decodes plainly and says so. --gamma takes an integer: the measured choice (--gamma=auto) is
translate.py's.
"""


from absl import flags

import jaxspec
from jaxspec.cli import flags as cli_flags, jobs, resume
from jaxspec.tools.inputs import STDIN, InputError, read_texts

cli_flags.define_models(target="ende-target", draft="ende-draft")
cli_flags.define_decoding(gamma=4, batch_size=1, max_new_tokens=64, max_input_length=512, auto_gamma=True,
                          advertise_auto=False)  # 'auto' parses only to be refused in one line (translate.py's)
flags.register_validator("gamma", lambda v: v != cli_flags.AUTO, message="--gamma=auto is translate.py's (it "
                         "calibrates on the inputs); generate.py takes an integer >= 1")
flags.register_validator("tree", lambda v: v != cli_flags.AUTO, message="--tree=auto is translate.py's (it "
                         "calibrates on the inputs); generate.py takes 'K,N' or ''")
resume.define_flags()
cli_flags.define_sampling()
cli_flags.define_mesh()
_INPUT = flags.DEFINE_string("input", STDIN, "A text file (one prompt a line), a TSV (its 'en' column) or '-' "
                             "for stdin.")
_OUTPUT = flags.DEFINE_string("output", "", "Where outputs go, one line per prompt (resumable); '' prints them.")
_CHAT = flags.DEFINE_boolean("chat", False, "Apply the tokenizer's chat template to every prompt.")
_PREFIX = flags.DEFINE_string("prefix", "", "Text put before every prompt (e.g. a T5 task prefix).")
_LONG = flags.DEFINE_enum("long_inputs", "truncate", ["truncate", "refuse"],
                          "Prompts longer than --max_input_length: truncate with a warning, or refuse to run.")
_COMPARE = flags.DEFINE_boolean("compare", True, "Also decode plainly and time both side by side.")


def _draft_spec(target: jaxspec.Model) -> str:
  """--draft, or '' (plain decoding, said on stderr) when it is left at its default and cannot draft for target."""
  FLAGS = flags.FLAGS  # pylint: disable=invalid-name
  return jobs.default_draft(target, FLAGS.draft, FLAGS["draft"].present, FLAGS.target, "decoding")


def main(argv):
  del argv
  mesh = cli_flags.mesh()
  texts = read_texts(_INPUT.value, column="en")
  writer = jobs.open_output(_OUTPUT.value, texts, resume.record_from_flags(texts, _INPUT.value),
                            input_spec=_INPUT.value, allow_new_settings=flags.FLAGS.resume_with_new_settings)
  target = jobs.load_target(flags.FLAGS.target, mesh)
  spec = _draft_spec(target)
  drafts = jobs.load_drafts(spec, target, mesh)
  if len(drafts) > 1:
    raise InputError(f"--draft={spec}: one draft expected here (a pool is translate.py's), got {len(drafts)}.")
  draft = next(iter(drafts.values()), None)
  run = jobs.generate_texts(texts, target, cli_flags.speculation(draft), cli_flags.sampling(), writer=writer,
                            prefix=_PREFIX.value, chat=_CHAT.value, long_inputs=_LONG.value, compare=_COMPARE.value,
                            desc="generate", **cli_flags.run_kwargs())
  if run is not None and run.identical is False:
    raise SystemExit("speculative and plain greedy outputs differ")


if __name__ == "__main__":
  cli_flags.run(main)
