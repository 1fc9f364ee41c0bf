r"""Text generation with any target and draft jaxspec loads, speculatively, next to plain decoding.

    echo "Summarize: the house is small." | python launch/generate.py --target=DIR --draft=DIR
    python launch/generate.py --target=DIR --draft=DIR --input=prompts.txt --output=out.txt --chat \
        --temperature=0.7 --top_p=0.9 --batch_size=8

Every line of --input (a text file, or '-' for stdin) is one prompt and gives exactly one output line (an empty
prompt, an empty line); newlines inside an output are written as \n (`jaxspec.cli.outputs.escape_line`). With --chat
each prompt goes through the target tokenizer's chat template first (decoder-only instruction models). With
--output, lines are written as they are made and a rerun resumes after the last complete line. Then the same
speed summary as translate.py. Prompt i is sampled with a seed derived from --seed and i.
"""

from absl import flags

from jaxspec.cli import flags as cli_flags, jobs
from jaxspec.cli.inputs import STDIN, read_texts

cli_flags.define_models(target="ende-target", draft="ende-draft")
cli_flags.define_decoding(gamma=4, batch_size=1, max_new_tokens=64, max_input_length=512)
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


def main(argv):
  del argv
  mesh = cli_flags.mesh()
  texts = read_texts(_INPUT.value, column="en")
  writer = jobs.open_output(_OUTPUT.value, len(texts))
  target, draft = jobs.load_pair(flags.FLAGS.target, flags.FLAGS.draft, mesh)
  run = jobs.generate_texts(texts, target, cli_flags.speculation(draft), cli_flags.sampling(), writer=writer,
                            prefix=_PREFIX.value, chat=_CHAT.value, long_inputs=_LONG.value, compare=_COMPARE.value,
                            desc="generate", **cli_flags.run_kwargs())
  if run is not None and run.identical is False:
    raise SystemExit("speculative and plain greedy outputs differ")


if __name__ == "__main__":
  cli_flags.run(main)
