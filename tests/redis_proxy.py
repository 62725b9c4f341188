"""A TCP proxy to a real redis-server that loses one reply: the command ran, its caller
sees the connection drop. For the tests of "an uncertain write is never "not stored"".
"""

from __future__ import annotations

import contextlib
import socket
import threading

__all__ = ["DropOneReply"]


class DropOneReply:
    """A TCP proxy to Redis that, once ``armed``, forwards the first command containing
    ``marker`` and cuts that connection when Redis replies to it, without forwarding the
    reply: the command ran, its caller sees the connection drop. ``dropped`` is set then;
    later connections are forwarded whole."""

    def __init__(self, upstream_port: int, marker: bytes) -> None:
        self.upstream_port = upstream_port
        self.marker = marker
        self.armed = threading.Event()
        self.dropped = threading.Event()
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port = self._listener.getsockname()[1]
        self._closed = False
        threading.Thread(target=self._accept, daemon=True).start()

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def _accept(self) -> None:
        while not self._closed:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            upstream = socket.create_connection(("127.0.0.1", self.upstream_port))
            cut = threading.Event()
            threading.Thread(target=self._up, args=(client, upstream, cut), daemon=True).start()
            threading.Thread(target=self._down, args=(upstream, client, cut), daemon=True).start()

    def _up(self, client: socket.socket, upstream: socket.socket, cut: threading.Event) -> None:
        tail = b""
        try:
            while data := client.recv(65536):
                if self.armed.is_set() and self.marker in tail + data:
                    self.armed.clear()
                    cut.set()  # the reply to this command is never forwarded
                    upstream.sendall(data)
                    return  # nothing after it: ``_down`` cuts both when the reply comes
                upstream.sendall(data)
                tail = data[-len(self.marker) :]
        except OSError:
            pass
        for s in (client, upstream):
            _close(s)

    def _down(self, upstream: socket.socket, client: socket.socket, cut: threading.Event) -> None:
        try:
            while data := upstream.recv(65536):
                if cut.is_set():  # Redis answered the cut command: it ran
                    self.dropped.set()
                    break
                client.sendall(data)
        except OSError:
            pass
        for s in (client, upstream):
            _close(s)

    def close(self) -> None:
        self._closed = True
        _close(self._listener)  # shutdown wakes the thread blocked in accept


def _close(s: socket.socket) -> None:
    with contextlib.suppress(OSError):
        s.shutdown(socket.SHUT_RDWR)
    s.close()
