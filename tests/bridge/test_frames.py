"""The frame scanner of the direct receive path (`bridge/sources/frames.py`, its compiled
twin `_frames.pyx`) and `direct.DirectParser`, which puts it in front of nats-py's parser.

Differential tests: the compiled scan against the pure one (same results, same handler
calls), and `DirectParser` against nats-py's own `Parser` on the same byte streams cut at
random places (same messages, pings, pongs, INFOs and errors, in the same order, and the
same protocol errors). The streams mix what the scanner serves with what it must leave to
nats-py: other sids, control lines, and lines only nats-py's looser pattern reads (double
spaces, tabs) or rejects. A real server then checks PINGs and messages interleaved.
"""

from __future__ import annotations

import asyncio
import importlib
import itertools
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from nats.errors import ProtocolError
from nats.protocol.parser import Parser

from nats_otel.bridge.intake import Intake
from nats_otel.bridge.sources import direct, frames
from nats_otel.bridge.telemetry import Metrics
from nats_otel.core import accel
from nats_otel.devkit.processes import start_topology
from nats_otel.devkit.topology import ServerSpec, Topology
from tests.bridge.bridge_helpers import wait_until
from tests.bridge.test_direct_receive import RawPublisher, core_source, taken

DIRECT_SIDS = (1, 2)


def compiled_scan() -> Any:
    try:
        return importlib.import_module("nats_otel.bridge.sources._frames").scan
    except ImportError as exc:
        if accel.NO_EXTENSIONS:
            pytest.skip(f"compiled twins not built in this pure-Python run: {exc}")
        pytest.fail(f"the frame scanner is not built ({exc}): python setup.py build_ext --inplace")


# -- byte streams -------------------------------------------------------------------------

tokens = st.binary(min_size=1, max_size=12).filter(lambda b: not any(c in b" \t\r\n\x0b\x0c" for c in b))
payloads = st.binary(max_size=300)
header_blocks = st.one_of(st.none(), st.builds(lambda v: b"NATS/1.0\r\nX-K: " + v + b"\r\n\r\n",
                                               st.binary(max_size=20).filter(lambda v: b"\r" not in v)))


@st.composite
def message(draw: Any) -> bytes:
    """A MSG or HMSG frame, for a direct sid or another one, with or without a reply."""
    sid = draw(st.sampled_from([1, 2, 3, 17]))
    subject, reply = draw(tokens), draw(st.one_of(st.none(), tokens))
    payload, headers = draw(payloads), draw(header_blocks)
    fields = [subject, str(sid).encode()] + ([reply] if reply else [])
    if headers is None:
        line = b"MSG " + b" ".join([*fields, str(len(payload)).encode()])
    else:
        total = len(headers) + len(payload)
        line = b"HMSG " + b" ".join([*fields, str(len(headers)).encode(), str(total).encode()])
        payload = headers + payload
    return line + b"\r\n" + payload + b"\r\n"


# Lines beside the plain frames: runs of spaces the scanner serves as nats-py reads them, and
# lines it must leave to nats-py (another whitespace, a space after the last field, bad sizes).
ODD = [
    b"PING\r\n", b"PONG\r\n", b"+OK\r\n", b'INFO {"server_id":"x","max_payload":1048576}\r\n',
    b"-ERR 'Stale Connection'\r\n",
    b"MSG  a 1 3\r\nabc\r\n",  # two spaces: nats-py's \s+ reads it
    b"MSG a\t1 3\r\nabc\r\n",  # a tab
    b"MSG a 1 r  3\r\nabc\r\n",
    b"MSG trace.a 1  3\r\nabc\r\n",  # an empty reply: how nats-server writes its own trace messages
    b"HMSG a 2  12 12\r\nNATS/1.0\r\n\r\n\r\n",
    b"MSG a 1 3 \r\nabc\r\n",  # a space after the size
    b"MSG a\t 1 3\r\nabc\r\n",  # a tab beside a space
    b"HMSG a 2 r 12   12  \r\nNATS/1.0\r\n\r\n\r\n",
    b"HMSG a 2 12 12\r\nNATS/1.0\r\n\r\n\r\n",  # headers only
    b"MSG a 1 +3\r\nabc\r\n",  # not \d+: nats-py's "unknown protocol"
    b"HMSG a 1 9 3\r\nabc\r\n",  # header size over the total
    b"MSG a 1 2 3 4\r\nabc\r\n",  # too many fields
    b"FOO bar\r\n",
]
streams = st.lists(st.one_of(message(), st.sampled_from(ODD)), max_size=25).map(b"".join)


