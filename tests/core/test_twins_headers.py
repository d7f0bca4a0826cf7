"""The compiled mapper's copied headers (`_stage_headers.pxi`) and the buffers it keeps
between calls (`_stage_map.pxi`) against the reference: the
same bytes, or the same exception, and the message handed to the reference exactly when
the generic way (a name twice in other cases, a value it cannot write) hands it over.

The kernel keeps what each header name comes to (copied or not, the pair's key) per name
and allowlist, in a bounded cache: these tests change the allowlist under it, empty it
in the middle of a message, and give it what it does not write itself (more than 16
copied headers, values that are not strings, a mutable allowlist).
"""

from __future__ import annotations

import json

import msgspec
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from nats_otel.core import span_bytes
from nats_otel.core.mapping import MappingOptions
from nats_otel.core.model import TraceHeaders
from nats_otel.core.pipeline import Linker, prepare
from tests.core.factories import TRACEPARENT, egress, ingress, message, raw
from tests.core.test_fuzz_decode import LIMITS
from tests.core.test_twins import handed, outcome


def _prepared(headers: dict):
    """A prepared message with `headers` (the parse's, or msgspec's, records), and its placement."""
    p = prepare(raw(json.dumps(message(ingress(kind=1), egress(), headers=headers)).encode()), LIMITS)
    linker = Linker(bounded=False)
    linker.observe(p)
    return p, linker.place(p)


def _alike(kernel, p, placement, options) -> int:
    """Both twins' map + encode of one message agree; how many messages the kernel handed over."""
    result, count = handed(kernel, "map", kernel.map_encode, p.msg, p.ctx, placement, options)
    assert result == outcome(span_bytes.python_map_encode, p.msg, p.ctx, placement, options)
    assert not isinstance(result[0], type)  # mapped, not failed
    return count


def _with_headers(p, headers, as_given: bool = False):
    """`p` with other headers (values the JSON cannot carry: ints, lists...): a dict made a
    `TraceHeaders`, as decoding makes it, unless `as_given`."""
    if isinstance(headers, dict) and not as_given:
        headers = TraceHeaders.of(headers)
    msg = msgspec.structs.replace(p.msg, headers=headers)
    return msgspec.structs.replace(p, msg=msg)


def test_the_common_headers_are_copied_by_the_kernel(kernel):
    headers = {"traceparent": [TRACEPARENT], "Nats-Trace-Hop": ["1.2"], "Nats-Trace-Dest": ["t"],
               "X-App": ["é" * 70, "", "b"], "Nats-Msg-Id": ["x" * 300]}
    p, placement = _prepared(headers)
    for options in (MappingOptions(), MappingOptions(header_allowlist=frozenset({"x-app", "nats-trace-hop"})),
                    MappingOptions(), MappingOptions(header_allowlist=frozenset())):
        assert _alike(kernel, p, placement, options) == 0


def test_a_name_twice_in_other_cases_goes_to_the_reference(kernel):
    p, placement = _prepared({"traceparent": [TRACEPARENT], "Nats-Trace-Hop": ["1"], "nats-trace-hop": ["2"]})
    assert _alike(kernel, p, placement, MappingOptions()) == 1
    # Not copied: nothing to decide.
    assert _alike(kernel, p, placement, MappingOptions(header_allowlist=frozenset({"traceparent"}))) == 0


def test_more_headers_than_the_fast_way_writes(kernel):
    names = [f"X-H{i}" for i in range(40)]
    p, placement = _prepared({name: [name] for name in names})
    options = MappingOptions(header_allowlist=frozenset(name.lower() for name in names))
    assert _alike(kernel, p, placement, options) == 0


def test_the_cache_emptied_within_a_message_still_finds_the_name_given_twice(kernel):
    # More names than the cache keeps (1,024): it is emptied between the two spellings, and
    # copied names are cached again after that.
    headers = {"X-Twice": ["a"]} | {f"n{i}": ["v"] for i in range(1500)} | {"x-twice": ["b"]}
    p, placement = _prepared(headers)
    options = MappingOptions(header_allowlist=frozenset({"x-twice"} | {f"n{i}" for i in range(1100, 1110)}))
    assert _alike(kernel, p, placement, options) == 1
    headers.pop("x-twice")
    p, placement = _prepared(headers)
    assert _alike(kernel, p, placement, options) == 0


def test_values_the_fast_way_does_not_write(kernel):
    p, placement = _prepared({"traceparent": [TRACEPARENT]})
    for headers, expected in [(TraceHeaders.of({"traceparent": [1, "a", True]}), 0),  # written by `put_key_value`
                              (TraceHeaders.of({"traceparent": ["a", "b"]}), 0),
                              (TraceHeaders(("traceparent", ["a", "b"])), 1),  # values a list: the reference's
                              ({"traceparent": ["a"]}, 1),                       # a dict: the reference's
                              (TraceHeaders.of({"traceparent": ["\ud800"]}), 1),  # lone surrogate: the reference's
                              (TraceHeaders.of({"Trace\ud800": ["a"], "traceparent": []}), 0)]:
        given = _with_headers(p, headers, as_given=True)
        assert _alike(kernel, given, placement, MappingOptions()) == expected, headers


