"""jaxspec.bench.profiling: the loop's wall time split into target, draft, loop kernels and idle time."""

import jax
import pytest

import jaxspec
from jaxspec.bench import profiling
from jaxspec.models import t5


def _random_model(seed, **shape):
  cfg = t5.T5Config(vocab_size=64, d_kv=8, num_heads=2, **shape)
  return jaxspec.Model(cfg, t5.init_params(cfg, jax.random.key(seed)), None, f"random{seed}")


def test_breakdown_counts_overlapping_kernels_once_with_priority():
  categories = {"t": "target", "d": "draft", "l": "loop"}

  def event(op, start_us, dur_us, run="1"):
    return {"ph": "X", "ts": start_us, "dur": dur_us, "name": op,
            "args": {"hlo_module": "jit_run", "hlo_op": op, "run_id": run}}

  events = [event("t", 0, 10), event("d", 5, 10),  # draft overlaps the target for 5 us: counted as target
            event("l", 20, 2), event("l", 21, 2),  # two loop kernels overlapping: 3 us of loop time
            event("t", 30, 5),  # idle 15-20 and 23-30: 12 us
            {"ph": "X", "ts": 0, "dur": 99, "name": "other", "args": {"hlo_module": "jit_prefill", "hlo_op": "t"}}]
  parts = profiling.breakdown_from_trace(events, categories)
  assert parts["executions"] == 1
  assert parts["wall"] == pytest.approx(35e-6)
  assert parts["target"] == pytest.approx(15e-6)
  assert parts["draft"] == pytest.approx(5e-6)
  assert parts["loop"] == pytest.approx(3e-6)
  assert parts["idle"] == pytest.approx(12e-6)


def test_instructions_without_metadata_take_their_operands_model():
  hlo = "\n".join([
      '%p = f32[1,8]{1,0} parameter(0)',
      '%act = f32[1,8]{1,0} fusion(%p), kind=kLoop, metadata={op_name="jit(run)/while/body/target_step/mul"}',
      '%dot.1 = f32[1,4]{1,0} dot(%act, %p), lhs_contracting_dims={1}, rhs_contracting_dims={0}',
      '%d = f32[1,8]{1,0} fusion(%p), kind=kLoop, metadata={op_name="jit(run)/while/body/draft_step/add"}',
      '%arg = s32[1]{0} fusion(%dot.1), kind=kLoop, metadata={op_name="jit(run)/while/body/argmax"}',
      '%w = (f32[1,8]{1,0}) while(%p), condition=%c, body=%b'])
  cats = profiling.instruction_categories(hlo)
  assert cats["act"] == "target" and cats["dot.1"] == "target" and cats["d"] == "draft"
  assert cats["arg"] == "loop" and cats["p"] == "loop" and cats["w"] == "control"


def test_profile_of_real_decodes_maps_every_kernel():
  target = _random_model(0, d_model=32, d_ff=64, num_layers=2, num_decoder_layers=2)
  draft = _random_model(1, d_model=16, d_ff=32, num_layers=1, num_decoder_layers=1)
  prompts = [[5, 6, 7, 8, 1]]
  for kw in ({}, {"speculation": jaxspec.Speculation(draft, gamma=3)}):
    hlo = jaxspec.lower(target, prompts, max_new_tokens=8, **kw).loop_hlo()
    jaxspec.generate(target, prompts, max_new_tokens=8, **kw)  # compiles
    parts = profiling.loop_time_breakdown(
        lambda kw=kw: jaxspec.generate(target, prompts, max_new_tokens=8, **kw), hlo)
    assert parts["executions"] == 1
    assert parts["unmapped_instructions"] == []  # the HLO is the program that ran
    assert parts["target"] > 0 and parts["loop"] > 0
    assert (parts["draft"] > 0) == ("speculation" in kw)
    assert sum(parts[c] for c in profiling.CATEGORIES) == pytest.approx(parts["wall"], rel=1e-6)


def test_a_fusion_holding_a_models_work_is_that_models():
  hlo = "\n".join([
      "%fused_computation.7 (param_0: f32[4,384], param_1: f32[8000,384]) -> f32[4] {",
      '  %dot.3 = f32[4,8000]{1,0} dot(%param_0, %param_1), metadata={op_name="jit(run)/while/body/target_step/dot"}',
      '  ROOT %reduce.1 = f32[4]{0} reduce(%dot.3, %c), metadata={op_name="jit(run)/while/body/reduce_max"}',
      "}",
      "ENTRY %main (p: f32[4,384]) -> f32[4] {",
      '  %p = f32[4,384]{1,0} parameter(0)',
      '  ROOT %ynn_fusion.34 = f32[4]{0} fusion(%p, %p), kind=kCustom, calls=%fused_computation.7, '
      'metadata={op_name="jit(run)/while/body/reduce_max"}',
      "}"])
  assert profiling.instruction_categories(hlo)["ynn_fusion.34"] == "target"
