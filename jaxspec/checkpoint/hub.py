"""Hugging Face Hub model ids ("google/flan-t5-small", "Qwen/Qwen2.5-0.5B") -> a local directory of model files.

`resolve_model_dir` fetches only the files jaxspec reads (config.json, generation_config.json, safetensors weights
or their index and shards, tokenizer files; pytorch_model.bin only for repos without safetensors) with
`huggingface_hub.snapshot_download`, into the standard Hugging Face cache that transformers shares, and returns
the snapshot directory (`<cache>/models--ORG--NAME/snapshots/<commit>/`).

Environment, read at every call rather than when huggingface_hub was imported (see `hub_cache_dir`):
  HF_HUB_CACHE (or the legacy HUGGINGFACE_HUB_CACHE): the cache directory; else $HF_HOME/hub; else
    $XDG_CACHE_HOME/huggingface/hub; else ~/.cache/huggingface/hub.
  HF_HUB_OFFLINE=1 (or TRANSFORMERS_OFFLINE=1): use the cache only; no network call is made.
  HF_TOKEN: the token for gated and private repos when `token` is None (huggingface_hub reads it per call).
Every failure is a `CheckpointError` saying what to do; the huggingface_hub exception is chained as its cause
only when it adds something (a network or HTTP failure), so the common cases print one short traceback.
"""

from __future__ import annotations

import os
import re

from jaxspec.errors import CheckpointError

# Files fetched for every model: configs and every tokenizer format transformers' AutoTokenizer reads.
_BASE_FILES = ("config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json",
               "special_tokens_map.json", "spiece.model", "tokenizer.model", "vocab.json", "merges.txt",
               "added_tokens.json", "chat_template.jinja", "chat_template.json")
# The weights jaxspec/checkpoint/hf_dir.py reads: a single file, or the shards that transformers names
# model-00001-of-00002.safetensors with their index. Not "*.safetensors": Mistral repos also hold a
# consolidated.safetensors copy of every weight, and other repos hold adapters or fp16 variants.
_SAFETENSORS = ("model.safetensors", "model.safetensors.index.json", "model-*-of-*.safetensors")
_PYTORCH_BIN = ("pytorch_model.bin", "pytorch_model.bin.index.json", "pytorch_model-*-of-*.bin")

_SEGMENT = r"\w(?:[\w.-]{0,94}\w)?"  # What huggingface_hub's validate_repo_id accepts.
_REPO_ID = re.compile(rf"(?:{_SEGMENT}/)?{_SEGMENT}", re.ASCII)
_TRUE = {"1", "ON", "YES", "TRUE"}


def is_hub_name(s: str) -> bool:
  """Whether `s` reads as a Hub model id ("org/name" or "name") and is not an existing local path.

  The caller checks embedded model names first: "ende-draft" is also a valid Hub id.
  """
  return (isinstance(s, str) and _REPO_ID.fullmatch(s) is not None and "--" not in s and ".." not in s
          and not s.endswith(".git") and not os.path.exists(s))


def hub_cache_dir() -> str:
  """The Hub cache directory, from the environment as it is now.

  huggingface_hub computes `constants.HF_HUB_CACHE` once, when it is first imported, so setting HF_HOME or
  HF_HUB_CACHE later (in a notebook, or with pytest's monkeypatch) would not reach it. Reading the variables here,
  with huggingface_hub's precedence, and passing `cache_dir=` explicitly makes every call honour the current
  environment without reloading huggingface_hub's modules (which other imported modules hold references into).
  """
  env = os.environ
  home = env.get("HF_HOME") or os.path.join(env.get("XDG_CACHE_HOME") or os.path.join("~", ".cache"), "huggingface")
  path = env.get("HF_HUB_CACHE") or env.get("HUGGINGFACE_HUB_CACHE") or os.path.join(home, "hub")
  return os.path.expandvars(os.path.expanduser(path))


def _offline(hub_constants) -> bool:
  """HF_HUB_OFFLINE as set now, or as huggingface_hub read it at import (its HTTP layer then refuses anyway)."""
  value = os.environ.get("HF_HUB_OFFLINE") or os.environ.get("TRANSFORMERS_OFFLINE") or ""
  return value.upper() in _TRUE or bool(hub_constants.HF_HUB_OFFLINE)


