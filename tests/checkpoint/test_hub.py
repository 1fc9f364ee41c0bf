"""Hub model ids resolved against Hugging Face caches the tests write themselves; never touches the network.

Every test runs with HF_HUB_OFFLINE=1 and with sockets refused (a connection attempt fails the test). The tests of
what an online download fetches replace `huggingface_hub.snapshot_download` by a stand-in Hub that applies the
requested patterns to a known file list.
"""

import os
import socket
import subprocess
import sys

import huggingface_hub
import jax
import numpy as np
import pytest
from huggingface_hub import constants as hub_constants
from huggingface_hub import utils as hub_utils

import jaxspec
from jaxspec.checkpoint import hub
from jaxspec.errors import CheckpointError

from conftest import write_hf_t5
from hub_cache import read_files, repo_folder, write_fake_hub_cache

try:
  from huggingface_hub.errors import IncompleteSnapshotError  # Recent versions check cached snapshots.
except ImportError:
  IncompleteSnapshotError = None

REPO = "org/tiny-t5"


@pytest.fixture(autouse=True)
def offline_env(monkeypatch, tmp_path):
  """HF_HUB_OFFLINE=1, no cache or token from the machine running the tests, and no socket connections."""
  monkeypatch.setenv("HF_HUB_OFFLINE", "1")
  monkeypatch.setenv("HF_HOME", str(tmp_path / "unused-hf-home"))
  for var in ("HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE", "HF_TOKEN", "HUGGING_FACE_HUB_TOKEN"):
    monkeypatch.delenv(var, raising=False)
  attempts = []

  def refuse(*args, **kwargs):
    attempts.append(args)
    raise OSError("network access attempted in an offline test")

  for module, attr in ((socket.socket, "connect"), (socket.socket, "connect_ex"), (socket, "create_connection"),
                       (socket, "getaddrinfo")):
    monkeypatch.setattr(module, attr, refuse)
  yield
  assert not attempts, f"network access attempted: {attempts}"


@pytest.fixture(scope="module")
def tiny_t5(tmp_path_factory) -> str:
  return write_hf_t5(str(tmp_path_factory.mktemp("tiny") / "t5"), "t5_v1_1")


@pytest.fixture
def hub_cache(monkeypatch, tmp_path) -> str:
  """An empty cache that HF_HUB_CACHE points at."""
  cache = str(tmp_path / "hub-cache")
  monkeypatch.setenv("HF_HUB_CACHE", cache)
  return cache


def test_finds_a_cached_model_by_name_with_exactly_its_files(hub_cache, tiny_t5):
  snapshot = write_fake_hub_cache(hub_cache, REPO, tiny_t5)
  directory = hub.resolve_model_dir(REPO)
  assert os.path.samefile(directory, snapshot)
  assert os.path.dirname(directory) == os.path.join(repo_folder(hub_cache, REPO), "snapshots")
  files = read_files(directory)
  assert files == read_files(tiny_t5)
  assert {"config.json", "model.safetensors"} <= set(files)


def test_revisions_by_branch_and_by_commit_hash(hub_cache, tiny_t5):
  files = read_files(tiny_t5)
  main = write_fake_hub_cache(hub_cache, REPO, files)
  v2_files = {**files, "config.json": files["config.json"].replace(b"{", b'{"revision_marker": 2, ', 1)}
  v2 = write_fake_hub_cache(hub_cache, REPO, v2_files, revision="v2")
  unnamed = write_fake_hub_cache(hub_cache, REPO, {**files, "extra.json": b"{}"}, revision=None)
  assert len({main, v2, unnamed}) == 3
  assert hub.resolve_model_dir(REPO) == main
  assert hub.resolve_model_dir(REPO, revision="main") == main
  assert hub.resolve_model_dir(REPO, revision="v2") == v2
  assert read_files(hub.resolve_model_dir(REPO, revision="v2")) == v2_files
  for snapshot in (main, v2, unnamed):
    assert hub.resolve_model_dir(REPO, revision=os.path.basename(snapshot)) == snapshot