def test_a_mutable_allowlist_is_read_each_time(kernel):
    p, placement = _prepared({"traceparent": [TRACEPARENT], "X-App": ["a"]})
    allowlist = {"traceparent"}
    options = MappingOptions(header_allowlist=allowlist)  # type: ignore[arg-type] - a set, on purpose
    assert _alike(kernel, p, placement, options) == 0
    allowlist.add("x-app")
    assert _alike(kernel, p, placement, options) == 0


_NAMES = st.sampled_from(["traceparent", "Traceparent", "Nats-Trace-Hop", "nats-trace-hop", "X-App", "x-app",
                          "Nats-Msg-Id", "é-Ü", "É-ü"])
_ALLOWED = st.frozensets(st.sampled_from(["traceparent", "nats-trace-hop", "x-app", "é-ü", "nats-msg-id"]))
_VALUES = st.lists(st.sampled_from(["", "a", "é.ü", "x" * 200, TRACEPARENT]) | st.text(max_size=6), max_size=4)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.tuples(st.dictionaries(_NAMES, _VALUES, max_size=6), _ALLOWED), min_size=1, max_size=4))
def test_generated_headers_and_allowlists_map_alike(kernel, cases):
    for headers, allowlist in cases:
        p, placement = _prepared(headers)
        _alike(kernel, p, placement, MappingOptions(header_allowlist=allowlist))


class _Reentrant:
    """Options whose allowlist, read while the kernel writes a message's spans, maps another
    message first: a call into `map_encode` while one is writing (as another thread's could)."""

    service_name = "nats-server"

    def __init__(self, kernel, inner) -> None:
        self.kernel, self.inner, self.results = kernel, inner, []

    @property
    def header_allowlist(self) -> frozenset[str]:
        p, placement = self.inner
        self.results.append(self.kernel.map_encode(p.msg, p.ctx, placement, MappingOptions()))
        return MappingOptions().header_allowlist


def test_a_call_while_another_writes_has_buffers_of_its_own(kernel):
    outer = _prepared({"traceparent": [TRACEPARENT], "Nats-Trace-Hop": ["1"]})
    inner = _prepared({"traceparent": [TRACEPARENT], "Nats-Msg-Id": ["m" * 50]})
    options = _Reentrant(kernel, inner)
    assert _alike(kernel, *outer, options) == 0
    p, placement = inner
    assert options.results[0] == span_bytes.python_map_encode(p.msg, p.ctx, placement, MappingOptions())


def test_buffers_grown_by_a_large_message_are_given_back(kernel):
    p, placement = _prepared({"traceparent": [TRACEPARENT]})
    large = _with_headers(p, {"traceparent": [TRACEPARENT] * 3000})  # ~190 KB of spans
    for prepared in (large, p, large, p):
        assert _alike(kernel, prepared, placement, MappingOptions()) == 0


def test_the_trace_headers_are_found_as_the_reference_finds_them(kernel):
    """Nats-Trace-Hop, -Dest and -Only read by the kernel's mapper in place (a message keeps
    no index of its headers): in any case, the first spelling with a value winning, an
    empty list skipped; the same spans as the reference's, none handed over (but for what
    the copied headers hand over); values in another form go to the reference."""
    p, placement = _prepared({"traceparent": [TRACEPARENT]})
    not_copied = MappingOptions(header_allowlist=frozenset({"traceparent"}))
    cases = [
        {"nats-trace-hop": [], "NATS-TRACE-HOP": ["h2"]},
        {"Nats-Trace-Hop": ["h1", "h9"], "nats-trace-hop": ["h2"]},
        {"NATS-TRACE-DEST": ["d"], "nats-trace-only": ["TRUE"]},
        {"Nats-Trace-Dest": ["d"], "Nats-Trace-Only": ["0"]},
        {"Nats-Trace-Dest": [""], "Nats-Trace-Only": ["1"]},
        {"Nats-Trace-Only": ["on"]},
        {"nats-trace-dest": [], "Nats-Trace-Dest": ["d"], "NATS-TRACE-ONLY": ["On"], "X-App": ["a"]},
    ]
    for headers in cases:
        changed = _with_headers(p, {"traceparent": [TRACEPARENT], **headers})
        assert _alike(kernel, changed, placement, not_copied) == 0, headers
    spans = [outcome(span_bytes.python_map_encode, _with_headers(p, {"traceparent": [TRACEPARENT], **h}).msg, p.ctx,
                     placement, not_copied) for h in cases]
    assert len({repr(s) for s in spans}) >= 4  # the cases differ in what the server span says
    odd = _with_headers(p, TraceHeaders(("traceparent", TRACEPARENT, "Nats-Trace-Hop", ["h1"])))  # a list: not its form
    result, count = handed(kernel, "map", kernel.map_encode, odd.msg, odd.ctx, placement, not_copied)
    assert count == 1 and result == outcome(span_bytes.python_map_encode, odd.msg, odd.ctx, placement, not_copied)
