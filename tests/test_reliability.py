"""Nothing lost, nothing silently wrong (issue 15): saves, loads, seeds and generate's arguments.

Each test is a regression test for a failure seen before: it failed on the code before the fix.
"""

import dataclasses
import json
import os
import shutil
import struct

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxspec
from jaxspec.checkpoint import io
from jaxspec.checkpoint.safetensors_io import SafetensorsFile, save_file

from conftest import write_hf_t5


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
  d = write_hf_t5(str(tmp_path_factory.mktemp("rel") / "m"), "t5_v1_1", d_model=16)
  return d, jaxspec.load(d, dtype=jnp.float32)


def _perturbed(model, scale):
  return dataclasses.replace(model, params=jax.tree.map(lambda x: x * scale, model.params))


def _same_params(a, b):
  return all(np.array_equal(x, y) for x, y in zip(jax.tree.leaves(a.params), jax.tree.leaves(b.params)))


# --- saves (items 2, 3, 11) ---

def test_hf_save_over_an_orbax_save_loads_what_was_saved(tiny, tmp_path):
  _, model = tiny
  d = str(tmp_path / "ckpt")
  jaxspec.save(model, d, format="orbax")
  new = _perturbed(model, 2.0)
  jaxspec.save(new, d, format="hf")
  assert _same_params(jaxspec.load(d), new)
  assert not os.path.exists(os.path.join(d, "jaxspec.json")) and not os.path.exists(os.path.join(d, "params"))
  jaxspec.save(model, d, format="orbax")  # and back
  assert _same_params(jaxspec.load(d), model)


def test_a_failed_save_leaves_the_old_checkpoint(tiny, tmp_path, monkeypatch):
  _, model = tiny
  d = str(tmp_path / "ckpt")
  jaxspec.save(model, d, format="hf")
  before = sorted(os.listdir(d))

  def dies(*args, **kwargs):
    raise OSError("disk full")
  monkeypatch.setattr(io, "save_file", dies)
  with pytest.raises(OSError, match="disk full"):
    jaxspec.save(_perturbed(model, 3.0), d, format="hf")
  assert sorted(os.listdir(d)) == before and _same_params(jaxspec.load(d), model)
  assert [n for n in os.listdir(tmp_path) if n != "ckpt"] == []  # no staging directory left behind


def test_save_refuses_files_and_foreign_directories(tiny, tmp_path):
  _, model = tiny
  (tmp_path / "afile").write_text("x")
  with pytest.raises(jaxspec.CheckpointError, match="not a directory"):
    jaxspec.save(model, str(tmp_path / "afile"))
  (tmp_path / "photos").mkdir()
  (tmp_path / "photos" / "cat.jpg").write_text("meow")
  with pytest.raises(jaxspec.CheckpointError, match="not a model checkpoint"):
    jaxspec.save(model, str(tmp_path / "photos"))
  assert (tmp_path / "photos" / "cat.jpg").read_text() == "meow"


def test_save_without_tokenizer_drops_the_old_tokenizer(tiny, tmp_path):
  _, model = tiny
  d = tmp_path / "ckpt"
  jaxspec.save(model, str(d), format="hf")
  (d / "tokenizer_config.json").write_text("{}")  # as if an earlier save had a tokenizer
  jaxspec.save(model, str(d), format="hf")
  assert not (d / "tokenizer_config.json").exists()


# --- loads (items 4, 11) ---

def _edit_safetensors(directory, fn):
  path = os.path.join(directory, "model.safetensors")
  f = SafetensorsFile(path)
  tensors = {k: np.array(f.get(k)) for k in f.keys()}
  fn(tensors)
  save_file(tensors, path, metadata={"format": "pt"})
  return path


def _copy(src, dst):
  shutil.copytree(src, dst)
  return str(dst)


@pytest.mark.parametrize("edit,message", [
    (lambda t: t.__setitem__("shared.weight", np.full_like(t["shared.weight"], np.nan)), "NaN or infinite"),
    (lambda t: t.__setitem__("shared.weight", t["shared.weight"].astype(np.int64)), "stored as int64"),
    (lambda t: t.__setitem__("shared.weight", t["shared.weight"] > 0), "stored as bool"),
])
def test_bad_tensors_are_refused_naming_file_and_tensor(tiny, tmp_path, edit, message):
  d = _copy(tiny[0], tmp_path / "m")
  _edit_safetensors(d, edit)
  with pytest.raises(jaxspec.CheckpointError, match=rf"model\.safetensors: tensor 'shared\.weight'.*{message}"):
    jaxspec.load(d)


def test_nan_check_can_be_skipped(tiny, tmp_path):
  d = _copy(tiny[0], tmp_path / "m")
  _edit_safetensors(d, lambda t: t.__setitem__("decoder.final_layer_norm.weight",
                                              np.full_like(t["decoder.final_layer_norm.weight"], np.nan)))
  model = jaxspec.load(d, check_finite=False)
  assert np.isnan(np.asarray(model.params["decoder"]["final_norm"])).all()


