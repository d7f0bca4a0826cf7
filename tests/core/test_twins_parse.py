"""The compiled kernel's own JSON parse (`_kernel.own_parse`: `_stage_parse.pxi`) against
msgspec's decode (`decode._DOCUMENT`), which it stands in for on the common path: where it
takes a payload, the records it builds equal msgspec's field for field (and type for type);
where it is not sure, it declines (None), and `prepare` then goes the way it went before
(msgspec, then the reference: test_twins_prepare.py compares the outcome). On the corpus,
on fuzzed documents and on byte-level damage to real payloads; its bounds on hostile input;
and the cache of repeated names under more names than it has slots.
"""

from __future__ import annotations

import json

import msgspec
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from nats_otel.core import pipeline
from nats_otel.core.decode import _DOCUMENT, DecodeLimits, RawTraceMessage, decompress
from nats_otel.core.model import TraceHeaders
from tests.core import factories as f
from tests.core.test_fuzz_decode import documents
from tests.core.test_twins_prepare import outcome
from tests.work import least_growth


def msgspec_view(data: bytes):
    """What `prepare` reads of msgspec's decode, as `own_parse` returns it (the server's
    block without the report's number, which comes last); None when msgspec refuses the payload."""
    try:
        doc = _DOCUMENT.decode(data)
    except (msgspec.DecodeError, UnicodeDecodeError, RecursionError, ValueError):
        return None
    server = doc.server
    return (server.info(), doc.events, TraceHeaders.of(doc.request.header), doc.request.msgsize, doc.hops,
            server.seq)


def same_or_declined(kernel, data: bytes, max_events: int = 10_000) -> bool:
    """True when the parse took `data` (and then built what msgspec builds); False when it
    declined. Fails when it took something msgspec refuses or builds otherwise."""
    ours = kernel.own_parse(data, max_events)
    if ours is None:
        return False
    theirs = msgspec_view(data)
    assert theirs is not None, f"taken, but msgspec refuses it: {data[:200]!r}"
    assert ours == theirs
    assert [type(e) for e in ours[1]] == [type(e) for e in theirs[1]]
    assert type(ours[0]) is type(theirs[0])
    assert type(ours[2]) is TraceHeaders  # and laid out alike: two TraceHeaders compare as tuples
    return True


def test_the_corpus_parses_as_msgspec_decodes(kernel, corpus_raws):
    taken = declined = 0
    for raw in corpus_raws:
        data = decompress(raw.payload, raw.header("Content-Encoding"), DecodeLimits())
        if same_or_declined(kernel, data):
            taken += 1
        else:
            declined += 1
            assert b"\\" in data  # the only thing in what servers sent that it leaves to msgspec: escapes
    assert taken > 250 and declined <= 4


def test_prepare_counts_what_the_parse_declines(kernel, corpus_raws):
    plain = corpus_raws[0]
    escaped = RawTraceMessage("trace.a", {}, plain.payload.replace(b'"ver":"', b'"ver":"\\u0032', 1))
    assert b"\\u0032" in escaped.payload
    before = kernel.declined_by_parser()
    assert outcome(kernel.prepare, plain) == outcome(pipeline.python_prepare, plain)
    assert kernel.declined_by_parser() == before
    assert outcome(kernel.prepare, escaped) == outcome(pipeline.python_prepare, escaped)
    assert kernel.declined_by_parser() == before + 1


# --- what it takes, what it declines --------------------------------------------------------

BASE = f.message(f.ingress(), f.egress(t=300, kind=1, name="s2", hop="1"), hops=1)


def _with(**changes) -> bytes:
    doc = json.loads(json.dumps(BASE))
    for path, value in changes.items():
        target = doc
        *parents, last = path.split("__")
        for key in parents:
            target = target[int(key)] if isinstance(target, list) else target[key]
        target[int(last) if isinstance(target, list) else last] = value
    return json.dumps(doc, ensure_ascii=False).encode()


