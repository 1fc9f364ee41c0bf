r"""Trains an EAGLE-3 feature head for a decoder-only or T5 target on the target's own responses; resumable.

    python launch/train_head.py --target=DIR --prompts=prompts.txt --out=runs/head --steps=2000
    python launch/train_head.py ... --mesh=data:8 --batch_size=64            # data parallel over 8 devices
    python launch/generate.py --target=DIR --draft=runs/head/head            # draft with the trained head

Every line of --prompts is one prompt (empty lines are skipped): text encoded by the target's tokenizer (with
--chat, through its chat template), or space-separated token ids for a target without a tokenizer. The last
--heldout prompts (or those of --heldout_prompts) are kept out of training and decoded with the head drafting
every --eval_every steps: tokens per target call and acceptance. For a T5 target the prompts are its encoder
inputs (with the task prefix it was trained on, e.g. "translate English to German: ") and the head is a T5
target's head (a cross-attention sublayer to the encoder output; docs/heads.md, "T5 targets"). All of it is
`jaxspec.training.head.train_head`: the target regenerates the responses (OUT/data.json), the draft vocabulary
is the --draft_vocab_size most frequent response tokens, each step captures the target's features of its batch
and trains SpecForge's unrolled loss; Orbax checkpoints go to OUT/checkpoints and the head, in SpecForge's
format, to OUT/head (`jaxspec.load`-able). Started again with the same --out, a run continues from its latest
checkpoint (--noresume refuses a directory that holds one).
"""

import os

from absl import flags

import jaxspec
from jaxspec.cli import flags as cli_flags
from jaxspec.tools.inputs import encode_texts, read_lines
from jaxspec.checks import MAX_SEED
from jaxspec.errors import InputError, OutputError
from jaxspec.training.head import HeadTrainConfig, check_run, train_head

cli_flags.define_models(target="", draft=None)
cli_flags.define_mesh()
_PROMPTS = flags.DEFINE_string("prompts", None, "Training prompts: a text file, one prompt a line.", required=True)
_OUT = flags.DEFINE_string("out", None, "Run directory: data, checkpoints and the exported head (OUT/head).",
                           required=True)
_STEPS = flags.DEFINE_integer("steps", 1000, "Optimizer steps.", lower_bound=1)
_BATCH = flags.DEFINE_integer("batch_size", 8, "Rows per step (a multiple of the mesh's data axis).", lower_bound=1)
_LR = flags.DEFINE_float("lr", 1e-4, "Peak learning rate of AdamW (b1 0.9, b2 0.95; cosine decay to 0).")
_WARMUP = flags.DEFINE_integer("warmup_steps", 0, "Linear learning-rate warm-up.", lower_bound=0)
_VOCAB = flags.DEFINE_integer("draft_vocab_size", 32000, "The head's vocabulary: the most frequent response "
                              "tokens (at most the target's vocabulary).", lower_bound=1)
_TTT = flags.DEFINE_integer("ttt_steps", 7, "Draft steps unrolled in the training-time test.", lower_bound=1)
_MAX_NEW = flags.DEFINE_integer("max_new_tokens", 256, "Longest regenerated response.", lower_bound=1)
_MAX_IN = flags.DEFINE_integer("max_input_length", 512, "Longest prompt in tokens (longer ones are truncated).",
                               lower_bound=1)
_TEMPERATURE = flags.DEFINE_float("temperature", 0.0, "Regeneration: 0 = the target's greedy responses, else "
                                  "sampled at this temperature.", lower_bound=0.0)
_CHAT = flags.DEFINE_boolean("chat", False, "Apply the tokenizer's chat template to every prompt.")
_HELDOUT = flags.DEFINE_integer("heldout", 16, "Prompts kept from the end of --prompts for the evaluations.",
                                lower_bound=0)
_HELDOUT_FILE = flags.DEFINE_string("heldout_prompts", "", "A file of held-out prompts instead of --heldout.")
_EVAL_EVERY = flags.DEFINE_integer("eval_every", 100, "Held-out acceptance every this many steps (0: at the start "
                                   "and the end only).", lower_bound=0)
