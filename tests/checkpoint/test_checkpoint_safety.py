"""Nothing lost, round two (issue 24): checkpoints and models.

Saves never remove what jaxspec did not write (the working directory, a project folder, a symlink's target's
siblings), loads never read outside the model directory or run its code, and bad weights, configs and arguments
end in one `JaxspecError` naming the file and field. Each test failed on the code before its fix.
"""

import builtins
import json
import math
import os
import shutil

import jax.numpy as jnp
import numpy as np
import pytest

import jaxspec
from jaxspec.checkpoint.gguf import convert_gguf
from jaxspec.checkpoint.safetensors_io import SafetensorsFile, save_file
from jaxspec.errors import JaxspecError

from conftest import write_hf_t5
from decoder_only_models import write_hf_decoder
from script_helpers import assert_one_line_error, run_scripts


@pytest.fixture(scope="module")
def t5(tmp_path_factory):
  """(directory, model) of a tiny random T5 1.1 (untied lm_head), no tokenizer."""
  d = write_hf_t5(str(tmp_path_factory.mktemp("safety") / "t5"), "t5_v1_1", d_model=16)
  return d, jaxspec.load(d, dtype=jnp.float32)


@pytest.fixture(scope="module")
def llama(tmp_path_factory):
  """Directory of a tiny random Llama 2 (untied lm_head) with a chat-template tokenizer."""
  return write_hf_decoder(str(tmp_path_factory.mktemp("safety") / "llama"), "llama2")


def _copy(src, dst) -> str:
  shutil.copytree(src, dst)
  return str(dst)


def _staging_left(parent) -> list[str]:
  return [n for n in os.listdir(parent) if ".staging-" in n]


def _edit_json(path, fn) -> None:
  with open(path) as f:
    data = json.load(f)
  fn(data)
  with open(path, "w") as f:
    json.dump(data, f)


def _edit_tensors(directory, fn) -> None:
  path = os.path.join(directory, "model.safetensors")
  f = SafetensorsFile(path)
  tensors = {k: np.array(f.get(k)) for k in f.keys()}
  fn(tensors)
  save_file(tensors, path, metadata={"format": "pt"})


# --- 1: the working directory, its ancestors and the home directory are never a destination ---

def test_save_refuses_the_working_directory_and_home(t5, tmp_path, monkeypatch):
  _, model = t5
  work = tmp_path / "work"
  work.mkdir()
  monkeypatch.chdir(work)
  home = tmp_path / "home"
  home.mkdir()
  monkeypatch.setenv("HOME", str(home))
  for dest in ("", ".", str(work), str(home), "/"):
    with pytest.raises(jaxspec.CheckpointError, match="working directory|home directory|empty"):
      jaxspec.save(model, dest)
  assert os.path.isdir(work) and os.getcwd() == str(work) and os.path.isdir(home)
  assert _staging_left(tmp_path) == []


def test_convert_gguf_refuses_an_empty_output_dir(tmp_path, monkeypatch):
  monkeypatch.chdir(tmp_path)
  with pytest.raises(jaxspec.CheckpointError, match="empty"):
    convert_gguf(str(tmp_path / "absent.gguf"), "")
  assert os.getcwd() == str(tmp_path)


GGUF_ERRORS = [
    (["--gguf=/nonexistent.gguf", "--output_dir="], "output_dir"),
    (["--gguf=/nonexistent.gguf", "--output_dir=/tmp/jaxspec-never-written"], "/nonexistent.gguf"),
    (["--gguf=/nonexistent.gguf", "--output_dir=/tmp/x", "--dtype=float64"], "--dtype"),
]


@pytest.fixture(scope="module")
def gguf_error_runs():
  """Every GGUF_ERRORS case's run, as many at a time as there are CPUs."""
  return run_scripts([["launch/convert_gguf.py"] + args for args, _ in GGUF_ERRORS])


@pytest.mark.parametrize("args, needle", GGUF_ERRORS)
def test_convert_gguf_script_ends_in_one_line(args, needle, gguf_error_runs):
  res = gguf_error_runs[GGUF_ERRORS.index((args, needle))]
  assert_one_line_error(res, needle)
  assert len(res.stderr.strip().splitlines()) <= 2, res.stderr  # The error (and absl's hint for a bad flag).


# --- 2: only what jaxspec wrote is replaced ---

