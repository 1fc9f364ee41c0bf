"""Which output files a launch script may resume, and only those: a fingerprint beside each, a lock while writing.

    record = run_record(texts, "in.txt", target="ende-target", draft="ende-draft", gamma=3, temperature=0.0, ...)
    writer = open_output("out.txt", texts, record)   # None for '' (print instead)
    writer.write(lines)                               # `jaxspec.tools.outputs.LineWriter`; writer.lock held till exit

`open_output` (what launch/generate.py and launch/translate.py call before any model loads):

- refuses an output that cannot be written (`check_output_file`: a directory, a device such as /dev/null, a path
  under a file, a directory that refuses writes) and an output that is the input file (also through a symlink);
- locks the output for the run (`OUTPUT.jaxspec.lock`, fcntl.flock, non-blocking): a second run on the same output
  fails at once with an `OutputError` instead of interleaving lines;
- resumes only a file that a script wrote: a non-empty output needs its fingerprint `OUTPUT.jaxspec.json`
  (written atomically before the first line); a notes file, a copy of the input or a plain-text `*.gz` is refused
  untouched;
- refuses a resume whose fingerprint does not match, naming what changed: the input lines already consumed (one
  hash per line, so appending lines resumes and an edited or inserted line before the resume point is refused),
  the target (its name, or for a directory the names, sizes and mtimes of its files) and the settings that change
  the text: temperature, top_k, top_p and seed (only when sampling: greedy output ignores them), max_new_tokens,
  max_input_length, prefix and chat.

Settings that never change a line need nothing: batch size (see docs/reliability.md for the sampled adaptive
schedules), --compare, --long_inputs. The draft, gamma and tree never change greedy output (it is exactly the target's),
so at temperature 0 they may change freely; when sampling they change which sample is drawn (each line is still an
exact sample of the target's distribution, but the file is no longer what one setting reproduces), so a resume
with another draft, gamma or tree is refused unless `allow_new_settings` (--resume_with_new_settings) is given.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import json
import os
import stat
import sys
import tempfile
from typing import Sequence

from jaxspec.tools.outputs import LineWriter, atomic_write_json
from jaxspec.errors import OutputError

FORMAT = 1
SIDECAR = ".jaxspec.json"  # OUTPUT + SIDECAR: the fingerprint of what produced OUTPUT
LOCK = ".jaxspec.lock"  # OUTPUT + LOCK: flocked while a run writes OUTPUT
STDIN = "-"
HASH_CHARS = 8  # hex characters kept per input line (32 bits: an edit goes unseen with probability 2**-32)
_MODEL_FILES = 256  # files of a model directory fingerprinted at most (names, sizes, mtimes)
TEXT_SETTINGS = ("temperature", "top_k", "top_p", "seed", "max_new_tokens", "max_input_length", "prefix", "chat")
SAMPLING_ONLY = ("top_k", "top_p", "seed")  # ignored by greedy decoding (temperature 0)
SPECULATION = ("draft", "gamma", "tree")  # change the sample drawn when sampling, never greedy output
_EMBEDDED = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "embedded")


def sidecar_path(output: str) -> str:
  return output + SIDECAR


def lock_path(output: str) -> str:
  return output + LOCK


def define_flags() -> None:
  """--resume_with_new_settings (generate.py, translate.py)."""
  from absl import flags  # pylint: disable=import-outside-toplevel
  flags.DEFINE_boolean("resume_with_new_settings", False, "Resume an --output written with another --draft, --tree or "
                       "--gamma while sampling (lines stay exact samples, drawn differently). Settings that "
                       "change the text (input lines, --target, --temperature, --top_k, --top_p, --seed, "
                       "--max_new_tokens, --max_input_length, --prefix, --chat) are never resumed across.")


# --- writable destinations ------------------------------------------------------------------------------------


def _nearest_existing(path: str) -> str:
  path = os.path.abspath(path)
  while not os.path.exists(path):
    path = os.path.dirname(path)
  return path


def _probe_directory(directory: str, flag: str, path: str) -> None:
  """Creates and removes a file in `directory` (os.access says yes to root even on a read-only mount)."""
  try:
    fd, name = tempfile.mkstemp(prefix=".jaxspec-probe-", dir=directory)
    os.close(fd)
    os.remove(name)
  except OSError as e:
    raise OutputError(f"{flag}={path}: cannot write in {directory} ({e.strerror or e}).") from None


def check_output_file(path: str, flag: str = "--output") -> None:
  """OutputError unless `path` is (or can be created as) a regular file in a writable directory."""
  if not path:
    raise OutputError(f"{flag} is empty: name a file.")
  if os.path.isdir(path):
    raise OutputError(f"{flag}={path}: is a directory, expected an output file.")
  if os.path.exists(path) and not stat.S_ISREG(os.stat(path).st_mode):
    raise OutputError(f"{flag}={path}: is not a regular file (a device or a pipe): outputs are files a rerun can "
                      "resume.")
  parent = _nearest_existing(os.path.dirname(os.path.abspath(path)))
  if not os.path.isdir(parent):
    raise OutputError(f"{flag}={path}: {parent} is a file, not a directory.")
  _probe_directory(parent, flag, path)
  if os.path.exists(path):
    try:
      with open(path, "ab"):
        pass
    except OSError as e:
      raise OutputError(f"{flag}={path}: cannot be written ({e.strerror or e}).") from None


def check_output_dir(path: str, flag: str = "--output_dir") -> None:
  """OutputError unless `path` is (or can be created as) a writable directory."""
  if not path:
    raise OutputError(f"{flag} is empty: name a directory.")
  if os.path.exists(path) and not os.path.isdir(path):
    raise OutputError(f"{flag}={path}: is a file, expected a directory.")
  existing = _nearest_existing(path)
  if not os.path.isdir(existing):
    raise OutputError(f"{flag}={path}: {existing} is a file, not a directory.")
  _probe_directory(existing, flag, path)


def same_file(a: str, b: str) -> bool:
  """Whether two paths name one file (also through symlinks or hard links)."""
  try:
    return os.path.samefile(a, b)
  except OSError:
    return os.path.realpath(a) == os.path.realpath(b)


# --- the lock ---------------------------------------------------------------------------------------------------


def lock_output(output: str):
  """Holds OUTPUT.jaxspec.lock (an open file, flocked) until it is closed or the process ends; OutputError when
  another run holds it."""
  path = lock_path(output)
  os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
  handle = open(path, "a+b")  # pylint: disable=consider-using-with
  try:
    fcntl.flock(handle.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
  except OSError as e:
    handle.close()
    if e.errno in (errno.EAGAIN, errno.EACCES, errno.EWOULDBLOCK):
      raise OutputError(f"{output}: another run holds it (lock {path}); wait for that run to end or choose another "
                        "--output.") from None
    raise OutputError(f"{output}: cannot lock {path} ({e.strerror or e}).") from None
  return handle


# --- the fingerprint --------------------------------------------------------------------------------------------


def line_hashes(texts: Sequence[str]) -> str:
  """HASH_CHARS hex characters of sha256 per line, concatenated."""
  return "".join(hashlib.sha256(t.encode("utf-8")).hexdigest()[:HASH_CHARS] for t in texts)


def model_fingerprint(name: str | None) -> dict | None:
  """{"name": name} plus, for a model directory (or an embedded model), {"files": {relative path: [size,
  mtime_ns]}}: a retrained or replaced checkpoint differs, a copy that keeps mtimes (cp -a) does not."""
  if not name:
    return None
  directory = name if os.path.isdir(name) else os.path.join(_EMBEDDED, name)
  out = {"name": name}
  if os.path.isdir(directory):
    files = {}
    for root, dirs, names in os.walk(directory):
      dirs.sort()
      for n in sorted(names):
        if len(files) >= _MODEL_FILES:
          break
        st = os.stat(os.path.join(root, n))
        files[os.path.relpath(os.path.join(root, n), directory)] = [st.st_size, st.st_mtime_ns]
    out["files"] = files
  return out


def _model_key(fp: dict | None):
  return None if fp is None else fp.get("files", fp.get("name"))


def run_record(texts: Sequence[str], input_spec: str, *, target: str, draft: str | None = None, gamma=None,
               tree=None, temperature: float = 0.0, top_k: int = 0, top_p: float = 1.0, seed: int = 0,
               max_new_tokens: int | None = None, max_input_length: int | None = None, prefix: str = "",
               chat: bool = False) -> dict:
  """What produced an output: the input's lines (hashed), the models and the settings (see the module docstring)."""
  greedy = temperature == 0
  settings = dict(temperature=float(temperature), top_k=None if greedy else top_k,
                  top_p=None if greedy else float(top_p), seed=None if greedy else seed,
                  max_new_tokens=max_new_tokens, max_input_length=max_input_length, prefix=prefix, chat=bool(chat))
  drafts = [n.strip() for n in (draft or "").split(",") if n.strip()]
  record = {"format": FORMAT,
            "input": {"path": "<stdin>" if input_spec in ("", STDIN) else os.path.abspath(input_spec),
                      "lines": len(texts), "line_hashes": line_hashes(texts)},
            "target": model_fingerprint(target), "settings": settings,
            "speculation": {"draft": draft or "", "gamma": gamma, "tree": _tree_text(tree),
                            "draft_models": [model_fingerprint(n.removeprefix("random:")) for n in drafts]}}
  return json.loads(json.dumps(record))  # as it reads back from the file


