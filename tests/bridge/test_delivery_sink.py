"""The compiled receive path of a core source (`_frames.DeliverySink`, with the compiled
intake state `_frames.IntakeState`) against its references: `CoreSource.python_handler`
(`on_raw`) offering into an intake on the pure `intake._IntakeState`.

Differential: the same byte streams scanned into both (a bounded intake, so that some
frames are dropped, malformed headers among them); the deliveries, the intake's numbers,
the counts of received, dropped and malformed, and the scan's results must be equal. Then
the intake's `offer` on both states, step by step, the waiting collector included.
"""

from __future__ import annotations

import asyncio
import importlib
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from nats_otel.bridge import intake as intake_module
from nats_otel.bridge.intake import Intake
from nats_otel.bridge.settings import BatchSettings, NatsSource
from nats_otel.bridge.sources import frames, stamp
from nats_otel.bridge.sources.delivery import Delivery, delivery
from nats_otel.bridge.sources.nats_core import CoreSource
from nats_otel.bridge.telemetry import Metrics
from nats_otel.core import accel
from nats_otel.core.decode import RawTraceMessage

SID = 1


def compiled() -> Any:
    """The compiled module; a pure-Python run (NATS_OTEL_NO_EXTENSIONS) skips: its bridge's
    `Intake` is on the pure state, so there is no compiled path to hold against it."""
    if accel.NO_EXTENSIONS:
        pytest.skip("a pure-Python run: the bridge's intake and handler are the references themselves")
    try:
        return importlib.import_module("nats_otel.bridge.sources._frames")
    except ImportError as exc:
        pytest.fail(f"the frame scanner is not built ({exc}): python setup.py build_ext --inplace")


# `Intake` on the pure-Python state: the reference of the compiled one (`__slots__ = ()`
# keeps it as the bridge's, without an instance dict).
PureIntake = type("PureIntake", (intake_module._IntakeState,),
                  {k: v for k, v in vars(Intake).items() if k not in ("__dict__", "__weakref__")})


def source(intake: Any, metrics: Metrics) -> CoreSource:
    return CoreSource(NatsSource(name="src", urls=["nats://127.0.0.1:4222"], subjects=["t.>"]), BatchSettings(),
                      intake, metrics)


# -- frames -------------------------------------------------------------------------------------

subjects = st.sampled_from([b"t.a", b"t.b", b"t.\xff", b"t.a.longer", b"t.c"])
header_blocks = st.one_of(
    st.none(),
    st.just(b"NATS/1.0\r\nNats-Msg-Id: 7\r\n\r\n"),
    st.just(b"NATS/1.0\r\ntraceparent: 00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01\r\n"
            b"A: 1\r\nA: 2\r\n\r\n"),
    st.just(b"NATS/1.0\r\nno colon here\r\nB: x\r\n\r\n"),  # malformed: counted, the rest kept
)


@st.composite
def frame(draw: Any) -> bytes:
    subject, payload, headers = draw(subjects), draw(st.binary(max_size=200)), draw(header_blocks)
    reply = draw(st.one_of(st.none(), st.just(b"_INBOX.r")))
    fields = [subject, str(SID).encode()] + ([reply] if reply else [])
    if headers is None:
        return b"MSG " + b" ".join([*fields, str(len(payload)).encode()]) + b"\r\n" + payload + b"\r\n"
    total = len(headers) + len(payload)
    line = b"HMSG " + b" ".join([*fields, str(len(headers)).encode(), str(total).encode()])
    return line + b"\r\n" + headers + payload + b"\r\n"


def fields_of(d: Delivery) -> tuple[Any, ...]:
    raw = d.raw
    return raw.subject, raw.headers, raw.payload, raw.received_at, d.source, d.size, d.msg, d.breaks