@pytest.mark.parametrize("variable", ["HF_HOME", "HF_HUB_CACHE"])
def test_honours_cache_variables_set_after_import(monkeypatch, tmp_path, tiny_t5, variable):
  if variable == "HF_HOME":  # The cache is then $HF_HOME/hub.
    monkeypatch.setenv("HF_HOME", str(tmp_path / "home"))
    cache = str(tmp_path / "home" / "hub")
  else:  # HF_HUB_CACHE wins over HF_HOME.
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "cache"))
    cache = str(tmp_path / "cache")
  # huggingface_hub read its constants at import, before these variables were set.
  assert os.path.abspath(hub_constants.HF_HUB_CACHE) != os.path.abspath(cache)
  snapshot = write_fake_hub_cache(cache, REPO, tiny_t5)
  assert hub.hub_cache_dir() == cache
  assert hub.resolve_model_dir(REPO) == snapshot


def test_cache_dir_precedence_matches_huggingface_hub(monkeypatch, tmp_path):
  monkeypatch.delenv("HF_HOME")
  monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
  assert hub.hub_cache_dir() == str(tmp_path / "xdg" / "huggingface" / "hub")
  monkeypatch.setenv("HF_HOME", str(tmp_path / "home"))
  assert hub.hub_cache_dir() == str(tmp_path / "home" / "hub")
  monkeypatch.setenv("HUGGINGFACE_HUB_CACHE", str(tmp_path / "legacy"))
  assert hub.hub_cache_dir() == str(tmp_path / "legacy")
  monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "new"))
  assert hub.hub_cache_dir() == str(tmp_path / "new")


def test_huggingface_hub_scans_the_fake_cache_as_valid(hub_cache, tiny_t5):
  main = write_fake_hub_cache(hub_cache, REPO, tiny_t5)
  v2 = write_fake_hub_cache(hub_cache, REPO, {"config.json": b"{}"}, revision="v2")
  info = huggingface_hub.scan_cache_dir(hub_cache)
  assert info.warnings == []
  (repo,) = info.repos
  assert (repo.repo_id, repo.repo_type) == (REPO, "model")
  revisions = {r.commit_hash: r for r in repo.revisions}
  assert set(revisions) == {os.path.basename(main), os.path.basename(v2)}
  assert revisions[os.path.basename(main)].refs == {"main"}
  assert revisions[os.path.basename(v2)].refs == {"v2"}
  assert {f.file_name for f in revisions[os.path.basename(main)].files} == set(os.listdir(tiny_t5))
  assert huggingface_hub.try_to_load_from_cache(REPO, "config.json", cache_dir=hub_cache) == os.path.join(
      main, "config.json")
  assert huggingface_hub.try_to_load_from_cache(REPO, "config.json", cache_dir=hub_cache, revision="v2") == (
      os.path.join(v2, "config.json"))


def test_loads_a_cached_hub_model_like_the_embedded_one(hub_cache):
  embedded = os.path.join(os.path.dirname(jaxspec.__file__), "embedded", "ende-draft")
  write_fake_hub_cache(hub_cache, "jaxspec/ende-draft", embedded)
  from_hub = jaxspec.load(hub.resolve_model_dir("jaxspec/ende-draft"))
  reference = jaxspec.load("ende-draft")
  assert from_hub.config == reference.config
  assert jax.tree.structure(from_hub.params) == jax.tree.structure(reference.params)
  for a, b in zip(jax.tree.leaves(from_hub.params), jax.tree.leaves(reference.params)):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
  text = "The house is wonderful."
  assert from_hub.tokenizer is not None and from_hub.tokenizer.encode(text) == reference.tokenizer.encode(text)


def test_fresh_process_with_the_environment_set_before_import(tmp_path, tiny_t5):
  """As a user runs it: HF_HOME and HF_HUB_OFFLINE exported, nothing of huggingface_hub imported yet."""
  snapshot = write_fake_hub_cache(str(tmp_path / "home" / "hub"), REPO, tiny_t5)
  env = {**os.environ, "HF_HOME": str(tmp_path / "home"), "HF_HUB_OFFLINE": "1"}
  code = f"from jaxspec.checkpoint import hub; print(hub.resolve_model_dir({REPO!r}))"
  result = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=False)
  assert result.returncode == 0, result.stderr
  assert result.stdout.strip() == snapshot


