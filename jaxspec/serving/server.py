"""Running the API: uvicorn in the foreground (launch/serve.py) or in a background thread (tests, notebooks).

    scheduler, app = build(engine, model_name="ende-target", max_tokens=64, queue_size=64)
    run(scheduler, app, host="127.0.0.1", port=8000)          # blocks; the engine compiles while /health is 503

    with Background(scheduler, app, port=free_port()) as server:    # uvicorn in a thread, stopped on exit
      server.wait_ready(timeout=300)
      openai.OpenAI(base_url=server.url + "/v1", api_key="none")

    serve(engine, model_name="ende-target", drafting="draft ende-draft", port=8000)   # launch/serve.py's: the
                                                    # banner, and over several processes process 0 leads (hosts.py)
"""

from __future__ import annotations

import ipaddress
import os
import signal
import socket
import sys
import threading
import time
from typing import Callable

import uvicorn

from jaxspec.errors import JaxspecError
from jaxspec.serving.app import BODY_TIMEOUT_S, create_app
from jaxspec.serving.linger import LingeringH11Protocol
from jaxspec.serving.metrics import Metrics
from jaxspec.serving.scheduler import Scheduler

INTERRUPTED = 130  # the exit status of a server stopped by Ctrl-C (128 + SIGINT), as shells report it


class WarmupFailed(JaxspecError):
  """The engine's warm-up (compiling every program) failed: the server cannot answer anything."""


def build(engine, *, model_name: str, max_tokens: int | None = None, queue_size: int = 64, settings_type=None,
          api_key: str | None = None, max_body_bytes: int | None = None, body_timeout_s: float = BODY_TIMEOUT_S):
  """(Scheduler, FastAPI app) over `engine`; requests without max_tokens get `max_tokens` (default: the engine's
  max_new_tokens). api_key, max_body_bytes, body_timeout_s: as `create_app` takes them."""
  scheduler = Scheduler(engine, queue_size=queue_size, metrics=Metrics(engine.slots), settings_type=settings_type)
  app = create_app(scheduler, model_name=model_name, max_tokens=max_tokens or engine.max_new_tokens,
                   api_key=api_key, max_body_bytes=max_body_bytes, body_timeout_s=body_timeout_s)
  return scheduler, app


def free_port(host: str = "127.0.0.1") -> int:
  with socket.socket() as s:
    s.bind((host, 0))
    return s.getsockname()[1]


def model_id(target: str) -> str:
  """The id clients send for a --target: a local directory's name (not its path), else the name as given (an
  embedded model, a hub id)."""
  if os.path.isdir(target):
    return os.path.basename(os.path.normpath(os.path.abspath(target)))
  return target


def _config(app, host: str, port: int, log_level: str) -> uvicorn.Config:
  """uvicorn over h11 whose connections close by lingering when a request's body is answered before it was read
  whole (408, 413: jaxspec/serving/linger.py), so that the client reads the answer, not a reset."""
  return uvicorn.Config(app, host=host, port=port, log_level=log_level, http=LingeringH11Protocol)


def _listening_port(server: uvicorn.Server, default: int) -> int:
  """The port uvicorn bound (the real one when asked for port 0)."""
  for s in getattr(server, "servers", ()):
    for sock in s.sockets or ():
      return sock.getsockname()[1]
  return default


def _watch(server: uvicorn.Server, scheduler: Scheduler, banner: Callable[[int], str] | None, port: int,
           ready: Callable[[], str] | None = None) -> None:
  """Prints the banner once uvicorn listens (its signal handlers are in place by then: a Ctrl-C after the banner
  is uvicorn's), then stops uvicorn if the warm-up fails, or prints ready() once it is done."""
  while not server.started:
    if server.should_exit:
      return
    time.sleep(0.05)
  if banner is not None:
    print(banner(_listening_port(server, port)), flush=True)
  while not scheduler.ready.wait(0.1):
    if scheduler.failure or server.should_exit:
      server.should_exit = True
      return
  if ready is not None:
    print(ready(), flush=True)