def receive(compiled_path: bool, reads: list[bytes], max_bytes: int, max_messages: int | None,
            reroute_after: int) -> dict[str, Any]:
    """Scan `reads` into a bounded intake through one path; everything either path counts."""
    metrics = Metrics()
    intake = (Intake if compiled_path else PureIntake)(max_bytes, max_messages)
    src = source(intake, metrics)
    handler = src.direct_handler() if compiled_path else src.python_handler()
    assert (type(handler).__name__ == "DeliverySink") == compiled_path
    scan = compiled().scan if compiled_path else frames.python_scan
    results, delivered = [], []
    buf = bytearray()
    for number, data in enumerate(reads):
        if number == reroute_after:
            src.note_reroute(0)  # breaks from outside: later deliveries carry the new count
            src.link.downs += 2
        buf += data
        used, served, size, stop = scan(buf, {SID: handler})
        del buf[:used]
        results.append((used, served, size, stop))
        if number % 2:  # a batch taken and released in between: room again
            batch = intake.take(3)
            delivered += [fields_of(d) for d in batch]
            intake.release(batch)
    delivered += [fields_of(d) for d in intake.take(10_000)]
    return {"results": results, "delivered": delivered, "bytes": intake.bytes, "held": intake.held,
            "received": src._received.value, "dropped": src._dropped, "breaks": src.breaks,
            "queue_full": metrics.value("nats_otel_messages_dropped_total", {"reason": "queue_full"}),
            "malformed": metrics.value("nats_otel_mapping_issues_total", {"kind": "malformed_header"})}


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(frames_=st.lists(frame(), max_size=30), cut=st.integers(1, 7), max_bytes=st.integers(0, 8000),
       max_messages=st.one_of(st.none(), st.integers(0, 12)), reroute_after=st.integers(0, 10))
def test_the_compiled_sink_delivers_and_counts_as_the_reference(frames_: list[bytes], cut: int, max_bytes: int,
                                                                max_messages: int | None, reroute_after: int) -> None:
    compiled()
    stamp.refresh()
    reads = [b"".join(frames_[at:at + cut]) for at in range(0, len(frames_), cut)]
    ours = receive(True, reads, max_bytes, max_messages, reroute_after)
    assert ours == receive(False, reads, max_bytes, max_messages, reroute_after)
    assert ours["received"] == len(frames_)
    assert len(ours["delivered"]) + ours["queue_full"] == len(frames_)


def test_the_sink_as_a_plain_handler_and_its_subjects() -> None:
    """Called as any handler (nats-py's own parser hands it a message): the same delivery;
    the last subject's text is kept, and every other subject is its own, invalid UTF-8
    replaced, past the 1,024 subjects the handler keeps."""
    compiled()
    stamp.refresh()
    intake = Intake(1 << 30)
    sink = source(intake, Metrics()).direct_handler()
    names = [b"t.a", b"t.a", b"t.b", b"t.\xff", b"t.a"] + [f"t.{i}".encode() for i in range(1100)] + [b"t.7", b"t.a"]
    for name in names:
        sink(name, None, None, b"{}")
    got = intake.take(10_000)
    assert [d.raw.subject for d in got] == [n.decode(errors="replace") for n in names]
    assert [d.size for d in got[:3]] == [2 + 3 + intake_module.MESSAGE_OVERHEAD] * 3
    assert intake.bytes == sum(d.size for d in got) and intake.held == len(names)


def test_a_failing_header_reader_is_the_scans_error_and_the_frame_counted() -> None:
    """The handler's error stops the scan there, as a Python handler's does: the frame is
    consumed and counted, the next is served by the next scan."""
    compiled()

    class Boom(Exception):
        pass

    def failing(_block: bytes) -> dict[str, list[str]]:
        raise Boom("headers")

    intake = Intake(1 << 30)
    src = source(intake, Metrics())
    src._headers = failing
    sink = src.direct_handler()
    # a status: not a plain block, so the reader is called (`plain_headers` takes the rest in C)
    data = bytearray(b"HMSG t.a 1 16 18\r\nNATS/1.0 503\r\n\r\nab\r\nMSG t.a 1 2\r\ncd\r\n")
    first_frame = data.index(b"\r\nMSG") + 2
    used, served, size, stop = compiled().scan(data, {SID: sink})
    assert isinstance(stop, Boom) and served == 1 and size == 2 and used == first_frame
    del data[:used]
    assert compiled().scan(data, {SID: sink})[:3] == (len(data), 1, 2)
    assert [d.raw.payload for d in intake.take(5)] == [b"cd"] and src._received.value == 2


# -- a plain header block in C ------------------------------------------------------------------

_NAMES = st.sampled_from(["Content-Encoding", "traceparent", "A", "Nats-Msg-Id", "x", "a b", " A", "A ", "é",
                          "Status", ""])
_VALUES = st.sampled_from(["snappy", "gzip", "", " 1 ", "\t7\t", "a:b", "é", "x\x0by", "00-0af7-01", "\x7f"])


