"""Writes Hugging Face Hub caches laid out as huggingface_hub writes them, so tests run offline against them.

  <cache_dir>/models--ORG--NAME/
    blobs/<sha256 of the contents>        one file per distinct contents
    refs/<branch or tag>                  the commit hash it points at (40 hex digits, no newline)
    snapshots/<commit>/<path>             relative symlinks to ../../blobs/<sha256>
    trees/<commit>.json                   optional: the repo's full file listing, which recent huggingface_hub
                                          versions cache and check offline snapshots against

`huggingface_hub.scan_cache_dir(cache_dir)` reads such a cache without warnings, and
`snapshot_download(repo_id, cache_dir=..., local_files_only=True)` returns its snapshot directory.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Iterable, Mapping


def repo_folder(cache_dir: str, repo_id: str) -> str:
  """<cache_dir>/models--ORG--NAME, huggingface_hub's folder for model repo `repo_id`."""
  return os.path.join(cache_dir, "models--" + repo_id.replace("/", "--"))


def read_files(directory: str) -> dict[str, bytes]:
  """{relative path: contents} of every file under `directory` (symlinks followed; '/' separators)."""
  out = {}
  for root, _, names in os.walk(directory):
    for n in names:
      path = os.path.join(root, n)
      with open(path, "rb") as f:
        out[os.path.relpath(path, directory).replace(os.sep, "/")] = f.read()
  return out


def write_fake_hub_cache(cache_dir: str, repo_id: str, files: Mapping[str, bytes] | str,
                         revision: str | None = "main", commit: str | None = None,
                         tree_listing: Iterable[str] | None = None) -> str:
  """Adds one commit of model repo `repo_id` to the Hub cache at `cache_dir`; returns its snapshot directory.

  Args:
    files: {path in the repo: contents}, or a directory whose files (recursively) are copied.
    revision: the branch or tag written in refs/ to point at the commit (an existing ref is moved); None writes
      no ref, so only the commit hash finds the snapshot.
    commit: the 40-hex commit hash; None derives one from the files, so different contents give different commits.
    tree_listing: paths the repo holds at this commit, cached in trees/<commit>.json (paths not in `files` make
      the snapshot an incomplete download); None writes no listing, as older huggingface_hub
      versions did.
  Calling it again for the same repo adds a commit beside the others (blobs are shared), or with the same
  `commit` adds files to that snapshot.
  """
  contents = read_files(files) if isinstance(files, str) else dict(files)
  digests = {path: hashlib.sha256(data).hexdigest() for path, data in contents.items()}
  if commit is None:
    commit = hashlib.sha1(json.dumps(sorted(digests.items())).encode()).hexdigest()
  if len(commit) != 40 or any(c not in "0123456789abcdef" for c in commit):
    raise ValueError(f"commit must be 40 lowercase hex digits, got {commit!r}.")
  repo = repo_folder(cache_dir, repo_id)
  snapshot = os.path.join(repo, "snapshots", commit)
  for path, data in contents.items():
    blob = os.path.join(repo, "blobs", digests[path])
    os.makedirs(os.path.dirname(blob), exist_ok=True)
    with open(blob, "wb") as f:
      f.write(data)
    link = os.path.join(snapshot, *path.split("/"))
    os.makedirs(os.path.dirname(link), exist_ok=True)
    if os.path.lexists(link):
      os.remove(link)
    os.symlink(os.path.relpath(blob, os.path.dirname(link)), link)
  os.makedirs(snapshot, exist_ok=True)
  if revision is not None:
    ref = os.path.join(repo, "refs", *revision.split("/"))
    os.makedirs(os.path.dirname(ref), exist_ok=True)
    with open(ref, "w") as f:
      f.write(commit)
  if tree_listing is not None:
    listing = {p: {"size": len(contents.get(p, b"")),
                   "blob_id": hashlib.sha1(contents.get(p, p.encode())).hexdigest()} for p in tree_listing}
    os.makedirs(os.path.join(repo, "trees"), exist_ok=True)
    with open(os.path.join(repo, "trees", f"{commit}.json"), "w") as f:
      json.dump({"format_version": 1, "files": listing}, f)
  return snapshot
