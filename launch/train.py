r"""Trains a T5 on EN-DE pairs (configs/ende.py); resumable from Orbax checkpoints.

    python launch/train.py --config=configs/ende.py:target --workdir=runs/target
    python launch/train.py --config=configs/ende.py:draft --workdir=runs/draft    # distils from config.teacher

All of it is `jaxspec.training.loop.train_and_evaluate(config, workdir)`: a killed run started again with the same
--workdir continues from its latest checkpoint, at the same place in the data; a tqdm bar and progress lines give
steps/s, tokens/s, loss and ETA; evaluations give dev loss and BLEU; the model is exported to WORKDIR/export
(`jaxspec.load`-able). The tokenized corpus is cached in WORKDIR, keyed on the data files and the tokenizer.
"""

import os

from absl import flags, logging

from jaxspec.cli import flags as cli_flags
from jaxspec.training.loop import train_and_evaluate

CONFIGS = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "configs"))
_CONFIG = cli_flags.define_config_file("config", os.path.join(CONFIGS, "ende.py:target"), "Training settings.")
_WORKDIR = flags.DEFINE_string("workdir", None, "Directory for checkpoints, the token cache and the export.",
                               required=True)


def main(argv):
  del argv
  logging.info("config:\n%s", _CONFIG.value)
  train_and_evaluate(_CONFIG.value, _WORKDIR.value)


if __name__ == "__main__":
  cli_flags.run(main)