def test_save_refuses_a_project_folder_that_holds_a_config(t5, tmp_path):
  _, model = t5
  project = tmp_path / "project"
  (project / "src").mkdir(parents=True)
  (project / "src" / "main.py").write_text("print('mine')")
  (project / "notes.md").write_text("notes")
  (project / "config.json").write_text("{}")
  with pytest.raises(jaxspec.CheckpointError, match=r"project.*not a model checkpoint.*notes\.md.*src"):
    jaxspec.save(model, str(project))
  assert (project / "src" / "main.py").read_text() == "print('mine')" and (project / "notes.md").exists()
  assert _staging_left(tmp_path) == []
  saved = tmp_path / "saved"  # What jaxspec wrote is still replaced, in both formats.
  jaxspec.save(model, str(saved), format="hf")
  jaxspec.save(model, str(saved), format="orbax")
  jaxspec.save(model, str(saved), format="hf")
  assert sorted(os.listdir(saved)) == ["config.json", "generation_config.json", "model.safetensors"]


# --- 6: every file a model directory names stays inside it ---

@pytest.mark.parametrize("where", ["relative", "absolute"])
def test_shard_index_cannot_point_outside_the_directory(t5, tmp_path, where):
  d = _copy(t5[0], tmp_path / "m")
  outside = tmp_path / "elsewhere"
  outside.mkdir()
  shutil.move(os.path.join(d, "model.safetensors"), outside / "x.safetensors")
  shard = "../elsewhere/x.safetensors" if where == "relative" else str(outside / "x.safetensors")
  names = SafetensorsFile(str(outside / "x.safetensors")).keys()
  with open(os.path.join(d, "model.safetensors.index.json"), "w") as f:
    json.dump({"weight_map": {n: shard for n in names}}, f)
  with pytest.raises(jaxspec.CheckpointError, match=r"model\.safetensors\.index\.json.*outside"):
    jaxspec.load(d)


def test_tokenizer_config_cannot_name_files_outside_the_directory(llama, tmp_path):
  d = _copy(llama, tmp_path / "m")
  shutil.copy(os.path.join(d, "tokenizer.json"), tmp_path / "other.json")
  _edit_json(os.path.join(d, "tokenizer_config.json"),
             lambda c: c.update(tokenizer_file=str(tmp_path / "other.json")))
  with pytest.raises(jaxspec.CheckpointError, match=r"tokenizer_config\.json.*tokenizer_file.*outside"):
    jaxspec.load(d)


# --- 7: code in a checkpoint is never run, and nobody is asked ---

def test_tokenizer_remote_code_is_never_run(llama, tmp_path, monkeypatch):
  d = _copy(llama, tmp_path / "m")
  ran = tmp_path / "ran"
  (tmp_path / "m" / "evil.py").write_text(
      f"open({str(ran)!r}, 'w').write('ran')\n"
      "from transformers import PreTrainedTokenizerFast\n"
      "class EvilTokenizer(PreTrainedTokenizerFast):\n  pass\n")

  def edit(c):
    c.pop("tokenizer_class", None)  # No local class to fall back on: transformers would ask.
    c["auto_map"] = {"AutoTokenizer": [None, "evil.EvilTokenizer"]}
  _edit_json(os.path.join(d, "tokenizer_config.json"), edit)
  asked = []
  monkeypatch.setattr(builtins, "input", lambda *a: asked.append(a) or "y")
  try:
    jaxspec.load(d)
  except jaxspec.CheckpointError as e:
    assert "code" in str(e)
  assert asked == [] and not ran.exists()


# --- 8: a missing tensor is an error, never a silent tie ---

def test_missing_lm_head_of_an_untied_model_is_an_error(llama, tmp_path):
  d = _copy(llama, tmp_path / "m")
  _edit_tensors(d, lambda t: t.pop("lm_head.weight"))
  with pytest.raises(jaxspec.CheckpointError, match=r"model\.safetensors.*'lm_head\.weight'"):
    jaxspec.load(d)


def test_missing_lm_head_of_an_untied_t5_is_an_error(t5, tmp_path):
  d = _copy(t5[0], tmp_path / "m")
  _edit_tensors(d, lambda t: t.pop("lm_head.weight"))
  with pytest.raises(jaxspec.CheckpointError, match=r"model\.safetensors.*'lm_head\.weight'"):
    jaxspec.load(d)


# --- 9: float16 overflow is caught after the cast ---

