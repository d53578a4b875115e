"""A TCP forwarder that a test can take down and bring back on the same port: an outage
of a real server (connection refused, connections reset mid-request) that ends at once.

Stopping and starting the real `mlflow server` makes the same outage, but its start takes
~17 s to healthy on the 2-core VM, and a run must keep training through it: the outage
test needed 150 steps for that, where the behaviour it checks needs about 30.
"""

from __future__ import annotations

import contextlib
import socket
import struct
import threading


class TcpProxy:
    """Forwards 127.0.0.1:`port` to 127.0.0.1:`target_port` while up."""

    def __init__(self, target_port: int) -> None:
        self.target_port = target_port
        self._listener: socket.socket | None = None
        self._connections: set[socket.socket] = set()
        self._lock = threading.Lock()
        probe = socket.create_server(("127.0.0.1", 0))
        self.port = probe.getsockname()[1]
        probe.close()
        self.url = f"http://127.0.0.1:{self.port}"

    def up(self) -> None:
        """Listen again on the same port (SO_REUSEADDR: the last outage's closed
        connections do not hold it)."""
        listener = socket.create_server(("127.0.0.1", self.port))
        self._listener = listener
        threading.Thread(target=self._accept, args=(listener,), daemon=True).start()

    def down(self) -> None:
        """Refuse new connections and reset every open one, as a server that stopped."""
        listener, self._listener = self._listener, None
        if listener is not None:
            # close() alone leaves the port listening while _accept blocks in accept():
            # shutdown wakes it, and the port is free for up() again.
            _close(listener)
        with self._lock:
            connections, self._connections = self._connections, set()
        for conn in connections:
            _reset(conn)

    def _accept(self, listener: socket.socket) -> None:
        while True:
            try:
                client, _ = listener.accept()
            except OSError:
                return  # closed by down()
            try:
                upstream = socket.create_connection(("127.0.0.1", self.target_port), timeout=10)
            except OSError:
                _close(client)
                continue
            upstream.settimeout(None)
            with self._lock:
                if self._listener is not listener:  # taken down meanwhile
                    _close(client)
                    _close(upstream)
                    return
                self._connections |= {client, upstream}
            for source, sink in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pipe, args=(source, sink), daemon=True).start()

    def _pipe(self, source: socket.socket, sink: socket.socket) -> None:
        try:
            while data := source.recv(65536):
                sink.sendall(data)
        except OSError:
            pass
        finally:
            with self._lock:
                self._connections -= {source, sink}
            _close(source)
            _close(sink)


def _close(sock: socket.socket) -> None:
    with contextlib.suppress(OSError):
        sock.shutdown(socket.SHUT_RDWR)
    sock.close()


def _reset(sock: socket.socket) -> None:
    """Close with a TCP reset, as a connection to a process that died ends."""
    with contextlib.suppress(OSError):
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    sock.close()