_GAMMA = flags.DEFINE_integer("gamma", 3, "Draft tokens per iteration in the evaluations.", lower_bound=1,
                              upper_bound=256)
_CHECKPOINT_EVERY = flags.DEFINE_integer("checkpoint_every", 100, "Steps between checkpoints (0: at the end).",
                                         lower_bound=0)
_GEN_BATCH = flags.DEFINE_integer("generate_batch_size", 8, "Rows per generate call (regeneration, evaluation).",
                                  lower_bound=1)
_SEED = flags.DEFINE_integer("seed", 0, "Initialisation, batch order and regeneration samples.", lower_bound=0,
                             upper_bound=MAX_SEED)
_RESUME = flags.DEFINE_boolean("resume", True, "Continue from the latest checkpoint in --out (--noresume: refuse "
                               "a directory that holds one).")
_PROGRESS = flags.DEFINE_boolean("progress", True, "A progress bar on stderr.")


def _texts(path: str, what: str) -> list[str]:
  """The non-empty lines of `path` (InputError when none is left)."""
  texts = [t for t in read_lines(path) if t.strip()]
  if not texts:
    raise InputError(f"{what}={path}: no prompts (the file is empty or blank).")
  return texts


def _encode(texts: list[str], target, what: str) -> list[list[int]]:
  """Prompts as token ids: through the target's tokenizer, or read as ids when it has none."""
  if target.tokenizer is not None:
    return encode_texts(target.tokenizer, texts, chat=_CHAT.value, max_input_length=_MAX_IN.value)
  try:
    return [[int(t) for t in line.split()] for line in texts]
  except ValueError:
    raise InputError(f"{what}: the target has no tokenizer, so prompts must be space-separated token "
                     "ids.") from None


def _config() -> HeadTrainConfig:
  return HeadTrainConfig(
      steps=_STEPS.value, batch_size=_BATCH.value, learning_rate=_LR.value, warmup_steps=_WARMUP.value,
      draft_vocab_size=_VOCAB.value, ttt_steps=_TTT.value, max_new_tokens=_MAX_NEW.value,
      max_input_length=_MAX_IN.value, temperature=_TEMPERATURE.value, generate_batch_size=_GEN_BATCH.value,
      eval_every=_EVAL_EVERY.value, eval_gamma=_GAMMA.value, checkpoint_every=_CHECKPOINT_EVERY.value,
      seed=_SEED.value, progress=_PROGRESS.value)


def main(argv):
  del argv
  mesh = cli_flags.mesh()
  texts = _texts(_PROMPTS.value, "--prompts")  # bad inputs fail before the target loads
  held_texts = _texts(_HELDOUT_FILE.value, "--heldout_prompts") if _HELDOUT_FILE.value else None
  if held_texts is None and _HELDOUT.value >= len(texts):
    raise InputError(f"--heldout={_HELDOUT.value} leaves no training prompt of the {len(texts)} in "
                     f"{_PROMPTS.value}.")
  config = _config()
  # --out, its checkpoints and head, and the settings that need no target, before the target loads.
  check_run(_OUT.value, config, len(texts) - (0 if held_texts is not None else _HELDOUT.value), flags=True)
  if not _RESUME.value and os.path.isdir(os.path.join(_OUT.value, "checkpoints")):
    raise OutputError(f"--out={_OUT.value} holds a run's checkpoints and --noresume was given: choose another "
                      "directory or remove it.")
  target = jaxspec.load(flags.FLAGS.target, mesh=mesh)
  if not isinstance(target, jaxspec.Model):
    raise InputError(f"--target={flags.FLAGS.target} is a feature head, not a model.")
  prompts = _encode(texts, target, "--prompts")
  if held_texts is not None:
    heldout = _encode(held_texts, target, "--heldout_prompts")
  else:
    cut = len(prompts) - _HELDOUT.value
    prompts, heldout = prompts[:cut], prompts[cut:]
  train_head(target, prompts, _OUT.value, config, heldout_prompts=heldout, mesh=mesh,
             name=os.path.basename(os.path.normpath(_OUT.value)) + "/head")


if __name__ == "__main__":
  cli_flags.run(main)