def test_float16_overflow_is_refused_naming_the_value(t5, tmp_path):
  d = _copy(t5[0], tmp_path / "m")
  _edit_tensors(d, lambda t: t["shared.weight"].__setitem__((3, 5), 1e5))
  with pytest.raises(jaxspec.CheckpointError, match=r"model\.safetensors: tensor 'shared\.weight'.*100000.*float16"):
    jaxspec.load(d, dtype=jnp.float16)
  assert jaxspec.load(d, dtype=jnp.float32).params["shared"]["embedding"][3, 5] == 1e5
  assert np.isfinite(np.asarray(jaxspec.load(d, dtype=jnp.bfloat16).params["shared"]["embedding"],
                                np.float32)).all()


# --- 13: a symlinked destination is saved through; no staging copy is ever left ---

def test_save_through_a_symlink_saves_into_its_target(t5, tmp_path):
  _, model = t5
  real = tmp_path / "store" / "model"
  jaxspec.save(model, str(real), format="hf")
  (tmp_path / "links").mkdir()
  link = tmp_path / "links" / "current"
  link.symlink_to(real, target_is_directory=True)
  jaxspec.save(model, str(link), format="orbax")
  assert link.is_symlink() and os.path.exists(real / "jaxspec.json")
  assert jaxspec.load(str(link)).num_params == model.num_params
  assert _staging_left(tmp_path / "links") == [] and _staging_left(tmp_path / "store") == []
  foreign = tmp_path / "store" / "photos"
  foreign.mkdir()
  (foreign / "cat.jpg").write_text("meow")
  (tmp_path / "links" / "photos").symlink_to(foreign, target_is_directory=True)
  with pytest.raises(jaxspec.CheckpointError, match="cat.jpg"):
    jaxspec.save(model, str(tmp_path / "links" / "photos"))
  assert (foreign / "cat.jpg").read_text() == "meow"
  assert _staging_left(tmp_path / "links") == [] and _staging_left(tmp_path / "store") == []


# --- 10: one clear JaxspecError for a wrong argument ---

def _apply_template_to_int(llama):
  return jaxspec.load(llama).tokenizer.apply_chat_template(5)


@pytest.mark.parametrize("call, needle", [
    (lambda t5, llama, tmp: jaxspec.save("not a model", str(tmp / "out")), "jaxspec.Model"),
    (lambda t5, llama, tmp: jaxspec.save(t5[1], str(tmp / "afile" / "sub")), "afile"),
    (lambda t5, llama, tmp: jaxspec.make_mesh(devices=["x"]), "device"),
    (lambda t5, llama, tmp: jaxspec.load(t5[0], mesh="x"), "mesh"),
    (lambda t5, llama, tmp: _apply_template_to_int(llama), "messages"),
])
def test_wrong_arguments_are_one_jaxspec_error(t5, llama, tmp_path, call, needle):
  (tmp_path / "afile").write_text("x")
  with pytest.raises(JaxspecError, match=needle):
    call(t5, llama, tmp_path)
  assert _staging_left(tmp_path) == [] and (tmp_path / "afile").read_text() == "x"


# --- 14: norm epsilons and RoPE bases that make NaN are refused at load ---

@pytest.mark.parametrize("field, value", [
    ("rms_norm_eps", 0.0), ("rms_norm_eps", -1e-6), ("rms_norm_eps", math.nan), ("rms_norm_eps", math.inf),
    ("rope_theta", 0.0), ("rope_theta", -10.0), ("rope_theta", math.inf), ("rope_theta", math.nan),
])
def test_bad_norm_eps_and_rope_theta_are_refused(llama, tmp_path, field, value):
  d = _copy(llama, tmp_path / "m")

  def edit(c):
    c[field] = value
    if field == "rope_theta" and "rope_parameters" in c:  # transformers 5 writes the base there.
      c["rope_parameters"]["rope_theta"] = value
  _edit_json(os.path.join(d, "config.json"), edit)
  with pytest.raises(jaxspec.CheckpointError, match=rf"config\.json.*{field}"):
    jaxspec.load(d)


@pytest.mark.parametrize("value", [0.0, math.inf, math.nan])
def test_bad_t5_layer_norm_epsilon_is_refused(t5, tmp_path, value):
  d = _copy(t5[0], tmp_path / "m")
  _edit_json(os.path.join(d, "config.json"), lambda c: c.update(layer_norm_epsilon=value))
  with pytest.raises(jaxspec.CheckpointError, match=r"config\.json.*layer_norm_epsilon"):
    jaxspec.load(d)
