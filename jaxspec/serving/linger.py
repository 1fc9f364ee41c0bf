"""uvicorn's HTTP/1.1 protocol (h11) with a lingering close: an answer sent before the request's body was read
whole (408, 413) reaches the client.

    uvicorn.Config(app, http=LingeringH11Protocol, ...)         # server.run and server.Background do

Closing a socket whose receive buffer holds bytes the server did not read makes the kernel send a reset (RST) in
place of the end of stream (FIN); so does a byte that arrives after the close. A client that was still sending its
body (a trickle, an upload over the limit) then reads the answer and a "connection reset", or loses the answer
whole if the reset overtakes it, instead of the answer and the end of the stream. Serious servers close such a
connection in two steps (Apache's and nginx's lingering close): the answer is sent and the write side shut
(`shutdown(SHUT_WR)`: FIN after the answer), then the client's bytes are read and dropped until it closes its side
or `LINGER_S` has passed, and only then is the socket closed. A FIN before any reset lets the client read the
whole answer and the end of the stream whatever comes after.

uvicorn closes the transport itself once a response with `connection: close` is complete, so the two steps are
taken here, under its protocol: the transport it is given closes by lingering when the request's body is still
being sent (h11 says the client is in SEND_BODY), and closes at once otherwise (a request read whole, an HTTP
error, a TLS transport, which cannot half-close). A server shutdown ends a lingering connection at once.
"""

from __future__ import annotations

import asyncio

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol

LINGER_S = 2.0  # the longest a connection lingers (reading and dropping the client's bytes) after its answer


class _Transport:
  """The protocol's transport, whose close() lingers while the client is still sending the request's body."""

  def __init__(self, transport: asyncio.Transport, protocol: "LingeringH11Protocol"):
    self._transport, self._protocol = transport, protocol
    self.lingering = False
    self._timer: asyncio.TimerHandle | None = None

  def __getattr__(self, name: str):
    return getattr(self._transport, name)

  def is_closing(self) -> bool:
    return self.lingering or self._transport.is_closing()

  def close(self) -> None:
    if self.lingering or self._transport.is_closing():
      return
    if self._protocol.conn.their_state is not h11.SEND_BODY or not self._transport.can_write_eof():
      self._transport.close()
      return
    self.lingering = True
    self._transport.write_eof()  # FIN once the answer is written (asyncio shuts the write side after its buffer)
    self._transport.resume_reading()  # (flow control may have paused it) the bytes are read and dropped
    self._timer = self._protocol.loop.call_later(LINGER_S, self.abort_linger)

  def abort_linger(self) -> None:
    """Closes the socket now (the linger's time is up, the server shuts down, or the connection is gone)."""
    if self._timer is not None:
      self._timer.cancel()
      self._timer = None
    self._transport.close()


class LingeringH11Protocol(H11Protocol):
  """uvicorn's h11 protocol whose transport closes by lingering (the module docstring says when and why)."""

  def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
    super().connection_made(_Transport(transport, self))  # type: ignore[arg-type]

  def data_received(self, data: bytes) -> None:
    if self.transport.lingering:  # the rest of a body already answered: dropped (the client's end of stream, seen
      return                       # by asyncio, closes the socket)
    super().data_received(data)

  def connection_lost(self, exc: Exception | None) -> None:
    if self.transport.lingering:
      self.transport.abort_linger()
    super().connection_lost(exc)

  def shutdown(self) -> None:
    if self.transport.lingering:
      self.transport.abort_linger()
      return
    super().shutdown()
