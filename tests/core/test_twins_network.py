"""The compiled network sample (`_network.pyx`) against the pure reference
(`network.python_network_sample`): the same sample, or the same error, for every decoded
message of the corpus, of fuzzed and odd documents, with and without a matched upstream
egress, and for hand-built messages the twin hands to the reference. As in test_twins.py,
the twin is imported directly, whichever core the process chose; both CI runs of
tests/core run these.
"""

from __future__ import annotations

from types import ModuleType

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from msgspec.structs import force_setattr

from nats_otel.core import accel, choice, network
from nats_otel.core.decode import DecodeError, RawTraceMessage
from nats_otel.core.model import Egress, Ingress, JetStreamEvent, ServerInfo, SubjectMapping, TraceMessage
from nats_otel.core.pipeline import prepare
from tests.core.test_fuzz_decode import LIMITS, payloads
from tests.core.test_twins import _twin, odd_messages, outcome


@pytest.fixture(scope="module")
def network_twin() -> ModuleType:
    module = _twin("_network")
    network.configure_network(module)  # as network.py does (not done when NATS_OTEL_NO_EXTENSIONS is set)
    return module


def _upstreams(msg: TraceMessage) -> list:
    """Upstream egress times to try: none, earlier, later (a clock skew), and odd ones."""
    ts = msg.ingress.ts_ns if isinstance(msg.ingress, Ingress) else 0
    return [None, ts - 1_500, ts + 7, 0, 2**70]


def _samples_alike(twin: ModuleType, raws: list[RawTraceMessage]) -> int:
    """Both twins on every message of `raws` that decodes; returns how many decoded."""
    decoded = 0
    for raw in raws:
        try:
            msg = prepare(raw, LIMITS).msg
        except DecodeError:
            continue
        decoded += 1
        for upstream in _upstreams(msg):
            assert outcome(twin.network_sample, msg, upstream) == outcome(
                network.python_network_sample, msg, upstream), (msg, upstream)
    return decoded


def test_the_process_runs_the_network_twin_it_was_asked_for():
    compiled = network.network_sample is not network.python_network_sample
    assert compiled == (not accel.NO_EXTENSIONS), choice.unavailable()


def test_the_corpus_gives_the_same_samples(network_twin, corpus_raws):
    assert _samples_alike(network_twin, corpus_raws) == len(corpus_raws)
    # The corpus has failures (failed forwarding egresses: the odd and hand-built messages).
    assert any(network.python_network_sample(prepare(raw).msg, None).failed for raw in corpus_raws)


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(st.lists(payloads(), min_size=1, max_size=3))
def test_fuzzed_messages_give_the_same_samples(network_twin, raws):
    _samples_alike(network_twin, raws)


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(odd_messages(), min_size=1, max_size=3))
def test_odd_messages_give_the_same_samples(network_twin, raws):
    # Every connection kind (labels of unknown kinds too), errors and notes, lone surrogates.
    _samples_alike(network_twin, raws)


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
    """A subclass: not a type the twin reads; the reference must decide."""


@pytest.mark.parametrize("msg", [
    TraceMessage(_server(), {}, 0, 0, _ingress(), (_egress(), _event(JetStreamEvent, 30, error="full"))),
    TraceMessage(_server(), {}, 0, 0, _ingress(error="denied"), (_egress(ts_ns=5, kind=9),)),
    TraceMessage(_server(), {}, 0, 0, _ingress(), (_event(_OtherEvent, 40),)),
    TraceMessage(_server(), {}, 0, 0, _ingress(), [_egress()]),  # type: ignore[arg-type]  # a list, not a tuple
    TraceMessage(_server(), {}, 0, 0, _ingress(error=None), ()),  # type: ignore[arg-type]  # not a str
    TraceMessage(_server(), {}, 0, 0, _ingress(), (_egress(error=7),)),  # type: ignore[arg-type]  # not a str
    TraceMessage(_server(), {}, 0, 0, _ingress(), (_egress(ts_ns="late"),)),  # type: ignore[arg-type]  # not an int
    TraceMessage(_server(), {}, 0, 0, None, ()),  # type: ignore[arg-type]  # no ingress
    TraceMessage(None, {}, 0, 0, _ingress(), ()),  # type: ignore[arg-type]  # no server
    "not a message",
], ids=["errors", "unknown-kind", "subclass", "list", "none-error", "int-error", "str-time", "no-ingress",
        "no-server", "str"])
def test_hand_built_messages_give_the_same_sample_or_error(network_twin, msg):
    for upstream in (None, 3, "x"):
        assert outcome(network_twin.network_sample, msg, upstream) == outcome(
            network.python_network_sample, msg, upstream)
