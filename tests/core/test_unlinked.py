"""`pipeline.unlinked`: the reports the bridge maps at once, without the link window. Each
one converts to the same result whenever it is converted (before or after the rest of its
trace was observed and converted), on both cores; a downstream report is never among them."""

from __future__ import annotations

import pytest

from nats_otel.core.decode import RawTraceMessage
from nats_otel.core.pipeline import Prepared, unlinked


@pytest.mark.parametrize("encoded", [False, True])
def test_the_unlinked_convert_alike_at_once_and_after_the_window(core, corpus_raws, encoded: bool) -> None:
    raws = list(corpus_raws)
    late = core.Converter()  # the bridge before: every report waits, then the batch converts
    late.observe_many(raws, 0.0)
    expected = late.convert_many(raws, 0.5, encoded)

    early = core.Converter()
    early.observe_many(raws, 0.0)
    now = unlinked(early, raws)
    first = dict(zip(now, early.convert_many([raws[i] for i in now], 0.0, encoded), strict=True))
    rest = [i for i in range(len(raws)) if i not in first]
    after = dict(zip(rest, early.convert_many([raws[i] for i in rest], 0.5, encoded), strict=True))
    got = [first[i] if i in first else after[i] for i in range(len(raws))]
    assert got == expected
    # Both kinds are in the corpus: origin reports (mapped at once) and downstream ones.
    assert 0 < len(now) < len(raws)
    for position, raw in enumerate(raws):
        prepared = core.prepare(raw)
        assert (position in first) == (type(prepared) is Prepared and prepared.arrival is None)


def test_only_what_was_observed_is_unlinked(core, corpus_raws) -> None:
    """A message not observed (or forgotten), or an equal one in another object, waits."""
    raws = list(corpus_raws)
    converter = core.Converter()
    converter.observe_many(raws[:10], 0.0)
    origin = unlinked(converter, raws[:10])
    assert origin and unlinked(converter, raws[10:]) == []
    copy = [RawTraceMessage(r.subject, r.headers, r.payload) for r in raws[:10]]
    assert unlinked(converter, copy) == []
    converter.convert_many(raws[:10], 0.0)
    assert unlinked(converter, raws[:10]) == []  # converted: no longer waiting


def test_a_rejected_message_is_unlinked(core) -> None:
    bad = RawTraceMessage("trace.x", {}, b"not json")
    converter = core.Converter()
    converter.observe_many([bad], 0.0)
    assert unlinked(converter, [bad]) == [0]
    assert type(converter.convert(bad)).__name__ == "Rejected"
