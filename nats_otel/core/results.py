"""What converting a trace message gives (`Converted`, or `Rejected`), and a batch of those
made into one export request (`encode_results`, `tally_results`, `EncodedBatch`).

The records every program reads (the bridge, `convert`, the backfill); `pipeline` makes
them. A leaf of the core: the kernel (`_stage_convert.pxi`, `_stage_batch.pxi`) makes the
same records and compares against these functions, its references.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import overload

from msgspec import Struct

from nats_otel.core.network import NetworkSample
from nats_otel.core.records import SpanRecord
from nats_otel.core.span_bytes import EncodedSpans, encode_request

__all__ = ["Converted", "EncodedBatch", "Rejected", "encode_results", "tally_results"]


class Converted(Struct, frozen=True, gc=False):
    """The spans of one trace message, and what was odd about it (logged and counted).

    `link` is "" for an origin report, else how its upstream egress was found
    (`linking.MATCHED`, `UNMATCHED`, `AMBIGUOUS`). Converted with `encoded=True`, the spans
    come as protobuf in `encoded` (`span_bytes`), and `spans` is empty.
    """

    spans: list[SpanRecord]
    issues: list[str] = []
    link: str = ""
    #: Time in the server, the hop that brought it, failures: for the live network metrics.
    network: NetworkSample | None = None
    encoded: EncodedSpans | None = None

    @property
    def span_count(self) -> int:
        """How many spans it gave, as records or encoded."""
        return self.encoded.span_count if self.encoded is not None else len(self.spans)


class Rejected(Struct, frozen=True, gc=False):
    """A trace message that gave no spans: `reason` is a metric label, `detail` the why."""

    reason: str
    detail: str
    subject: str | None = None


def encode_results(results: Sequence[Converted | Rejected], held: frozenset[int] = frozenset()) -> tuple[bytes, int]:
    """The export request of a batch converted with `encoded=True` (`encode_request` of each
    `Converted` result's spans, but those at the positions in `held`) and its span count; b""
    when it has none. One pass: the bridge's per-batch step after `convert_many`."""
    items = [r.encoded for at, r in enumerate(results)
             if isinstance(r, Converted) and r.encoded is not None and at not in held]
    spans = sum(item.span_count for item in items)
    return (encode_request(items) if spans else b""), spans


def tally_results(results: Sequence[Converted | Rejected]) -> tuple[int, dict[str, int], list[str],
                                                                     list[NetworkSample]]:
    """What the bridge counts of a batch's results (`accounting`): how many were converted,
    their hop links by how each was found (origins, with no link, not counted), their mapping
    issues in order, and their network samples. One pass, on the event loop, per batch."""
    converted = [r for r in results if isinstance(r, Converted)]
    links: dict[str, int] = {}
    for result in converted:
        if result.link:
            links[result.link] = links.get(result.link, 0) + 1
    issues = [issue for r in converted if r.issues for issue in r.issues]
    samples = [r.network for r in converted if r.network is not None]
    return len(converted), links, issues, samples


class EncodedBatch(Sequence["Converted | Rejected"]):
    """A batch converted straight into its export request (`Converter.convert_encoded`): the
    request and its span count (`encode_results`), what the bridge counts of it (`decoded`,
    `links`, `issues`, `samples`: `tally_results`) and, as a sequence, each message's result,
    in order, as `convert_many(raws, now, True, observed)` gives them.

    This reference converts with `convert_many` and keeps the results. The kernel's twin
    (`_stage_batch.pxi`) writes each message's spans into the request as it maps it and
    makes a message's `Converted` only when asked (indexing or iterating the batch: a backend
    refusing the batch, worker processes): on the bridge's path the results were made, their
    spans copied into the request, counted and freed, about a tenth of its CPU in issue 48's
    burst (docs/performance.md, session 49)."""

    __slots__ = ("_results", "decoded", "issues", "links", "rejected", "request", "samples", "spans")

    def __init__(self, results: list[Converted | Rejected]) -> None:
        self._results = results
        self.request, self.spans = encode_results(results)
        self.decoded, self.links, self.issues, self.samples = tally_results(results)
        #: The `Rejected` among the results, in order: what accounting logs, without the
        #: results made.
        self.rejected = [r for r in results if isinstance(r, Rejected)]

    def __len__(self) -> int:
        return len(self._results)

    @overload
    def __getitem__(self, index: int) -> Converted | Rejected: ...

    @overload
    def __getitem__(self, index: slice) -> list[Converted | Rejected]: ...

    def __getitem__(self, index: int | slice) -> Converted | Rejected | list[Converted | Rejected]:
        return self._results[index]

    def __iter__(self) -> Iterator[Converted | Rejected]:
        return iter(self._results)