TAKEN = [
    _with(),
    _with(server__feature_flags={"a": True, "b": [1, -2, None, {"c": "d"}]}, server__flags=0, x=[]),
    _with(server__tags=["a", "b"], server__jetstream=True, server__seq=10**18 - 1, server__time=f.ts(5)),
    _with(server__time=None, server__domain="é-ü", server__name="服务器"),
    # the server's `time`: any string or null, neither read nor kept (`ServerReport`)
    _with(server__time="not a time"), _with(server__time="é"),
    _with(server__time_ns=5),
    _with(events__0__ts="2026-11-22T02:16:30+01:00"),  # not the servers' form: the hook's function
    _with(events__0__ts="2026-11-22T02:16:30Z", events__1__error="boom", events__0__account="ignored"),
    _with(request__header={"Traceparent": [f.TRACEPARENT], "X-É": ["é", ""], "Empty": []}),
    _with(request={}), _with(request__msgsize=0),
    b' \n{ "server" : {"name":"a","id":"b"} ,\t"events":[{"type":"in","ts":"2026-11-22T02:16:30Z","kind":0}] }\r\n',
    (b'{"events":[{"type":"in","kind":0,"ts":"2026-11-22T02:16:30.1Z"},{"type":"sm","ts":"2026-11-22T02:16:30Z"},'
     b'{"type":"se","ts":"2026-11-22T02:16:30Z","acc":"B","to":"t"},{"type":"si","ts":"2026-11-22T02:16:30Z",'
     b'"from":"f"},{"type":"js","ts":"2026-11-22T02:16:30Z","nointerest":true}],"server":{"id":"b","name":"a"}}'),
]

COMPACT = json.dumps(BASE, separators=(",", ":")).encode()

DECLINED = [
    _with(events__0__name="a\\b"),  # an escape (json.dumps writes "a\\b")
    _with(server__seq=2**63), _with(hops=-1), _with(request__msgsize=1.0), _with(events__0__kind=-1),
    _with(events__0__kind=10**18),
    _with(events__0__ts_ns=5),  # a field it does not read
    _with(events__0__ts="not a time"), _with(events__0__ts="1969-12-31T23:59:59Z"),
    _with(server__jetstream=1), _with(server__tags="a"), _with(request__header={"a": "b"}),
    _with(request=None), _with(server__time=5), _with(server__time=["t"]),
    _with(x={"a": [[[[[[[[[[1]]]]]]]]]]}),  # skipped, but nested deeper than it checks
    _with(x=1.5), _with(x="é"), _with(x=10**20),
    json.dumps({"events": BASE["events"][::-1], "server": BASE["server"]}).encode(),  # ingress not first
    json.dumps({"events": [], "server": BASE["server"]}).encode(),
    json.dumps({"events": BASE["events"]}).encode(),  # no server
    json.dumps({"server": BASE["server"], "events": [{"ts": f.ts(1), "type": "in", "kind": 0}]}).encode(),
    json.dumps({"server": BASE["server"], "events": [f.ingress(), {"type": "zz", "ts": f.ts(1)}]}).encode(),
    json.dumps({"server": BASE["server"], "events": [f.ingress(), f.ingress()]}).encode(),
    COMPACT + b" x", COMPACT[:-1], b"[]", b"", b"{}",
    COMPACT.replace(b'"hops":1', b'"hops":1,"hops":1'),
    COMPACT.replace(b'"name":"pub"', b'"name":"pub","name":"pub"'),
    COMPACT.replace(b'"traceparent"', b'"a":[],"a"'),
    COMPACT.replace(b'"pub"', b'"p\x01b"'),  # a control character
    COMPACT.replace(b'"pub"', b'"p\xffb"'),  # not UTF-8
    COMPACT.replace(b'"pub"', b'"p\xed\xa0\x80b"'),  # a surrogate in UTF-8
    _with(server__time="a\\u00e9"),  # an escape in the server's time, as anywhere: msgspec reads it
    _with(server__time="TIME").replace(b'"TIME"', b'"\\q"'),  # and refuses a broken one
    _with(server__time="TIME").replace(b'"TIME"', b'"\xff"'),  # its UTF-8 checked: not UTF-8
    _with(server__time="TIME").replace(b'"TIME"', b'"\xed\xa0\x80"'),  # a surrogate in UTF-8
    COMPACT.replace(b'"hops":1', b'"hops":01'),
    COMPACT.replace(b'"hops":1', b'"hops":1e0'),
]