def _tree_text(tree) -> str:
  """--tree as recorded: '' (chains), 'K,N' or 'auto'."""
  if tree is None:
    return ""
  return tree if isinstance(tree, str) else f"{tree.top_k},{tree.nodes}"


def record_from_flags(texts: Sequence[str], input_spec: str) -> dict:
  """`run_record` of the script's flags (those it defines)."""
  from absl import flags  # pylint: disable=import-outside-toplevel
  names = ("target", "draft", "gamma", "tree") + TEXT_SETTINGS
  return run_record(texts, input_spec, **{n: flags.FLAGS[n].value for n in names if n in flags.FLAGS})


def _settings_changes(old: dict, new: dict) -> tuple[list[str], list[str]]:
  """(changes that alter the text, changes of draft or gamma that alter only which sample is drawn)."""
  text = []
  if _model_key(old.get("target")) != _model_key(new["target"]):
    was, now = (old.get("target") or {}).get("name"), new["target"]["name"]
    text.append(f"--target {was} -> {now}" if was != now else f"--target {now}: its files changed")
  old_settings = old.get("settings", {})
  for key in TEXT_SETTINGS:
    if old_settings.get(key) != new["settings"][key]:
      was, now = old_settings.get(key), new["settings"][key]
      text.append(f"--{key} {'(greedy, unused)' if was is None else repr(was)} -> "
                  f"{'(greedy, unused)' if now is None else repr(now)}")
  sample = []
  old_spec, new_spec = old.get("speculation", {}), new["speculation"]
  if new["settings"]["temperature"] > 0:
    if (old_spec.get("draft") != new_spec["draft"] or
        [_model_key(m) for m in old_spec.get("draft_models", [])] != [_model_key(m) for m in new_spec["draft_models"]]):
      sample.append(f"--draft {old_spec.get('draft')!r} -> {new_spec['draft']!r}")
    if old_spec.get("gamma") != new_spec["gamma"]:
      sample.append(f"--gamma {old_spec.get('gamma')!r} -> {new_spec['gamma']!r}")
    if old_spec.get("tree", "") != new_spec.get("tree", ""):
      sample.append(f"--tree {old_spec.get('tree', '')!r} -> {new_spec.get('tree', '')!r}")
  return text, sample