def _rewrite_header(path, fn):
  with open(path, "rb") as f:
    (n,) = struct.unpack("<Q", f.read(8))
    header = json.loads(f.read(n))
    data = f.read()
  blob = json.dumps(fn(header)).encode()
  blob += b" " * (-len(blob) % 8)
  with open(path, "wb") as f:
    f.write(struct.pack("<Q", len(blob)) + blob + data)


def test_corrupt_safetensors_headers(tiny, tmp_path):
  d = _copy(tiny[0], tmp_path / "m")
  path = os.path.join(d, "model.safetensors")
  original = open(path, "rb").read()

  def overlap(h):
    names = [k for k in h if k != "__metadata__"]
    h[names[1]]["data_offsets"] = [h[names[0]]["data_offsets"][0], h[names[0]]["data_offsets"][0]
                                   + h[names[1]]["data_offsets"][1] - h[names[1]]["data_offsets"][0]]
    return h
  cases = [(overlap, "overlap"), (lambda h: list(h), "expected a JSON object"),
           (lambda h: {k: ({x: y for x, y in v.items() if x != "dtype"} if k != "__metadata__" else v)
                       for k, v in h.items()}, "corrupt header entry")]
  for fn, message in cases:
    with open(path, "wb") as f:
      f.write(original)
    _rewrite_header(path, fn)
    with pytest.raises(jaxspec.CheckpointError, match=message):
      jaxspec.load(d)


def test_bad_configs_and_indexes(tiny, tmp_path):
  d = _copy(tiny[0], tmp_path / "m")
  cfg_path = os.path.join(d, "config.json")
  cfg = json.load(open(cfg_path))
  for bad, message in [([1, 2], "expected a JSON object"), ({**cfg, "d_model": "big"}, "d_model must be an integer"),
                       ({**cfg, "num_heads": 0}, "num_heads must be an integer >= 1")]:
    json.dump(bad, open(cfg_path, "w"))
    with pytest.raises(jaxspec.CheckpointError, match=message):
      jaxspec.load(d)
  json.dump(cfg, open(cfg_path, "w"))
  os.rename(os.path.join(d, "model.safetensors"), os.path.join(d, "model-00001-of-00001.safetensors"))
  json.dump({"metadata": {}}, open(os.path.join(d, "model.safetensors.index.json"), "w"))
  with pytest.raises(jaxspec.CheckpointError, match="no 'weight_map'"):
    jaxspec.load(d)


def test_bad_dtype_and_tokenizer(tiny, tmp_path):
  d = _copy(tiny[0], tmp_path / "m")
  with pytest.raises(jaxspec.CheckpointError, match="floating-point"):
    jaxspec.load(d, dtype="int8")
  (tmp_path / "m" / "tokenizer.json").write_text("{not json")
  with pytest.raises(jaxspec.CheckpointError, match="cannot read the tokenizer files"):
    jaxspec.load(d)


def test_unknown_model_lists_only_models():
  with pytest.raises(jaxspec.CheckpointError) as e:
    jaxspec.load("no-such-model")
  assert "samples" not in str(e.value) and "ende-target" in str(e.value)


# --- generate (items 4, 7, 8, 9) ---

@pytest.fixture(scope="module")
def pair(tiny):
  _, target = tiny
  noisy = dataclasses.replace(target, params=jax.tree.map(
      lambda x: x * 1.05 if x.ndim > 1 else x, target.params), name="noisy")
  return target, noisy


PROMPTS = [[5, 6, 7, 1], [9, 1], [3, 4, 5, 6, 7, 8, 1]]


def test_nan_draft_still_gives_valid_exact_tokens(pair):
  target, _ = pair
  nan_draft = dataclasses.replace(target, params=jax.tree.map(lambda x: x * np.nan, target.params))
  plain = jaxspec.generate(target, PROMPTS, max_new_tokens=8)
  spec = jaxspec.generate(target, PROMPTS, jaxspec.Speculation(nan_draft, gamma=3), max_new_tokens=8)
  np.testing.assert_array_equal(spec.tokens, plain.tokens)  # every NaN draft token is rejected
  sampled = jaxspec.generate(target, PROMPTS, jaxspec.Speculation(nan_draft, gamma=3), jaxspec.Sampling(temperature=1.0), max_new_tokens=8)
  assert sampled.tokens.min() >= 0 and sampled.tokens.max() < target.config.vocab_size


def test_nan_target_fails_its_rows_clearly(pair):
  target, noisy = pair
  broken = dataclasses.replace(target, params=jax.tree.map(lambda x: x * np.nan, target.params))
  for kw in (dict(), dict(speculation=jaxspec.Speculation(noisy, gamma=2), sampling=jaxspec.Sampling(1.0))):
    with pytest.raises(jaxspec.NonFiniteLogitsError, match=r"rows \[0, 1, 2\]"):
      jaxspec.generate(broken, PROMPTS, max_new_tokens=6, **kw)
    out = jaxspec.generate(broken, PROMPTS, max_new_tokens=6, on_failure="mark", **kw)
    assert out.failed.all() and (out.lengths == 0).all()
  ok = jaxspec.generate(target, PROMPTS, max_new_tokens=6)
  assert not ok.failed.any()