def resolve_model_dir(name: str, revision: str | None = None, token: str | bool | None = None) -> str:
  """Downloads (or finds in the cache) the files of Hub model `name` that jaxspec needs; returns their directory.

  Args:
    name: a Hub model id, "org/name" or "name" (see `is_hub_name`).
    revision: a branch, tag or full commit hash; None is the default branch ("main").
    token: for gated and private repos: a token string, True for the stored one (`hf auth login`), False for
      none; None uses HF_TOKEN or the stored token when there is one.
  Returns:
    The snapshot directory: config.json, weights and tokenizer files (symlinks into the cache's blobs).
  Raises:
    CheckpointError: not a Hub id; huggingface_hub missing; not cached while offline; gated without access;
      unknown repo or revision; network or disk failure.
  """
  if not is_hub_name(name):
    raise CheckpointError(f"{name!r} is not a Hugging Face Hub model id ('org/name' or 'name').")
  try:
    import huggingface_hub
    from huggingface_hub import constants as hub_constants  # A submodule: not loaded by the package import.
  except ImportError:
    raise CheckpointError(f"Loading {name!r} from the Hugging Face Hub needs the huggingface_hub package "
                          f"(pip install huggingface_hub; transformers also installs it).") from None
  cache_dir, offline = hub_cache_dir(), _offline(hub_constants)

  def fetch(patterns: tuple[str, ...]) -> str:
    return huggingface_hub.snapshot_download(name, revision=revision, cache_dir=cache_dir, token=token,
                                             local_files_only=offline, allow_patterns=list(patterns))

  try:
    directory = fetch(_BASE_FILES + _SAFETENSORS)
    if not any(os.path.exists(os.path.join(directory, f)) for f in _SAFETENSORS[:2]):
      # No model.safetensors nor index in the repo (or, offline, in the cache): older repos have only
      # pytorch_model.bin. Online this costs a second (small) metadata request, for those repos only.
      directory = fetch(_PYTORCH_BIN)
  except Exception as e:  # huggingface_hub, requests/httpx and the OS raise many types; each is explained.
    message, complete = _explain(e, name, revision, token, cache_dir, offline)
    raise CheckpointError(message) from (None if complete else e)
  return directory


def _cached_revisions(repo_dir: str) -> list[str]:
  """Branch and tag names (refs/) and commit hashes (snapshots/) in the cache folder of one repo."""
  found = []
  for sub in ("refs", "snapshots"):
    top = os.path.join(repo_dir, sub)
    if os.path.isdir(top):
      found += sorted(n for n in os.listdir(top) if not n.startswith("."))
  return found


def _explain(e: Exception, name: str, revision: str | None, token: str | bool | None, cache_dir: str,
             offline: bool) -> tuple[str, bool]:
  """(What went wrong with `name` and what to do about it, whether that says all so `e` need not be chained)."""
  from huggingface_hub import utils as hub_errors  # Old and new versions export the error types here.
  try:
    from huggingface_hub.errors import IncompleteSnapshotError  # Newer versions check cached snapshots.
  except ImportError:
    IncompleteSnapshotError = ()  # pylint: disable=invalid-name
  at = f"{name} (revision {revision!r})" if revision else name
  repo_dir = os.path.join(cache_dir, "models--" + name.replace("/", "--"))
  if isinstance(e, hub_errors.GatedRepoError):  # Before RepositoryNotFoundError: it is a subclass.
    how = ("the token given has no access to it" if token else
           "pass token=... to jaxspec.load, set HF_TOKEN, or run `hf auth login`")
    return (f"{name} is a gated model: accept its conditions on https://huggingface.co/{name} with your account; "
            f"{how}.", True)
  if isinstance(e, hub_errors.RepositoryNotFoundError):
    return (f"{name!r} is not a local directory, an embedded model or a model on the Hugging Face Hub (a private "
            f"repo also needs token=... or HF_TOKEN).", True)
  if isinstance(e, hub_errors.RevisionNotFoundError):
    return (f"{name} has no revision {revision!r} on the Hugging Face Hub (expected a branch, a tag or a full "
            f"commit hash).", True)
  if isinstance(e, IncompleteSnapshotError):
    return (f"The cached copy of {at} at {cache_dir} lacks files that the repo lists, and the Hub cannot be "
            f"reached: download it again with network access. ({e})", True)
  if isinstance(e, hub_errors.LocalEntryNotFoundError):
    if not os.path.isdir(repo_dir):
      where = f"{name} is not in the Hugging Face cache at {cache_dir} (nor a local directory)"
    else:
      cached = ", ".join(_cached_revisions(repo_dir)) or "none"
      where = (f"revision {revision or 'main'!r} of {name} is not in the Hugging Face cache at {cache_dir} "
               f"(cached: {cached})")
    if offline:
      return (f"{where} and HF_HUB_OFFLINE is set: download it once with network access (or unset "
              f"HF_HUB_OFFLINE).", True)
    return f"{where}, and the Hub cannot be reached: check the network connection. ({e})", False
  if isinstance(e, hub_errors.HfHubHTTPError):
    return f"Downloading {at} from the Hugging Face Hub failed: {e}", False
  return f"Downloading {at} from the Hugging Face Hub into {cache_dir} failed: {type(e).__name__}: {e}", False
