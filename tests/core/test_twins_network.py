"""The compiled kernel's network sample (`_kernel.network_sample`: `_stage_network.pxi`)
against the pure reference (`network.python_network_sample`): the same sample, or the same
error, for every decoded message of the corpus, of fuzzed and odd documents, with and
without a matched upstream egress, and for hand-built messages, which the kernel hands to
the reference (counted by `handed_to_reference`) unless they are decode's records. As in
test_twins.py, the kernel comes from the `kernel` fixture (skipped under
NATS_OTEL_NO_EXTENSIONS=1) and is compared with the reference in one process.
"""

from __future__ import annotations

from types import ModuleType

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from msgspec.structs import force_setattr

from nats_otel.core import network
from nats_otel.core.decode import DecodeError, RawTraceMessage
from nats_otel.core.model import Egress, Ingress, JetStreamEvent, ServerInfo, SubjectMapping, TraceMessage
from nats_otel.core.pipeline import prepare
from tests.core.test_fuzz_decode import LIMITS, payloads
from tests.core.test_twins import handed, odd_messages, outcome


def _upstreams(msg: TraceMessage) -> list:
    """Upstream egress times to try: none, earlier, later (a clock skew), and odd ones."""
    ts = msg.ingress.ts_ns if isinstance(msg.ingress, Ingress) else 0
    return [None, ts - 1_500, ts + 7, 0, 2**70]


def _samples_alike(kernel: ModuleType, raws: list[RawTraceMessage]) -> tuple[int, int]:
    """The kernel and the reference on every message of `raws` that decodes; returns how
    many decoded, and how many samples (of those and their upstreams) the kernel handed to
    the reference."""
    decoded = handed_over = 0
    for raw in raws:
        try:
            msg = prepare(raw, LIMITS).msg
        except DecodeError:
            continue
        decoded += 1
        for upstream in _upstreams(msg):
            sample, count = handed(kernel, "network", kernel.network_sample, msg, upstream)
            assert sample == outcome(network.python_network_sample, msg, upstream), (msg, upstream)
            handed_over += count
        # The trace id and the span id's inputs (the exemplars' names) are carried as given, by both.
        ids = (bytes(range(16)), b"\x07" * 56, b"\x08" * 30)
        sample, count = handed(kernel, "network", kernel.network_sample, msg, None, *ids)
        assert sample == outcome(network.python_network_sample, msg, None, *ids)
        if isinstance(sample, network.NetworkSample):
            assert sample[-3:] == ids
        handed_over += count
    return decoded, handed_over


def test_the_corpus_gives_the_same_samples(kernel, corpus_raws):
    # Decode's records with int upstreams (or none): every sample taken by the kernel itself.
    assert _samples_alike(kernel, corpus_raws) == (len(corpus_raws), 0)
    # The corpus has failures (failed forwarding egresses: the odd and hand-built messages).
    assert any(network.python_network_sample(prepare(raw).msg, None).failed for raw in corpus_raws)


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(st.lists(payloads(), min_size=1, max_size=3))
def test_fuzzed_messages_give_the_same_samples(kernel, raws):
    _samples_alike(kernel, raws)


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(odd_messages(), min_size=1, max_size=3))
def test_odd_messages_give_the_same_samples(kernel, raws):
    # Every connection kind (labels of unknown kinds too), errors and notes, lone surrogates.
    _samples_alike(kernel, raws)


def _server() -> ServerInfo:
    return ServerInfo(name="n1", id="ID1")


_TS = "2026-11-22T02:16:30Z"


def _event(event_type: type, ts_ns: object, **fields):
    """An event with any `ts_ns`, also one decode never gives (its hook sets it from `ts`)."""
    event = event_type(ts=_TS, **fields)
    force_setattr(event, "ts_ns", ts_ns)
    return event


def _ingress(**fields) -> Ingress:
    return _event(Ingress, 10, **{"kind": 1, "name": "up", "account": "A", "subject": "s", **fields})


def _egress(ts_ns: object = 20, **fields) -> Egress:
    return _event(Egress, ts_ns, **{"kind": 2, "name": "gw", "hop": "1", "error": "boom", **fields})


class _OtherEvent(SubjectMapping, frozen=True):
    """A subclass: not a type the kernel reads; the reference must decide."""


# Each message, and whether the kernel takes its sample itself (decode's records, read at
# their slots) or hands it to the reference.
@pytest.mark.parametrize(("msg", "taken"), [
    (TraceMessage(_server(), {}, 0, 0, _ingress(), (_egress(), _event(JetStreamEvent, 30, error="full"))), True),
    (TraceMessage(_server(), {}, 0, 0, _ingress(error="denied"), (_egress(ts_ns=5, kind=9),)), True),
    (TraceMessage(_server(), {}, 0, 0, _ingress(), (_event(_OtherEvent, 40),)), False),
    (TraceMessage(_server(), {}, 0, 0, _ingress(), [_egress()]), False),  # type: ignore[arg-type]  # a list
    (TraceMessage(_server(), {}, 0, 0, _ingress(error=None), ()), False),  # type: ignore[arg-type]  # not a str
    (TraceMessage(_server(), {}, 0, 0, _ingress(), (_egress(error=7),)), False),  # type: ignore[arg-type]  # not a str
    (TraceMessage(_server(), {}, 0, 0, _ingress(), (_egress(ts_ns="late"),)), False),  # type: ignore[arg-type]
    (TraceMessage(_server(), {}, 0, 0, None, ()), False),  # type: ignore[arg-type]  # no ingress
    (TraceMessage(None, {}, 0, 0, _ingress(), ()), False),  # type: ignore[arg-type]  # no server
    ("not a message", False),
], ids=["errors", "unknown-kind", "subclass", "list", "none-error", "int-error", "str-time", "no-ingress",
        "no-server", "str"])
def test_hand_built_messages_give_the_same_sample_or_error(kernel, msg, taken):
    for upstream in (None, 3, "x"):  # an upstream time that is not an int: the reference's
        expected_handed = 0 if taken and upstream != "x" else 1
        assert handed(kernel, "network", kernel.network_sample, msg, upstream) == (
            outcome(network.python_network_sample, msg, upstream), expected_handed), upstream
        ids = (b"t" * 16, b"f" * 56, b"i" * 30)
        assert handed(kernel, "network", kernel.network_sample, msg, upstream, *ids) == (
            outcome(network.python_network_sample, msg, upstream, *ids), expected_handed), upstream
