r"""Trains a T5 on EN-DE pairs (configs/ende.py); resumable from Orbax checkpoints.

    python launch/train.py --config=configs/ende.py:target --workdir=runs/target
    python launch/train.py --config=configs/ende.py:draft --workdir=runs/draft    # distils from config.teacher

All of it is `jaxspec.training.loop.train_and_evaluate(config, workdir)`: a killed run started again with the same
--workdir continues from its latest checkpoint, at the same place in the data; a tqdm bar and progress lines give
steps/s, tokens/s, loss and ETA; evaluations give dev loss and BLEU; the model is exported to WORKDIR/export
(`jaxspec.load`-able). The tokenized corpus is cached in WORKDIR, keyed on the data files and the tokenizer. The
training and dev files are checked first: a missing file, a TSV without its header or without a usable row is one
line naming it.
"""

import os

from absl import flags, logging

from jaxspec.cli import flags as cli_flags
from jaxspec.data.ende import read_pairs, split_path
from jaxspec.errors import InputError
from jaxspec.training.loop import train_and_evaluate

CONFIGS = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "configs"))
_CONFIG = cli_flags.define_config_file("config", os.path.join(CONFIGS, "ende.py:target"), "Training settings.")
_WORKDIR = flags.DEFINE_string("workdir", None, "Directory for checkpoints, the token cache and the export.",
                               required=True)


def check_inputs(c) -> None:
  """Before any model is built (as the pair pipeline's `jaxspec.training.ende_pair.check_inputs`): the training
  file and every dev split exist, are EN-DE TSVs and hold a usable pair (both sides non-empty). A header without
  rows was a raw IndexError from the tokenizer. config.train unset is `train_and_evaluate`'s to name."""
  if c.train is None:
    return
  train = split_path(c.train or "train", c.data_dir)
  if not read_pairs(train, limit=1):
    raise InputError(f"config.train={c.train}: {train} holds no usable pair (no row with both 'en' and 'de'): "
                     "nothing to train on.")
  for split in (s.strip() for s in (c.dev or "dev").split(",") if s.strip()):
    path = split_path(split, c.data_dir)
    if not read_pairs(path, limit=1):
      raise InputError(f"config.dev={c.dev}: {path} holds no usable pair (no row with both 'en' and 'de'): "
                       "nothing to evaluate on.")


def main(argv):
  del argv
  logging.info("config:\n%s", _CONFIG.value)
  check_inputs(_CONFIG.value)
  train_and_evaluate(_CONFIG.value, _WORKDIR.value)


if __name__ == "__main__":
  cli_flags.run(main)
