"""The topology's readiness polls (`devkit/readiness.py`) against what may answer on a
monitoring port's number."""

from __future__ import annotations

import socket
import threading

from nats_otel.devkit.readiness import get_json

_INFO = b'INFO {"server_id":"X","server_name":"east-1","version":"2.15.1","proto":3}\r\n'


def _answering(reply: bytes) -> tuple[socket.socket, threading.Thread]:
    """A TCP port on 127.0.0.1 that sends `reply` to each connection and closes it."""
    listener = socket.create_server(("127.0.0.1", 0))

    def serve() -> None:
        while True:
            try:
                conn, _ = listener.accept()
            except OSError:
                return
            with conn:
                conn.sendall(reply)
                conn.recv(4096)

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    return listener, thread


def _close(listener: socket.socket, thread: threading.Thread) -> None:
    listener.shutdown(socket.SHUT_RDWR)  # wakes the accept (a close alone does not, on Linux)
    listener.close()
    thread.join(5)
    assert not thread.is_alive()


def test_a_nats_port_where_the_monitor_was_expected_reads_as_unreachable():
    """Another process's NATS client port holding the number a server's monitoring port was
    given (seen under xdist: the poll crashed with BadStatusLine instead of waiting for the
    server to exit and the start to be tried again on fresh ports)."""
    listener, thread = _answering(_INFO)
    try:
        port = listener.getsockname()[1]
        assert get_json(f"http://127.0.0.1:{port}/healthz", 2.0) == (0, None)
    finally:
        _close(listener, thread)


def test_an_http_answer_is_read():
    listener, thread = _answering(b'HTTP/1.0 200 OK\r\nContent-Type: application/json\r\n\r\n{"status":"ok"}')
    try:
        port = listener.getsockname()[1]
        assert get_json(f"http://127.0.0.1:{port}/healthz", 2.0) == (200, {"status": "ok"})
    finally:
        _close(listener, thread)
