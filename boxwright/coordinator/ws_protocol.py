"""The WebSocket protocol ``boxwright serve`` runs under uvicorn: its sans-I/O one, with four holes closed.

Each hole is one a hostile client opens, not a protocol nicety:

- A handshake websockets cannot parse (a request line or a header line over 8 KiB, over 128
  headers) gets its 414 / 431 / 400 built by websockets but never written by uvicorn, which
  writes only once a request parsed: the connection then hangs, answered by nothing and closed
  by no timer (the HTTP layer's deadlines end at the upgrade), for as long as the client keeps it.
- Every ping is answered at once, whatever is already waiting to be written: a client that floods
  pings and reads nothing has its pongs buffered in this process without bound (measured: 40 MB
  of pings grew the server by 34 MiB). While writes are paused (the transport's buffer is above
  its high-water mark), only the latest ping's answer is kept and written once the client reads
  again, which RFC 6455 section 5.5.3 allows ("MAY elect to send a Pong frame for only the most
  recently processed Ping frame").
- A handshake refused with an HTTP answer (``websocket.http.response``) logs
  "ASGI callable returned without completing handshake" at ERROR: each refused client, one
  error line, for a refusal that went as meant.
- A text message that is not UTF-8 closes 1007 with no reason, after an ERROR and a traceback in
  the log: a client that sends one on purpose writes a traceback per connection. It closes 1007
  with a reason here, and logs nothing (the client's fault, told to the client).
"""

from __future__ import annotations

from typing import Any

from uvicorn.protocols.websockets.websockets_sansio_impl import WebSocketsSansIOProtocol


class CoordinatorWebSocketProtocol(WebSocketsSansIOProtocol):
    """uvicorn's ``websockets-sansio`` protocol; pass the class as ``uvicorn.Config(ws=...)``."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._held_reply: bytes | None = None

    def data_received(self, data: bytes) -> None:
        super().data_received(data)
        if not self.handshake_initiated and self.conn.handshake_exc is not None and not self.transport.is_closing():
            self.transport.write(b"".join(self.conn.data_to_send()))
            self.transport.close()

    def send_receive_event_to_app(self) -> None:
        if self.curr_msg_data_type == "text" and not self.close_sent:
            try:
                b"".join(self.frames).decode()
            except UnicodeDecodeError:
                self.frames = []
                self.conn.send_close(1007, "a text message must be UTF-8")
                self.handle_parser_exception()
                return
        super().send_receive_event_to_app()

    def handle_ping(self) -> None:
        if self.writable.is_set():
            super().handle_ping()
            return
        # websockets queued one pong per ping (and, at most, the reply to a close that came last).
        replies = self.conn.data_to_send()
        if replies:
            self._held_reply = replies[-1]

    def resume_writing(self) -> None:
        super().resume_writing()
        held, self._held_reply = self._held_reply, None
        if held and not self.transport.is_closing():
            self.transport.write(held)

    async def send(self, message: Any) -> None:
        await super().send(message)
        if message["type"] == "websocket.http.response.body" and not message.get("more_body", False):
            self.handshake_complete = True  # answered, with the app's own status: nothing is left to complete


__all__ = ["CoordinatorWebSocketProtocol"]
