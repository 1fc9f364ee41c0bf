"""Running the API: uvicorn in the foreground (launch/serve.py) or in a background thread (tests, notebooks).

    scheduler, app = build(engine, model_name="ende-target", max_tokens=64, queue_size=64)
    run(scheduler, app, host="127.0.0.1", port=8000)          # blocks; the engine compiles while /health is 503

    with Background(scheduler, app, port=free_port()) as server:    # uvicorn in a thread, stopped on exit
      server.wait_ready(timeout=300)
      openai.OpenAI(base_url=server.url + "/v1", api_key="none")
"""

from __future__ import annotations

import socket
import threading
import time

import uvicorn

from jaxspec.serving.app import create_app
from jaxspec.serving.metrics import Metrics
from jaxspec.serving.scheduler import Scheduler


def build(engine, *, model_name: str, max_tokens: int | None = None, queue_size: int = 64, settings_type=None):
  """(Scheduler, FastAPI app) over `engine`; requests without max_tokens get `max_tokens` (default: the engine's
  max_new_tokens)."""
  scheduler = Scheduler(engine, queue_size=queue_size, metrics=Metrics(engine.slots), settings_type=settings_type)
  app = create_app(scheduler, model_name=model_name, max_tokens=max_tokens or engine.max_new_tokens)
  return scheduler, app


def free_port(host: str = "127.0.0.1") -> int:
  with socket.socket() as s:
    s.bind((host, 0))
    return s.getsockname()[1]


def run(scheduler: Scheduler, app, *, host: str = "127.0.0.1", port: int = 8000, log_level: str = "info") -> None:
  """Starts the engine thread (warmup, then the loop) and serves until interrupted."""
  scheduler.start()
  try:
    uvicorn.run(app, host=host, port=port, log_level=log_level)
  finally:
    scheduler.stop()


class Background:
  """uvicorn and the engine thread in background threads; a context manager that stops both."""

  def __init__(self, scheduler: Scheduler, app, *, host: str = "127.0.0.1", port: int | None = None,
               log_level: str = "warning"):
    self.scheduler, self.host, self.port = scheduler, host, port or free_port(host)
    self.server = uvicorn.Server(uvicorn.Config(app, host=host, port=self.port, log_level=log_level))
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
