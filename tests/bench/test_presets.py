"""jaxspec.bench.presets: the paper's Table 2 is consistent with Theorem 3.8, and the T5 shapes are the public ones."""

import pytest

import jaxspec
from jaxspec.models.t5.shapes import T5_SHAPES
from jaxspec.bench import presets


def _reproduces(speedup, row) -> bool:
  """Whether speedup(alpha, gamma, c), for some alpha and c that round to the printed ones (2 decimals), rounds to
  the printed Exp (1 decimal). The speedup rises with alpha and falls with c, so the box's corners bound it."""
  lo = speedup(row.alpha - 0.005, row.gamma, row.c + 0.005)
  hi = speedup(row.alpha + 0.005, row.gamma, row.c - 0.005)
  return lo <= row.exp + 0.05 and hi >= row.exp - 0.05


@pytest.mark.parametrize("row", presets.TABLE2, ids=lambda r: r.name)
def test_theorem_3_8_reproduces_the_exp_column(row):
  assert _reproduces(jaxspec.expected_speedup, row), row


def test_the_exp_check_rejects_an_off_by_one_theorem():
  off_by_one = lambda alpha, gamma, c: jaxspec.expected_speedup(alpha, gamma + 1, c)
  assert not all(_reproduces(off_by_one, row) for row in presets.TABLE2)


def test_rows_cover_both_tasks_drafts_and_temperatures_once():
  names = [r.name for r in presets.TABLE2]
  assert len(names) == len(set(names)) == 12
  assert presets.paper_row("cnndm_large_t1").gamma == 3
  assert presets.paper_row_for("ende", "t5-small", 0).alpha == 0.75
  assert presets.paper_row_for("ende", "t5-3b", 0) is None
  with pytest.raises(ValueError, match="unknown Table 2 row"):
    presets.paper_row("ende_tiny_t0")


def test_t5_shapes_match_the_public_parameter_counts():
  """Parameter counts of the T5 1.0 checkpoints (60M, 220M, 770M, 2.8B, 11B) from the shapes alone."""
  def params(d_model, d_kv, d_ff, num_layers, num_decoder_layers, num_heads, vocab=32128):
    attn = 4 * d_model * num_heads * d_kv
    enc = num_layers * (attn + 2 * d_model * d_ff + 2 * d_model)
    dec = num_decoder_layers * (2 * attn + 2 * d_model * d_ff + 3 * d_model)
    return vocab * d_model + enc + dec
  published = {"t5-small": 60e6, "t5-base": 220e6, "t5-large": 770e6, "t5-3b": 2.8e9, "t5-11b": 11e9}
  for name, shape in T5_SHAPES.items():
    assert params(**shape) == pytest.approx(published[name], rel=0.05), name
