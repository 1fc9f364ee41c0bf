r"""Trains the shared EN-DE sentencepiece tokenizer with T5's special ids (pad 0, eos 1, unk 2).

    python launch/train_tokenizer.py --train=../shared/data/ende/train.tsv.gz --output_dir=/tmp/ende_tokenizer

The output directory loads with `jaxspec.tokenizer.load_tokenizer` (and `jaxspec.load` when it also holds
weights), exactly like a Hugging Face T5 tokenizer.
"""

import os
import tempfile

import sentencepiece as spm
from absl import app, flags

from jaxspec.data.ende import read_pairs
from jaxspec.tokenizer import write_sentencepiece_tokenizer

_TRAIN = flags.DEFINE_string("train", "../shared/data/ende/train.tsv.gz", "EN-DE TSV to learn the pieces from.")
_OUTPUT = flags.DEFINE_string("output_dir", "/tmp/ende_tokenizer", "Where spiece.model and its config go.")
_VOCAB = flags.DEFINE_integer("vocab_size", 8000, "Pieces, special tokens included.")


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
  train(_TRAIN.value, _OUTPUT.value, _VOCAB.value)
  print(f"tokenizer written to {_OUTPUT.value}")


if __name__ == "__main__":
  app.run(main)