def run(scheduler: Scheduler, app, *, host: str = "127.0.0.1", port: int = 8000, log_level: str = "info",
        banner: Callable[[int], str] | None = None, ready: Callable[[], str] | None = None) -> int:
  """Starts the engine thread (warm-up, then the loop) and serves until interrupted; returns 0, or INTERRUPTED
  after a Ctrl-C (in-flight requests finished first, as uvicorn's shutdown does).

  banner(port) is printed once uvicorn listens, with the port it bound (port 0 picks a free one); ready() once the
  warm-up is done (launch/serve.py: the verification budget's step-cost curves). A failed
  warm-up stops the server and raises WarmupFailed with its one-line reason (not a server answering 503 for
  ever). A Ctrl-C or a failure to listen during the warm-up ends the process at once (status INTERRUPTED, or 1):
  XLA's compilation in the engine thread cannot be interrupted, and an interpreter torn down around it aborts in
  C++, so os._exit skips the teardown.
  """
  server = uvicorn.Server(_config(app, host, port, log_level))
  status = 0
  if threading.current_thread() is threading.main_thread():  # (a parent that ignored SIGINT must not decide)
    signal.signal(signal.SIGINT, signal.default_int_handler)
  try:
    scheduler.start()
    threading.Thread(target=_watch, args=(server, scheduler, banner, port, ready), name="jaxspec-watch",
                     daemon=True).start()
    server.run()  # uvicorn re-raises a SIGINT it handled (KeyboardInterrupt) once it has shut down
  except KeyboardInterrupt:
    status = INTERRUPTED
  except SystemExit as e:  # uvicorn could not start (it logged why: the port taken, ...): 1; or a SIGTERM handler
    status = e.code if isinstance(e.code, int) else 1  # (launch/serve.py's, over several processes) said 0
  if scheduler.failure:
    scheduler.stop()
    raise WarmupFailed(scheduler.failure)
  if not scheduler.ready.is_set():
    why = "interrupted during the warm-up" if status == INTERRUPTED else "the server did not start"
    print(f"{why}: exiting without waiting for the compilation.", file=sys.stderr, flush=True)
    sys.stdout.flush()
    os._exit(status or 1)  # pylint: disable=protected-access
  scheduler.stop()
  return status


class Background:
  """uvicorn and the engine thread in background threads; a context manager that stops both."""

  def __init__(self, scheduler: Scheduler, app, *, host: str = "127.0.0.1", port: int | None = None,
               log_level: str = "warning"):
    self.scheduler, self.host, self.port = scheduler, host, port or free_port(host)
    self.server = uvicorn.Server(_config(app, host, self.port, log_level))
    self.thread = threading.Thread(target=self.server.run, name="jaxspec-http", daemon=True)

  @property
  def url(self) -> str:
    return f"http://{self.host}:{self.port}"

  def __enter__(self) -> "Background":
    self.scheduler.start()
    self.thread.start()
    deadline = time.monotonic() + 30
    while not self.server.started:
      if time.monotonic() > deadline or not self.thread.is_alive():
        self.stop()
        raise RuntimeError(f"uvicorn did not start on {self.url}")
      time.sleep(0.05)
    return self

  def wait_ready(self, timeout: float = 600.0) -> None:
    """Blocks until the engine is compiled (RuntimeError naming the failure, or the timeout)."""
    deadline = time.monotonic() + timeout
    while not self.scheduler.ready.wait(0.1):
      if self.scheduler.failure or time.monotonic() > deadline:
        raise RuntimeError(self.scheduler.failure or f"the engine was not ready after {timeout:g} s")

  def stop(self) -> None:
    self.server.should_exit = True
    if self.thread.is_alive():
      self.thread.join(30)
    self.scheduler.stop()

  def __exit__(self, *exc) -> None:
    self.stop()


def _loopback(host: str) -> bool:
  if host == "localhost":
    return True
  try:
    return ipaddress.ip_address(host).is_loopback
  except ValueError:  # a host name: assume it reaches beyond this machine
    return False


def warn_if_exposed(host: str, api_key: str | None) -> None:
  """One line on stderr when `host` reaches beyond this machine and no API key guards the server."""
  if not api_key and not _loopback(host):
    print(f"warning: --host={host} reaches beyond this machine and no --api_key is set: anyone who can connect can "
          "use the server.", file=sys.stderr, flush=True)


def serve(engine, *, model_name: str, drafting: str, host: str = "127.0.0.1", port: int = 8000,
          log_level: str = "info", max_tokens: int | None = None, queue_size: int = 64,
          api_key: str | None = None) -> int:
  """launch/serve.py's server over `engine` (a SlotEngine): `build`, then `run` with the banner "serving MODEL
  (DRAFTING, N slots) on http://HOST:PORT/v1 ..." (drafting: "plain", "draft NAME", ...); its exit status. Over
  several processes (jax.process_count() > 1) process 0 serves through a `hosts.Leader` and stops every follower
  when its server ends (SIGTERM included), and every other process follows it (`hosts.serve`)."""
  import jax  # pylint: disable=import-outside-toplevel

  def serve_http(engine) -> int:
    scheduler, app = build(engine, model_name=model_name, max_tokens=max_tokens, queue_size=queue_size,
                           api_key=api_key)

    def banner(port: int) -> str:  # printed once uvicorn listens: the real port, and a Ctrl-C from then is handled
      return (f"serving {model_name} ({drafting}, {engine.slots} slots) on http://{host}:{port}/v1 (compiling "
              "first: GET /health is 503 until ready)")
    def ready() -> str:  # printed once the warm-up is done: the verification budget's step-cost curves
      costs = getattr(engine, "costs", None)
      if getattr(engine, "budget", None) is None or costs is None or not costs.measured:
        return "ready"
      return "ready; step costs c(rows, draft length k) measured in warm-up:\n  " + "\n  ".join(costs.lines())
    return run(scheduler, app, host=host, port=port, log_level=log_level, banner=banner, ready=ready)

  if jax.process_count() > 1:
    from jaxspec.serving import hosts  # pylint: disable=import-outside-toplevel
    return hosts.serve(engine, serve_http)
  return serve_http(engine)