@st.composite
def header_block(draw: Any) -> bytes:
    """Header blocks as servers and clients write them, and near misses: names with spaces,
    colons in values, empty lines, statuses, bytes outside ASCII, lone CR or LF, no colon."""
    first = draw(st.sampled_from(["NATS/1.0", "NATS/1.0", "NATS/1.0 503", "NATS/1.0 404 No Messages", "NATS/1.1",
                                  "HTTP/1.0"]))
    lines = [first]
    for _ in range(draw(st.integers(0, 4))):
        kind = draw(st.sampled_from(["pair", "pair", "pair", "empty", "no colon", "bare"]))
        if kind == "pair":
            lines.append(f"{draw(_NAMES)}:{draw(_VALUES)}")
        elif kind == "empty":
            lines.append("")
        elif kind == "no colon":
            lines.append(draw(_NAMES))
        else:
            lines.append(draw(st.sampled_from(["a\nb: c", "a\rb: c", "k: v\r"])))
    end = draw(st.sampled_from(["\r\n\r\n", "\r\n\r\n", "\r\n", ""]))
    return ("\r\n".join(lines) + end).encode()


@settings(max_examples=3000, deadline=None)
@given(block=header_block())
def test_a_plain_header_block_reads_as_the_python_reader_reads_it(block: bytes) -> None:
    """`_frames.plain_headers` takes a plain block (what servers send with a compressed trace
    message) and gives what `headers.parse_headers` gives, with nothing malformed; anything
    else it leaves to the Python reader (None)."""
    from nats_otel.bridge.sources.headers import parse_headers

    ours = compiled().plain_headers(block)
    theirs, malformed = parse_headers(block)
    if ours is not None:
        assert (ours, malformed) == (theirs, 0), block
        assert [type(v) for v in ours.values()] == [list] * len(ours)


def test_the_plain_blocks_servers_send_are_read_in_c() -> None:
    plain = compiled().plain_headers
    assert plain(b"NATS/1.0\r\nContent-Encoding: snappy\r\n\r\n") == {"Content-Encoding": ["snappy"]}
    assert plain(b"NATS/1.0\r\nA: 1\r\nA:2\r\nB:\r\n\r\n") == {"A": ["1", "2"], "B": [""]}
    assert plain(b"NATS/1.0\r\n\r\n") == {}
    for other in (b"NATS/1.0 503\r\n\r\n", b"NATS/1.0\r\nno colon\r\n\r\n", b"NATS/1.0\r\nA b: 1\r\n\r\n",
                  b"NATS/1.0\r\nA: \xc3\xa9\r\n\r\n", b"NATS/1.0\r\nA: 1\n\r\n", b"NATS/1.0"):
        assert plain(other) is None, other


# -- the intake's offer, both states ------------------------------------------------------------

def _delivery(size: int) -> Delivery:
    return delivery(RawTraceMessage("t.a", {}, b"x" * size), "src")


@settings(max_examples=200, deadline=None)
@given(steps=st.lists(st.one_of(st.integers(0, 900), st.sampled_from(["take", "release"])), max_size=40),
       max_bytes=st.integers(0, 6000), max_messages=st.one_of(st.none(), st.integers(0, 6)))
def test_offer_on_both_intake_states(steps: list[Any], max_bytes: int, max_messages: int | None) -> None:
    compiled()

    def run(cls: Any) -> list[Any]:
        intake, out, taken_ = cls(max_bytes, max_messages), [], []
        for step in steps:
            if step == "take":
                taken_ += intake.take(2)
            elif step == "release":
                intake.release(taken_)
                taken_ = []
            else:
                out.append(intake.offer(_delivery(step)))
            out.append((intake.bytes, intake.held, intake.qsize()))
        return out

    assert run(Intake) == run(PureIntake)


@pytest.mark.parametrize("pure", [False, True])
async def test_offer_wakes_the_collector_when_its_batch_can_fill(pure: bool) -> None:
    compiled()
    intake = (PureIntake if pure else Intake)(1 << 20)
    collecting = asyncio.create_task(intake.collect(3, lambda: 30.0, None, lambda: None))
    await asyncio.sleep(0.01)
    for size in (0, 1):
        assert intake.offer(_delivery(size))
        await asyncio.sleep(0.01)
    assert not collecting.done()  # the first taken, one more waiting: two of three, time not up
    assert intake.offer(_delivery(2))
    batch = await asyncio.wait_for(collecting, 1.0)
    assert [len(d.raw.payload) for d in batch] == [0, 1, 2]
