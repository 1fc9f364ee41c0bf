r"""Trains the shared EN-DE sentencepiece tokenizer with T5's special ids (pad 0, eos 1, unk 2).

    python launch/train_tokenizer.py --output_dir=runs/tokenizer                  # the corpus of --data_dir
    python launch/train_tokenizer.py --train=my_pairs.tsv.gz --output_dir=runs/tokenizer

The output directory loads with `jaxspec.tokenizer.load_tokenizer` (and `jaxspec.load` when it also holds
weights), exactly like a Hugging Face T5 tokenizer; configs/ende.py takes it as --config.tokenizer.
"""

import os
import tempfile

import sentencepiece as spm
from absl import flags

from jaxspec.cli import flags as cli_flags
from jaxspec.data.ende import default_data_dir, read_pairs, split_path
from jaxspec.tokenizer import write_sentencepiece_tokenizer

_TRAIN = flags.DEFINE_string("train", "train", "EN-DE TSV to learn the pieces from: 'train' of --data_dir or a path.")
_DATA = flags.DEFINE_string("data_dir", "", f"EN-DE corpus directory ('' = {default_data_dir()}).")
_OUTPUT = flags.DEFINE_string("output_dir", None, "Where spiece.model and its config go.", required=True)
_VOCAB = flags.DEFINE_integer("vocab_size", 8000, "Pieces, special tokens included.", lower_bound=8)


def train(train_tsv: str, output_dir: str, vocab_size: int) -> None:
  pairs = read_pairs(train_tsv)
  with tempfile.TemporaryDirectory() as tmp:
    text = os.path.join(tmp, "text.txt")
    with open(text, "w", encoding="utf-8") as f:
      for p in pairs:
        f.write(p.en + "\n" + p.de + "\n")
    spm.SentencePieceTrainer.train(
        input=text, model_prefix=os.path.join(tmp, "sp"), vocab_size=vocab_size, model_type="unigram",
        pad_id=0, eos_id=1, unk_id=2, bos_id=-1, character_coverage=1.0, minloglevel=2,
        input_sentence_size=400_000, shuffle_input_sentence=True, hard_vocab_limit=False)
    write_sentencepiece_tokenizer(os.path.join(tmp, "sp.model"), output_dir)


def main(argv):
  del argv
  train(split_path(_TRAIN.value, _DATA.value), _OUTPUT.value, _VOCAB.value)
  print(f"tokenizer written to {_OUTPUT.value}")


if __name__ == "__main__":
  cli_flags.run(main)