def cuts(data: bytes, draw: Any) -> list[bytes]:
    points = sorted(draw(st.lists(st.integers(0, len(data)), max_size=8)))
    edges = [0, *points, len(data)]
    return [data[a:b] for a, b in itertools.pairwise(edges)]


# -- the scan, both twins -------------------------------------------------------------------

def run_scan(scan: Any, data: bytes, failing_subject: bytes | None = None) -> list[Any]:
    """Scan `data` as the parser does (delete what was consumed, stop at OTHER); every
    result and handler call, in order."""
    calls: list[Any] = []

    def handler(sid: int) -> Any:
        def on_frame(subject: bytes, reply: bytes | None, headers: bytes | None, payload: bytes) -> None:
            calls.append((sid, subject, reply, headers, payload))
            if subject == failing_subject:
                raise ValueError("handler failed")
        return on_frame

    handlers = {sid: handler(sid) for sid in DIRECT_SIDS}
    buf = bytearray(data)
    while True:
        used, served, size, stop = scan(buf, handlers)
        calls.append(("result", used, served, size, stop if stop in (frames.MORE, frames.OTHER) else repr(stop)))
        del buf[:used]
        if stop in (frames.MORE, frames.OTHER):
            calls.append(("left", bytes(buf)))
            return calls


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=streams, failing=st.one_of(st.none(), tokens))
def test_both_scans_serve_the_same_frames(data: bytes, failing: bytes | None) -> None:
    assert run_scan(compiled_scan(), data, failing) == run_scan(frames.python_scan, data, failing)


def test_the_scan_serves_direct_frames_and_stops_at_the_rest() -> None:
    for scan in (frames.python_scan, compiled_scan()):
        stream = (b"MSG t.a 1 5\r\nhello\r\nHMSG t.b 2 r.x 12 14\r\nNATS/1.0\r\n\r\nhi\r\n"
                  b"MSG t.c 3 2\r\nno\r\nMSG t.d 1 1\r\nx\r\n")
        calls = run_scan(scan, stream)
        assert calls[:2] == [(1, b"t.a", None, None, b"hello"), (2, b"t.b", b"r.x", b"NATS/1.0\r\n\r\n", b"hi")]
        used = stream.index(b"MSG t.c")
        assert calls[2] == ("result", used, 2, 7, frames.OTHER)  # sid 3 is not direct: nats-py's
        assert calls[3] == ("left", stream[used:])
        half = b"MSG t.a 1 5\r\nhel"
        assert run_scan(scan, half) == [("result", 0, 0, 0, frames.MORE), ("left", half)]


def test_runs_of_spaces_are_served_as_nats_py_reads_them() -> None:
    """nats-server writes the trace messages it publishes itself as `MSG <subject> <sid>
    <size>` with two spaces (an empty reply): served, not left to nats-py; a space after the
    last field or a tab is still left."""
    for scan in (frames.python_scan, compiled_scan()):
        stream = b"MSG trace.a 1  3\r\nabc\r\nHMSG  t.b   2 r.x  12 14\r\nNATS/1.0\r\n\r\nhi\r\n"
        assert run_scan(scan, stream) == [(1, b"trace.a", None, None, b"abc"),
                                          (2, b"t.b", b"r.x", b"NATS/1.0\r\n\r\n", b"hi"),
                                          ("result", len(stream), 2, 5, frames.MORE), ("left", b"")]
        for odd in (b"MSG a 1 3 \r\nabc\r\n", b"MSG a\t 1 3\r\nabc\r\n", b"MSG  \r\n"):
            assert run_scan(scan, odd) == [("result", 0, 0, 0, frames.OTHER), ("left", odd)]


def test_a_failing_handler_is_returned_with_its_frame_consumed() -> None:
    for scan in (frames.python_scan, compiled_scan()):
        calls = run_scan(scan, b"MSG bad 1 1\r\nx\r\nMSG ok 1 1\r\ny\r\n", failing_subject=b"bad")
        assert calls[1][:4] == ("result", 16, 1, 1) and "handler failed" in calls[1][4]
        assert calls[2] == (1, b"ok", None, None, b"y")  # the next scan goes on after it