@pytest.mark.parametrize("data", TAKEN)
def test_takes_the_common_shapes_and_builds_what_msgspec_builds(kernel, data):
    assert same_or_declined(kernel, data)


@pytest.mark.parametrize("data", DECLINED)
def test_declines_what_it_is_not_sure_of_and_prepare_still_agrees(kernel, data):
    assert kernel.own_parse(data) is None
    raw = RawTraceMessage("trace.a", {}, data)
    assert outcome(kernel.prepare, raw) == outcome(pipeline.python_prepare, raw)


def test_max_events_bounds_it(kernel):
    events = [f.ingress()] + [f.egress(t=200 + i) for i in range(9)]
    data = json.dumps(f.message(*events)).encode()
    assert kernel.own_parse(data, 10) is not None
    assert kernel.own_parse(data, 9) is None
    limits = DecodeLimits(max_events=9)
    raw = RawTraceMessage("trace.a", {}, data)
    assert outcome(kernel.prepare, raw, limits) == outcome(pipeline.python_prepare, raw, limits)


# --- fuzzed -----------------------------------------------------------------------------------

@settings(max_examples=600, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(doc=documents(), ascii_only=st.booleans(), spaced=st.booleans())
def test_fuzzed_documents_parse_as_msgspec_decodes(kernel, doc, ascii_only, spaced):
    try:
        data = json.dumps(doc, ensure_ascii=ascii_only, indent=1 if spaced else None).encode()
    except UnicodeEncodeError:  # a lone surrogate the generator drew
        return
    same_or_declined(kernel, data, 200)


# Texts the parse takes (any UTF-8 but escapes and control characters: names, header names
# and values, tags), timestamps at and past the edges of the servers' form, cids at 10**18.
_TEXTS = st.text(alphabet=st.characters(codec="utf-8", exclude_categories=("Cc", "Cs"), exclude_characters='"\\'),
                 max_size=70)
_STAMPS = st.builds(lambda y, mo, d, h, mi, s, frac: f"{y:04d}-{mo:02d}-{d:02d}T{h:02d}:{mi:02d}:{s:02d}{frac}Z",
                    st.integers(1960, 2600), st.integers(0, 13), st.integers(0, 32), st.integers(0, 25),
                    st.integers(0, 61), st.integers(0, 62),
                    st.sampled_from(["", ".1", ".123456789", ".1234567890", "."]))


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(name=_TEXTS, header=_TEXTS, value=_TEXTS, server_id=_TEXTS, stamp=_STAMPS, time=_STAMPS,
       cid=st.integers(0, 10**19), tags=st.lists(_TEXTS, max_size=3))
def test_generated_texts_and_stamps_parse_as_msgspec_decodes(kernel, name, header, value, server_id, stamp, time, cid,
                                                             tags):
    doc = f.message(f.ingress(name=name, subj=value, ts=stamp, cid=cid), f.egress(name=name[::-1], hop=value),
                    headers={header: [value, name]}, server_id=server_id)
    doc["server"].update(time=time, tags=tags)
    same_or_declined(kernel, json.dumps(doc, ensure_ascii=False).encode())


@settings(max_examples=600, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(data=st.data())
def test_damaged_real_payloads_parse_as_msgspec_decodes(kernel, corpus_raws, data):
    raw = data.draw(st.sampled_from(corpus_raws[:80]))
    payload = bytearray(decompress(raw.payload, raw.header("Content-Encoding"), DecodeLimits()))
    for _ in range(data.draw(st.integers(1, 3))):
        at = data.draw(st.integers(0, len(payload) - 1))
        action = data.draw(st.sampled_from(["flip", "insert", "delete", "truncate"]))
        byte = data.draw(st.sampled_from([*b'"\\{}[],:0-9 e.-tfn\x00\x80\xff', data.draw(st.integers(0, 255))]))
        if action == "flip":
            payload[at] = byte
        elif action == "insert":
            payload[at:at] = bytes([byte])
        elif action == "delete":
            del payload[at]
        else:
            del payload[at:]
        if not payload:
            return
    same_or_declined(kernel, bytes(payload))


# --- bounds and the cache of names ----------------------------------------------------------

def _x_is(value: bytes) -> bytes:
    """The base document with `value` as the bytes of its unknown member `x`."""
    data = _with(x=None)
    assert data.count(b'"x": null') == 1
    return data.replace(b'"x": null', b'"x": ' + value)


def _events(count: int) -> bytes:
    return json.dumps(f.message(f.ingress(), *[f.egress(t=i % 10**9) for i in range(count)])).encode()


# Each hostile shape at a given size (the test builds it at two sizes): deep nesting in a
# skipped value, a long string, a long nested list, events below `max_events` (taken whole)
# and above it at both sizes (declined at the bound).
HOSTILE = {
    "deep nesting": lambda n: _x_is(b"[" * n + b"]" * n),
    "long string": lambda n: _x_is(b'"' + b"a" * (10 * n) + b'"'),
    "long nested list": lambda n: _x_is(b"[1," * n + b"1" + b"]" * n),
    "events": lambda n: _events(n // 40),
    "more events than max_events": lambda n: _events(n // 4),
}


@pytest.mark.parametrize("shape", list(HOSTILE))
def test_hostile_payloads_cost_what_their_size_says(kernel, shape):
    """Four times the bytes cost at most about four times the work (quadratic would be 16):
    the growth of the parse's cost between two sizes, measured in this process, not a time
    (measured again when it reads high: `least_growth`)."""
    small, large = HOSTILE[shape](50_000), HOSTILE[shape](200_000)
    assert least_growth(lambda data: kernel.own_parse(data, 10_000), small, large, below=8) < 8


def test_the_growth_check_sees_a_quadratic_parse():
    """The control: a parse that re-reads what it has read (quadratic) fails the same check,
    in each of the measurements `least_growth` makes."""
    small, large = HOSTILE["long string"](2_000), HOSTILE["long string"](8_000)

    def rereads(data: bytes) -> int:
        return sum(data[:i].count(b"a") for i in range(0, len(data), 64))

    assert least_growth(rereads, small, large, below=8) > 8


def test_many_more_names_than_cache_slots_stay_exact(kernel):
    for i in range(5000):
        names = {"name": f"conn-{i}", "acc": f"A{i % 7}", "subj": f"s.{i}.x" * (1 + i % 9)}
        doc = f.message(f.ingress(**names), f.egress(name=f"e{i * 7919}"), server=f"srv-{i % 1500}",
                        headers={f"h-{i}": [f"v{i}"], "traceparent": [f.TRACEPARENT]})
        assert same_or_declined(kernel, json.dumps(doc).encode())


def test_skipped_members_seen_before_are_decided_as_the_first_time(kernel):
    """The parse keeps the last few objects and arrays it skipped (a server's `feature_flags`
    repeat in each report): a value with those bytes is taken whole, and one that only begins
    like one of them - longer, cut short, nested deeper, other keys - is checked anew, and
    decided as msgspec decides it, whatever was skipped before."""
    flags = {"js_ack_fc_v2": False, "js_api_reply_v2": False, "js_raft_delete_range": True}
    variants = [
        flags, {**flags, "more": True}, {**flags, "js_raft_delete_range": False}, {"js_ack_fc_v2": False},
        [1, 2, {"a": "b"}], [1, 2, {"a": "b"}, 3], [1, 2], {}, [],
        {"a": [[[[[[[1]]]]]]]}, {"a": [[[[[[[[1]]]]]]]]},  # 8 deep in all: checked; 9: declined
        {"a": "é"}, {"a": 1.5}, {"a": "x\\y"},  # declined: not ASCII, a fraction, an escape
    ]
    compact = [json.dumps(v, separators=(",", ":"), ensure_ascii=False) for v in variants]
    texts = compact + [c + " " for c in compact]  # the same bytes, then a space before the next member
    decided = {}
    for rounds in range(3):  # more distinct values than the kernel keeps: each seen again, in turns
        for i in range(len(texts)) if rounds % 2 == 0 else reversed(range(len(texts))):
            text = texts[i]
            data = COMPACT.replace(b'"server":{', b'"server":{"feature_flags":' + text.encode() + b",", 1)
            assert data != COMPACT
            taken = same_or_declined(kernel, data)
            assert decided.setdefault(i, taken) == taken, (text, rounds)
            if not taken:
                raw = RawTraceMessage("trace.a", {}, data)
                assert outcome(kernel.prepare, raw) == outcome(pipeline.python_prepare, raw)
    # Bytes equal to a kept value, but the document ends inside it: never read past the end.
    cut = COMPACT.replace(b'"server":{', b'"server":{"feature_flags":' + compact[0].encode(), 1)
    for end in range(len(cut) - 40, len(cut)):
        assert kernel.own_parse(cut[:end]) is None
    assert sum(decided.values()) >= 16 and not all(decided.values())


@pytest.mark.parametrize("where", ["name", "last"])
def test_strings_end_where_msgspec_says_at_every_offset(kernel, where):
    """The scan for a string's end (`_json_scan.h`: 16 bytes at a time, then 8, then one):
    a quote, an escape, a control character or a non-ASCII character at every position of
    strings 0 to 40 bytes long, inside a document (`name`: the server's name) and as its last
    value (`last`: the buffer ends a few bytes after the string, where the wide reads stop)."""
    for length in range(41):
        for position in range(max(length, 1)):
            for odd in ("", "é", "\\\\", "\\u0041", "\x01", "\x7f", "\U0001f600"):
                text = ("a" * position + odd + "b" * length)[: length + len(odd)]
                value = json.dumps(text, ensure_ascii=False)[1:-1] if odd != "\x01" else text
                if where == "name":
                    data = COMPACT.replace(b'"server":{', b'"server":{"name":"' + value.encode() + b'",', 1)
                    data = data.replace(b'"name":"s1",', b"", 1)
                else:
                    data = COMPACT[:-1] + b',"x":"' + value.encode() + b'"}'
                taken = same_or_declined(kernel, data)
                plain = "\\" not in value and "\x01" not in value and (where == "name" or value.isascii())
                assert taken == plain, (where, length, position, odd, data[-60:])


def test_timestamps_after_a_known_date_are_checked_whole(kernel):
    """The parse keeps the last date it read (a server's reports share it): a timestamp with
    that date and any time - valid or not, any precision - is decided as msgspec decides it,
    and so is one whose date differs in one character."""
    date = "2026-11-22"
    times = ["T02:16:30Z", "T02:16:30.123456789Z", "T23:59:60Z", "T24:00:00Z", "T02:60:00Z", "T02:16:30.Z",
             "T02:16:30.1234567890Z", "t02:16:30z", " 02:16:30Z", "X02:16:30Z", "T02-16:30Z", "T02:16:30+01:00",
             "T0a:16:30Z", "T02:16:30"]
    dates = [date, "2026-11-23", "2026-13-22", "2026-11-32", "1969-11-22", "2026/11/22", "2O26-11-22", "2201-01-01"]
    taken = 0
    for other in dates:
        for time in times:
            for stamp in (date + times[0], other + time, date + time):  # the known date, then each in turn
                data = COMPACT.replace(f'"ts":"{f.ts(100)}"'.encode(), f'"ts":"{stamp}"'.encode(), 1)
                assert data != COMPACT
                taken += same_or_declined(kernel, data)
                raw = RawTraceMessage("trace.a", {}, data)
                assert outcome(kernel.prepare, raw) == outcome(pipeline.python_prepare, raw), stamp
    assert taken > 100


# --- a server's members before its numbers, kept ---------------------------------------------

def _server_doc(server: dict) -> bytes:
    """The base document with `server` (a dict, its members in order) as its server object."""
    doc = json.loads(json.dumps(BASE))
    doc["server"] = server
    return json.dumps(doc, separators=(",", ":")).encode()


def _reported(i: int, seq: int, time: int = 5, **extra) -> dict:
    """Server i's object as a server sends it: the same members, then its numbers."""
    return {"name": f"east-{i}", "host": "127.0.0.1", "id": f"NBPCNIC6DYZOIO5BHM6DUUGI7E7ZTAQB3RIH7PGSS-{i:04d}",
            "cluster": "east", "ver": "2.15.1", "feature_flags": {"js_ack_fc_v2": False}, "jetstream": False,
            "flags": 0, "seq": seq, "time": f.ts(time), **extra}


def test_a_servers_members_before_its_numbers_kept_are_decided_as_the_first_time(kernel):
    """The parse keeps, for the last servers seen, the bytes of a server object before its
    first number (`seq`, `time`) and the record they gave; an object beginning with those
    bytes is a copy of it, the rest read as always. Whatever follows the kept bytes - other
    numbers, members after them, a kept member given again, an object cut short, the end of
    the object where a member should be - is decided as msgspec decides it, for more servers
    than there are slots, in turns."""
    kernel.forget_kept()
    hits = kernel.kept_hits()["prefix"]
    for rounds in range(3):
        for i in range(40):  # more servers than slots
            for seq in (1 + rounds, 2**40 + i):
                assert same_or_declined(kernel, _server_doc(_reported(i, seq, time=seq % 1000)))
    assert kernel.kept_hits()["prefix"] - hits >= 40  # kept, and used (the same servers again)

    # After bytes that are kept: what follows them decided anew each time.
    kept = _server_doc(_reported(7, 1))
    assert same_or_declined(kernel, kept) and same_or_declined(kernel, kept)
    before = kernel.kept_hits()["prefix"]
    variants = [
        _reported(7, 9, tags=["a", "b"]),                          # a member after the numbers
        _reported(7, 9, name="again"),                             # a kept member given again
        {**_reported(7, 9), "time": None},                         # null time
        {k: v for k, v in _reported(7, 9).items() if k != "seq"},  # time first
        {**_reported(7, 9), "cluster": "west"},                    # same keys, a kept value differs
    ]
    for server in variants:
        data = _server_doc(server)
        taken = same_or_declined(kernel, data)
        if not taken:
            raw = RawTraceMessage("trace.a", {}, data)
            assert outcome(kernel.prepare, raw) == outcome(pipeline.python_prepare, raw)
    assert kernel.kept_hits()["prefix"] - before >= 3
    # The kept bytes, then not a member where one must be: declined; cut short: declined,
    # never read past the end; then a member other than the one kept after them: taken.
    at = kept.index(b'"seq"')
    rest = kept[at + len(b'"seq":1,'):]  # from `"time"` on
    for wrong in (b"}", b"]", b",", b'"seq"'):
        assert kernel.own_parse(kept[:at] + wrong + rest) is None
    assert same_or_declined(kernel, kept[:at] + rest)
    for end in range(at - 10, len(kept)):
        assert kernel.own_parse(kept[:end]) is None


def test_a_servers_reports_share_its_one_record_and_keep_their_own_numbers(kernel):
    """A report whose server object begins with kept bytes is given the kept record itself
    (its numbers are the report's: `seq`; `time` not kept); a member of the record after the
    numbers makes the report a copy with it, and the kept record stays as it was."""
    kernel.forget_kept()
    first = kernel.own_parse(_server_doc(_reported(3, 1, time=1)))
    reports = [kernel.own_parse(_server_doc(_reported(3, seq, time=seq % 1000))) for seq in (2, 3, 2**40)]
    assert all(r[0] is reports[0][0] for r in reports) and first[0] == reports[0][0]
    assert [r[5] for r in reports] == [2, 3, 2**40] and len(reports[0]) == 6  # each its own seq
    shared = reports[0][0]
    # A member of the record after the numbers: a copy with it, the shared record untouched.
    for extra in ({"jetstream": True}, {"tags": ["a"]}, {"domain": "d"}):
        data = _server_doc(_reported(3, 4, **extra))
        assert same_or_declined(kernel, data)
        own = kernel.own_parse(data)[0]
        assert own is not shared and own != shared
        assert shared == msgspec_view(_server_doc(_reported(3, 5)))[0]
    # The numbers absent, or null: the report's defaults, the record still the shared one.
    for server in ({k: v for k, v in _reported(3, 1).items() if k not in ("seq", "time")},
                   {**_reported(3, 6), "time": None}):
        data = _server_doc(server)
        assert same_or_declined(kernel, data)
        assert kernel.own_parse(data)[0] is shared or "seq" not in server  # no numbers: no prefix cut
    # Prepared by the kernel: the same record for the server's messages, as the reference's equal.
    raws = [RawTraceMessage("trace.a", {}, _server_doc(_reported(3, seq, time=seq))) for seq in (7, 8)]
    ours = [kernel.prepare(raw) for raw in raws]
    assert ours[0].msg.server is ours[1].msg.server
    assert [p.msg.seq for p in ours] == [7, 8]
    assert [outcome(kernel.prepare, raw) for raw in raws] == [outcome(pipeline.python_prepare, raw) for raw in raws]


def test_a_long_server_object_is_not_kept(kernel):
    """What is kept is bounded: members of more than 2 KiB before the numbers are parsed each
    time, not kept."""
    kernel.forget_kept()
    server = {"name": "big", "id": "x", "notes": "n" * 5000, "seq": 1, "time": f.ts(1)}
    before = kernel.kept_hits()["prefix"]
    for seq in range(1, 5):
        assert same_or_declined(kernel, _server_doc({**server, "seq": seq}))
    assert kernel.kept_hits()["prefix"] == before


def _event_doc(*events: dict) -> bytes:
    return json.dumps(f.message(*events), separators=(",", ":")).encode()


def test_an_events_members_after_its_ts_kept_are_decided_as_the_first_time(kernel):
    """An event's members after its `ts` (the connection, its account, the subject) are kept
    with the record they ended; an event whose `ts` is followed by the same bytes takes
    those fields. Other stamps, other subjects, an egress and an ingress whose members read
    alike, a member given again, more connections than slots, in turns: each decided as
    msgspec decides it."""
    kernel.forget_kept()
    before = kernel.kept_hits()["rest"]
    for rounds in range(3):
        for i in range(150):  # 80 connections: more than slots
            c = i % 40
            ingress = f.ingress(t=rounds * 1000 + i, name=f"conn-{c}", subj=f"orders.{c % 7}.new")
            egress = f.egress(t=rounds * 1000 + i + 5, kind=1, name=f"s{c}", hop=f"{c % 3}")
            assert same_or_declined(kernel, _event_doc(ingress, egress))
    assert kernel.kept_hits()["rest"] - before >= 200  # kept, and used
    # After kept bytes: the same members under another type, a kept member given before
    # its `ts`, a stamp that is not one, an object cut short.
    same = {"kind": 0, "cid": 5, "name": "pub-x", "acc": "A", "subj": "orders.same.new"}
    assert same_or_declined(kernel, _event_doc({"type": "in", "ts": f.ts(1), **same}))
    assert same_or_declined(kernel, _event_doc({"type": "in", "ts": f.ts(2), **same}))
    # A key given twice (before the `ts` and in the kept bytes) is msgspec's to decide.
    twice = _event_doc({"type": "in", "ts": f.ts(9), **same}).replace(b'"type":"in","ts"', b'"type":"in","kind":1,"ts"')
    assert twice.count(b'"kind"') == 2 and kernel.own_parse(twice) is None
    variants = [
        [{"type": "in", "ts": f.ts(3), **same}, {"type": "eg", "ts": f.ts(4), **same}],  # an egress, alike
        [{"type": "in", "kind": 0, "ts": f.ts(5), **same}],  # `kind` before `ts`, then again
        [{"type": "in", "ts": "not a time", **same}],
        [{"type": "in", "ts": f.ts(6), **same, "extra": [1, 2]}],
        [{"type": "in", "ts": f.ts(7), **{k: v for k, v in same.items() if k != "acc"}}],
    ]
    for events in variants:
        data = _event_doc(*events)
        if not same_or_declined(kernel, data):
            raw = RawTraceMessage("trace.a", {}, data)
            assert outcome(kernel.prepare, raw) == outcome(pipeline.python_prepare, raw)
    data = _event_doc({"type": "in", "ts": f.ts(8), **same})
    for end in range(data.index(b'"kind"'), len(data)):
        assert kernel.own_parse(data[:end]) is None
