"""What one trace message says about the network: time in the server, the hop that brought
it, and what failed. The live bridge turns these into metrics (`bridge/network_metrics.py`),
with the trace and the server span each sample came from as the buckets' exemplars.

Pure and small on purpose: it runs once per trace message, next to mapping. A hop's latency
needs both sides of it - the upstream server's egress time and this server's ingress time -
so it is known only when `linking` matched the two reports (`pipeline.finish` passes the
egress); a side whose counterpart never came is counted by the link index instead.
"""

from __future__ import annotations

from typing import NamedTuple

from nats_otel.core.ids import server_span_id_of
from nats_otel.core.mapping import is_failure
from nats_otel.core.model import (
    Egress,
    JetStreamEvent,
    TraceMessage,
    kind_label,
)

__all__ = ["HopSample", "NetworkSample", "network_sample"]


class HopSample(NamedTuple):
    """One hop seen from both sides: the message left `from_server` and reached `to_server`
    `latency_ns` later (negative when the two servers' clocks disagree by more than that)."""

    from_server: str
    to_server: str
    kind: str  # router, gateway, leaf
    latency_ns: int


class NetworkSample(NamedTuple):
    """The network facts of one trace message (one server's report)."""

    server: str
    account: str
    subject: str
    in_server_ns: int  # from arrival to the server's last action on the message
    failed: bool  # the server reported an error on the message (status ERROR on a span)
    hop: HopSample | None  # the hop that brought it, when its upstream egress was matched
    #: (to_server, kind) of each forwarding egress that reported an error.
    failed_hops: tuple[tuple[str, str], ...] = ()
    #: What an exemplar of the latencies names: the trace the message's spans were exported
    #: in, and this server's span in it (`span_id`), kept as the two inputs of its id (the
    #: context's `id_fields`, the report's `ident`): hashing it for every message cost about
    #: 0.4 us, and a bucket shows only its last sample. Empty when the caller gave none.
    trace_id: bytes = b""
    id_fields: bytes = b""
    ident: bytes = b""

    @property
    def span_id(self) -> bytes:
        """The id of this server's span (`ids.server_span_id`), or b"" without its inputs."""
        return server_span_id_of(self.id_fields, self.ident) if self.ident else b""


def network_sample(msg: TraceMessage, upstream_egress_ns: int | None, trace_id: bytes = b"",
                   id_fields: bytes = b"", ident: bytes = b"") -> NetworkSample:
    """The facts of `msg`; `upstream_egress_ns` is the matched upstream egress's time, if any;
    `trace_id`, `id_fields` and `ident` (the placement's trace, the context's id fields, the
    report's identity: what names the server span) are carried as given."""
    ingress = msg.ingress
    failed = is_failure(ingress.error)
    failed_hops: tuple[tuple[str, str], ...] = ()  # grown only on a failure (rare): no list per message
    for event in msg.events:
        # Only egresses and JetStream events carry an error; most have none.
        if isinstance(event, _WITH_ERRORS) and event.error and is_failure(event.error):
            failed = True
            if type(event) is Egress and event.forwards:
                failed_hops += ((event.name, kind_label(event.kind)),)
    hop = None
    # Built with `tuple.__new__`: a NamedTuple's own `__new__` is a Python call, per message.
    if upstream_egress_ns is not None:
        hop = _new(HopSample, (ingress.name, msg.server.name, kind_label(ingress.kind),
                               ingress.ts_ns - upstream_egress_ns))
    return _new(NetworkSample, (msg.server.name, ingress.account, ingress.subject, msg.end_ns - ingress.ts_ns,
                                failed, hop, failed_hops, trace_id, id_fields, ident))


# A tuple, not `Egress | JetStreamEvent`: isinstance is several times faster with a tuple.
_WITH_ERRORS = (Egress, JetStreamEvent)
_new = tuple.__new__


# The reference of the kernel's `network_sample` (`_stage_network.pxi`).
python_network_sample = network_sample