def test_huge_max_new_tokens_is_refused_before_allocating(pair):
  target, _ = pair
  with pytest.raises(jaxspec.CacheTooLargeError, match="GiB"):
    jaxspec.generate(target, [[5, 1], [6, 1]], max_new_tokens=10**9)


def test_per_row_seeds_make_rows_independent_of_their_batch(pair):
  target, noisy = pair
  kw = dict(speculation=jaxspec.Speculation(noisy, gamma=2), sampling=jaxspec.Sampling(1.0), max_new_tokens=10)
  alone = [jaxspec.generate(target, [p], seed=[100 + i], **kw).tokens[0] for i, p in enumerate(PROMPTS)]
  together = jaxspec.generate(target, PROMPTS, seed=[100, 101, 102], **kw).tokens
  padded = jaxspec.generate(target, PROMPTS + [PROMPTS[0]] * 3, seed=[100, 101, 102, 7, 8, 9], **kw).tokens
  for i in range(3):
    np.testing.assert_array_equal(together[i], alone[i])
    np.testing.assert_array_equal(padded[i], alone[i])
  # Copies of one prompt with one shared seed still differ (the row index is folded in), as documented.
  copies = jaxspec.generate(target, [PROMPTS[0]] * 6, seed=3, **kw).tokens  # the padded call's shape: no compile
  assert len({tuple(r) for r in copies}) > 1


@pytest.mark.parametrize("inputs,message", [
    ([[5.7, 1]], "not an integer: 5.7"),
    (np.asarray([[5.0, 1.0]], np.float32), "integer token ids, got dtype float32"),
    (jnp.asarray([[5, 1]], jnp.bfloat16), "integer token ids, got dtype bfloat16"),
    (["text", [5, 1]], "row 0 is a text but other rows"),
    ([None], "row 0 must be a text or a list of token ids, got NoneType"),
    ([123], "row 0 must be a text or a list of token ids, got int"),
    ([[5, None]], "not an integer: None"),
    ([b"x"], "row 0 must be a text or a list of token ids, got bytes"),
    ({"a": [5, 1]}, "inputs must be a list of texts.*got dict"),
    ([[5, True]], "not an integer: True"),
])
def test_bad_inputs_name_the_argument(pair, inputs, message):
  target, _ = pair
  with pytest.raises(ValueError, match=message):
    jaxspec.generate(target, inputs, max_new_tokens=2)


@pytest.mark.parametrize("kwargs,message", [
    (dict(seed=None), "seed must be an integer"), (dict(seed=-1), r"seed must be an integer in \[0, 2\*\*31 - 1\]"),
    (dict(seed=2**32), "seed must be an integer in"), (dict(seed=[1, 2]), "seed has 2 entries for a batch of 1"),
    (dict(seed=[1.5]), r"seed\[0\] must be an integer"), (dict(seed="7"), "seed must be an integer or a sequence"),
    (dict(max_new_tokens=2.0), "max_new_tokens must be an integer"),
    (dict(max_new_tokens=2**63), r"max_new_tokens must be an integer in \[1, 1073741824\]"),
    (dict(on_failure="ignore"), "on_failure must be"), (dict(max_input_length=0), "max_input_length must be"),
    (dict(sampling=dict(temperature=1.0)), "sampling must be a jaxspec.Sampling"),
])
def test_bad_arguments_name_the_argument(pair, kwargs, message):
  target, noisy = pair
  with pytest.raises(jaxspec.SettingsError, match=message):
    jaxspec.generate(target, [[5, 1]], jaxspec.Speculation(noisy), max_new_tokens=kwargs.pop("max_new_tokens", 2),
                     **kwargs)


@pytest.mark.parametrize("make,message", [
    (lambda d: jaxspec.Sampling(temperature="1.0"), "temperature must be"),
    (lambda d: jaxspec.Sampling(temperature=True), "temperature must be"),
    (lambda d: jaxspec.Sampling(temperature=float("nan")), "temperature must be a finite"),
    (lambda d: jaxspec.Sampling(top_k=True), "top_k must be an integer"),
    (lambda d: jaxspec.Sampling(top_p=True), "top_p must be in"), (lambda d: jaxspec.Sampling(top_p=0), "top_p"),
    (lambda d: jaxspec.Speculation(d, gamma=True), "gamma must be an integer"),
    (lambda d: jaxspec.Speculation(d, gamma=0), "gamma must be an integer"),
    (lambda d: jaxspec.Speculation(None), "draft must be a jaxspec.Model"),
])
def test_settings_check_themselves(pair, make, message):
  """Sampling and Speculation refuse a bad value when made, with one SettingsError naming the field."""
  with pytest.raises(jaxspec.SettingsError, match=message):
    make(pair[1])


def test_not_a_model_is_a_clear_error(pair):
  target, _ = pair
  with pytest.raises(ValueError, match="jaxspec.Model"):
    jaxspec.generate("ende-target", [[5, 1]])
  with pytest.raises(ValueError, match="jaxspec.Model"):
    jaxspec.generate(target, [[5, 1]], jaxspec.Speculation("ende-draft"))