def _first_changed_line(old_hashes: str, new_hashes: str, done: int) -> int | None:
  """The first of the `done` consumed lines (1-based) whose hash differs, or None."""
  for i in range(done):
    a, b = old_hashes[i * HASH_CHARS:(i + 1) * HASH_CHARS], new_hashes[i * HASH_CHARS:(i + 1) * HASH_CHARS]
    if a != b:
      return i + 1
  return None


def read_record(output: str) -> dict:
  path = sidecar_path(output)
  try:
    with open(path, encoding="utf-8") as f:
      record = json.load(f)
    if not isinstance(record, dict) or record.get("format") != FORMAT:
      raise ValueError("not a fingerprint of this version")
    return record
  except (OSError, ValueError) as e:
    raise OutputError(f"{output}: its fingerprint {path} cannot be read ({e}): remove both or choose another "
                      "--output.") from None


def open_output(output: str, texts: Sequence[str], record: dict, *, input_spec: str = "",
                allow_new_settings: bool = False, main: bool | None = None) -> LineWriter | None:
  """The resumable writer of `output` ('' = print instead: None), after the checks of the module docstring; says on
  stderr how far an earlier run got. Only the main process writes (each process of a multi-host job runs this)."""
  if main is None:
    import jaxspec  # pylint: disable=import-outside-toplevel
    main = jaxspec.is_main_process()
  if not output or not main:
    return None
  check_output_file(output)
  if input_spec not in ("", STDIN) and os.path.exists(input_spec) and same_file(input_spec, output):
    raise OutputError(f"--output={output} is the --input file: outputs would overwrite the inputs; choose another "
                      "--output.")
  had_lock = os.path.exists(lock_path(output))
  lock = lock_output(output)
  try:
    writer = _open_checked(output, texts, record, allow_new_settings)
  except BaseException:
    if not had_lock:  # a refused output keeps nothing of this run beside it
      with contextlib.suppress(OSError):
        os.remove(lock_path(output))
    lock.close()
    raise
  writer.lock = lock  # held as long as the writer lives (the run)
  if writer.done:
    print(f"resuming: {writer.done} of {len(texts)} lines already in {output}", file=sys.stderr)
  return writer


def _open_checked(output: str, texts: Sequence[str], record: dict, allow_new_settings: bool) -> LineWriter:
  old = None
  if os.path.exists(output) and os.path.getsize(output) > 0:
    if not os.path.exists(sidecar_path(output)):
      raise OutputError(f"{output} exists but was not written by this script (no fingerprint "
                        f"{os.path.basename(sidecar_path(output))} beside it): left untouched; remove it or choose "
                        "another --output.")
    old = read_record(output)
    text, sample = _settings_changes(old, record)
    if text:
      raise OutputError(f"{output} was written with other settings ({'; '.join(text + sample)}): its lines would "
                        "not be this run's; remove it or choose another --output.")
    if sample and not allow_new_settings:
      raise OutputError(f"{output} was sampled with another draft or gamma ({'; '.join(sample)}): pass "
                        "--resume_with_new_settings to continue (lines stay exact samples, drawn differently), or "
                        "use the same settings.")
  writer = LineWriter(output, len(texts))
  if writer.done and old is not None:
    changed = _first_changed_line(old["input"].get("line_hashes", ""), record["input"]["line_hashes"], writer.done)
    if changed is not None:
      raise OutputError(f"{output}: input line {changed} differs from the input its first {writer.done} lines were "
                        f"made from ({old['input'].get('path')}): the lines would be stale or shifted; remove it "
                        "or choose another --output.")
  atomic_write_json(sidecar_path(output), record)
  return writer