def test_the_compiled_scanner_is_in_use_unless_forbidden() -> None:
    expected = "python" if accel.NO_EXTENSIONS else "compiled"
    assert expected == frames.IMPLEMENTATION, accel.refused()


# -- DirectParser against nats-py's Parser ----------------------------------------------------

class Recorder(direct.DirectClient):
    """A client that is never connected: it records what its parser hands it."""

    def __init__(self, fronted: bool) -> None:
        super().__init__()
        self.events: list[Any] = []
        if not fronted:
            self._ps = Parser(self)  # nats-py's parser alone: the reference
        for sid in DIRECT_SIDS:
            self._direct[sid] = lambda s, r, h, p, sid=sid: self.events.append(("direct", sid, s, r, h, p))

    async def _process_msg(self, sid: int, subject: bytes, reply: bytes, data: bytes, headers: bytes | None) -> None:
        if sid in self._direct:
            return await super()._process_msg(sid, subject, reply, data, headers)
        self.events.append(("other", sid, subject, reply, headers, data))

    async def _process_ping(self) -> None:
        self.events.append("ping")

    async def _process_pong(self) -> None:
        self.events.append("pong")

    async def _process_info(self, info: dict[str, Any], initial_connection: bool = False) -> None:
        self.events.append(("info", info))

    async def _process_err(self, err_msg: str) -> None:
        self.events.append(("err", err_msg))


async def feed(fronted: bool, chunks: list[bytes]) -> tuple[list[Any], int, int, str]:
    client = Recorder(fronted)
    assert isinstance(client._ps, direct.DirectParser) == fronted
    error = ""
    try:
        for chunk in chunks:
            await client._ps.parse(chunk)
    except ProtocolError as exc:
        error = str(exc)
    return client.events, client.stats["in_msgs"], client.stats["in_bytes"], error


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_direct_parser_reads_what_nats_py_reads(data: Any) -> None:
    chunks = cuts(data.draw(streams), data.draw)
    theirs = asyncio.run(feed(False, chunks))
    for scan in (frames.python_scan, compiled_scan()):  # the parser on either twin
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(frames, "scan", scan)
            assert asyncio.run(feed(True, chunks)) == theirs


def test_the_installed_parser_is_fronted() -> None:
    assert direct.PARSER_UNSUPPORTED is None
    assert isinstance(direct.DirectClient()._ps, direct.DirectParser)

    class NoBuffer(Parser):
        def reset(self) -> None:
            super().reset()
            self.buf = []  # type: ignore[assignment]

    assert "bytearray" in (direct.parser_unsupported(NoBuffer) or "")


# -- a real server: its PINGs between the messages ----------------------------------------------

@pytest.mark.integration
@pytest.mark.timeout(120)
async def test_server_pings_between_messages_are_answered() -> None:
    """The server PINGs every second; a parser that lost one would be disconnected as a stale
    connection after two. Messages flow the whole time; all arrive, on the one connection."""
    pinging = ServerSpec(name="n1", extra_config='ping_interval: "1s"\nping_max: 2\n')
    with start_topology(Topology(servers=(pinging,))) as running:
        url = running.client_url("n1", "a")
        intake, metrics = Intake(256 * 1024 * 1024), Metrics()
        source = core_source(url, ["frames.>"], intake, metrics)
        assert await source.start(asyncio.Event())
        try:
            assert isinstance(source.nc, direct.DirectClient)
            assert isinstance(source.nc._ps, direct.DirectParser)
            sent = 0
            async with RawPublisher(url) as publisher:
                for _ in range(50):  # ~5 s: several server PINGs
                    for _ in range(200):
                        publisher.publish(f"frames.{sent}", b"x" * (sent % 700))
                        sent += 1
                    await publisher.flush()
                    await asyncio.sleep(0.1)
            await wait_until(lambda: intake.qsize() >= sent, 20, "every message in the intake",
                             detail=lambda: f"{intake.qsize()} of {sent}")
            got = taken(intake)
            assert [d.raw.subject for d in got] == [f"frames.{i}" for i in range(sent)]
            assert [len(d.raw.payload) for d in got] == [i % 700 for i in range(sent)]
            assert source.nc.stats["reconnects"] == 0 and source.nc.is_connected
            assert source.nc.stats["in_msgs"] == sent
        finally:
            await source.close()