def test_missing_name_offline_says_how_to_fix_it(hub_cache):
  with pytest.raises(CheckpointError) as info:
    hub.resolve_model_dir("google/flan-t5-small")
  message = str(info.value)
  assert "google/flan-t5-small is not in the Hugging Face cache at" in message and hub_cache in message
  assert "HF_HUB_OFFLINE is set: download it once with network access" in message
  assert info.value.__cause__ is None and info.value.__suppress_context__  # One short traceback: ours.


@pytest.mark.parametrize("revision", ["v9", "f" * 40])
def test_missing_revision_offline_lists_the_cached_ones(hub_cache, tiny_t5, revision):
  commit = os.path.basename(write_fake_hub_cache(hub_cache, REPO, tiny_t5))
  with pytest.raises(CheckpointError, match="HF_HUB_OFFLINE is set") as info:
    hub.resolve_model_dir(REPO, revision=revision)
  message = str(info.value)
  assert f"revision {revision!r} of {REPO} is not in the Hugging Face cache" in message
  assert f"cached: main, {commit}" in message


@pytest.mark.skipif(IncompleteSnapshotError is None,
                    reason="this huggingface_hub version caches no file listings to check snapshots against")
def test_partial_download_is_refused_but_unneeded_files_are_not_required(hub_cache, tiny_t5):
  files = read_files(tiny_t5)
  # The repo also holds pytorch_model.bin and a README: not needed beside model.safetensors, never fetched.
  write_fake_hub_cache(hub_cache, REPO, files, tree_listing=[*files, "pytorch_model.bin", "README.md"])
  assert read_files(hub.resolve_model_dir(REPO)) == files
  # A needed file that the listing has but the cache lacks: an interrupted download.
  write_fake_hub_cache(hub_cache, REPO, files, revision="v2", commit="a" * 40,
                       tree_listing=[*files, "tokenizer.json"])
  with pytest.raises(CheckpointError, match="lacks files that the repo lists"):
    hub.resolve_model_dir(REPO, revision="v2")


# What an online download fetches, against a stand-in Hub (no network).
# {repo: (its files, the ones jaxspec fetches)}.
REPOS = {
    # Sharded safetensors beside a consolidated copy and .bin shards: only the HF safetensors shards.
    "mistral": (["config.json", "generation_config.json", "model-00001-of-00002.safetensors",
                 "model-00002-of-00002.safetensors", "model.safetensors.index.json", "consolidated.safetensors",
                 "pytorch_model-00001-of-00002.bin", "pytorch_model-00002-of-00002.bin",
                 "pytorch_model.bin.index.json", "tokenizer.json", "tokenizer_config.json", "tokenizer.model",
                 "special_tokens_map.json", "README.md", ".gitattributes", "params.json"],
                {"config.json", "generation_config.json", "model-00001-of-00002.safetensors",
                 "model-00002-of-00002.safetensors", "model.safetensors.index.json", "tokenizer.json",
                 "tokenizer_config.json", "tokenizer.model", "special_tokens_map.json"}),
    "qwen": (["config.json", "generation_config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json",
              "vocab.json", "merges.txt", "LICENSE", "onnx/model.onnx"],
             {"config.json", "generation_config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json",
              "vocab.json", "merges.txt"}),
    # No safetensors: pytorch_model.bin, fetched by a second call.
    "old_t5": (["config.json", "pytorch_model.bin", "spiece.model", "tokenizer.json", "flax_model.msgpack",
                "tf_model.h5", "rust_model.ot"],
               {"config.json", "pytorch_model.bin", "spiece.model", "tokenizer.json"}),
}


def _stand_in_hub(monkeypatch, repo_files: list[str], error: Exception | None = None) -> list[dict]:
  """Replaces snapshot_download by a Hub holding `repo_files` (or raising `error`); returns its calls."""
  monkeypatch.delenv("HF_HUB_OFFLINE")
  monkeypatch.setattr(hub_constants, "HF_HUB_OFFLINE", False)
  calls = []

  def snapshot_download(repo_id, **kwargs):
    calls.append(kwargs)
    if error is not None:
      raise error
    wanted = hub_utils.filter_repo_objects(repo_files, allow_patterns=kwargs["allow_patterns"])
    return write_fake_hub_cache(kwargs["cache_dir"], repo_id, {p: p.encode() for p in wanted}, commit="c" * 40)

  monkeypatch.setattr(huggingface_hub, "snapshot_download", snapshot_download)
  return calls


@pytest.mark.parametrize("repo", sorted(REPOS))
def test_online_download_fetches_only_the_files_jaxspec_reads(monkeypatch, hub_cache, repo):
  repo_files, wanted = REPOS[repo]
  calls = _stand_in_hub(monkeypatch, repo_files)
  directory = hub.resolve_model_dir("org/" + repo, revision="v1.0", token="hf_secret")
  assert set(read_files(directory)) == wanted
  assert len(calls) == (2 if repo == "old_t5" else 1)  # pytorch_model.bin only when there are no safetensors.
  for call in calls:
    assert (call["revision"], call["token"], call["cache_dir"], call["local_files_only"]) == (
        "v1.0", "hf_secret", hub_cache, False)


def _hub_error(cls, message: str) -> Exception:
  """An instance of huggingface_hub's error `cls` without the HTTP response its constructor wants."""
  error = cls.__new__(cls)
  Exception.__init__(error, message)
  return error


# (huggingface_hub error, token, message, whether the hub error is kept as the cause: not when ours says all).
@pytest.mark.parametrize("kind, token, expected, chained", [
    ("GatedRepoError", None, "is a gated model: accept its conditions on https://huggingface.co/org/m .*HF_TOKEN",
     False),
    ("GatedRepoError", "hf_x", "is a gated model: .*the token given has no access", False),
    ("RepositoryNotFoundError", None, "'org/m' is not a local directory, an embedded model or a model on the Hug",
     False),
    ("RevisionNotFoundError", None, "org/m has no revision 'v1' on the Hugging Face Hub", False),
    ("LocalEntryNotFoundError", None, "not in the Hugging Face cache .*the Hub cannot be reached: .*500", True),
    ("HfHubHTTPError", None, r"Downloading org/m \(revision 'v1'\) from the Hugging Face Hub failed: 500", True),
    ("OSError", None, "into .* failed: OSError: No space left on device", True),
])
def test_online_failures_are_explained(monkeypatch, hub_cache, kind, token, expected, chained):
  cls = OSError if kind == "OSError" else getattr(hub_utils, kind)
  message = "No space left on device" if kind == "OSError" else "500 Server Error (from the Hub)"
  _stand_in_hub(monkeypatch, [], error=_hub_error(cls, message))
  with pytest.raises(CheckpointError, match=expected) as info:
    hub.resolve_model_dir("org/m", revision="v1", token=token)
  assert type(info.value.__cause__) is (cls if chained else type(None))
  assert "hf_x" not in str(info.value)


def test_missing_huggingface_hub_says_how_to_install_it(monkeypatch):
  monkeypatch.setitem(sys.modules, "huggingface_hub", None)
  with pytest.raises(CheckpointError, match=r"needs the huggingface_hub package \(pip install huggingface_hub"):
    hub.resolve_model_dir(REPO)


def test_is_hub_name(tmp_path):
  for name in ["google/flan-t5-small", "Qwen/Qwen2.5-0.5B", "gpt2", "t5-small", "org_1/m.v2"]:
    assert hub.is_hub_name(name), name
  (tmp_path / "model").mkdir()
  for name in ["", "./model", "/abs/model", "~/model", "a/b/c", "org--x/m", "org/m.git", "org/a..b", "org/m-",
               "org/ m", str(tmp_path / "model"), None]:
    assert not hub.is_hub_name(name), name
  with pytest.raises(CheckpointError, match="not a Hugging Face Hub model id"):
    hub.resolve_model_dir("a/b/c")


def test_jaxspec_load_takes_hub_names(hub_cache):
  embedded = os.path.join(os.path.dirname(jaxspec.__file__), "embedded", "ende-draft")
  write_fake_hub_cache(hub_cache, "jaxspec/ende-draft", embedded)
  model = jaxspec.load("jaxspec/ende-draft")
  assert model.name == "jaxspec/ende-draft"
  with pytest.raises(jaxspec.CheckpointError, match="not in the Hugging Face cache"):
    jaxspec.load("jaxspec/not-cached")
  with pytest.raises(jaxspec.CheckpointError, match="revision= applies to Hugging Face Hub ids"):
    jaxspec.load(embedded, revision="main")
