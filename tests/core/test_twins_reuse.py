"""What the compiled kernel works out once and reuses (issue 39), against working it out
again: a forwarding egress's span id, hashed by the linker when it observes the message and
written by the mapper from there (`Linker._observe`, `_stage_map.map_encode_c`), and a
server's resource, found by the identity of its record's fields (`_stage_map._resource_of`).
Each reused value must be the one computed afresh, byte for byte, whatever the records'
fields. The kernel comes from the `kernel` fixture (skipped under NATS_OTEL_NO_EXTENSIONS=1).
"""

from __future__ import annotations

from msgspec.structs import replace

from nats_otel.core import ids, mapping, pipeline
from nats_otel.core.mapping import MappingOptions
from nats_otel.core.model import Egress


def _forwarding_ids(prepared: pipeline.Prepared) -> tuple[bytes, ...] | None:
    """The span ids `map_message` gives the message's forwarding egresses, hashed afresh."""
    found = tuple(ids.event_span_id(prepared.ctx, prepared.ident, position)
                  for position, event in enumerate(prepared.msg.events, start=1)
                  if type(event) is Egress and event.forwards)
    return found or None


def _as_tuple(egress_ids):
    """A message's egress ids as a tuple: the kernel keeps the one id itself, more in a tuple."""
    return (egress_ids,) if type(egress_ids) is bytes else egress_ids


def _kept(converter):
    """(raw, its record, its egress ids) of each message the kernel's converter decoded and keeps."""
    return [(entry.raw, entry, entry.egress_ids) for entry in converter._pending.values() if type(entry) is not tuple]


def test_the_egress_ids_the_linker_hashed_are_the_mappers(kernel, corpus_raws):
    converter = kernel.Converter()
    converter.observe_many(corpus_raws)
    kept = _kept(converter)
    assert sum(1 for _, _, egress_ids in kept if egress_ids) > 100  # forwarding egresses were compared
    for _, prepared, egress_ids in kept:
        assert _as_tuple(egress_ids) == _forwarding_ids(prepared)
        # the one id itself, held through the window without a tuple of one
        assert type(egress_ids) is not tuple or len(egress_ids) > 1
    # The spans written with the linker's ids are the spans of a mapper hashing each id itself.
    placer = kernel.Linker(bounded=False)
    for _, prepared, _ in kept:
        placer.observe(prepared)
    options = MappingOptions()
    expected = [kernel.map_encode(p.msg, p.ctx, placer.place(p), options)[1] for _, p, _ in kept]
    raws = [raw for raw, _, _ in kept]
    assert [r.encoded.data for r in converter.convert_many(raws, 0.0, True)] == expected


def test_the_mapper_writes_the_ids_it_is_given_and_hashes_the_rest(kernel, corpus_raws):
    converter = kernel.Converter()
    converter.observe_many(corpus_raws)
    raw, record, egress_ids = next(e for e in _kept(converter) if e[2])
    first = _as_tuple(egress_ids)[0]

    def written(given):
        again = kernel.Converter()
        again.observe(raw)
        again._pending[id(raw)] = kernel.with_egress_ids(record, given)
        return again.convert(raw, 0.0, True).encoded.data

    # A stand-in id proves the mapper writes the one it is given, not one it hashed again:
    # given itself, or first in a tuple of them.
    stand_in = b"\xaa" * 8
    for given in (stand_in, (stand_in, *_as_tuple(egress_ids)[1:])):
        data = written(given)
        assert b"\x12\x08" + stand_in in data and b"\x12\x08" + first not in data
    # Too few ids, or not 8 bytes: the mapper hashes those egresses' ids itself.
    for odd in ((), (b"short",), b"short", None):
        assert b"\x12\x08" + first in written(odd)


def test_resources_found_by_the_records_fields_are_the_references(kernel, corpus_raws):
    prepared = pipeline.prepare(next(raw for raw in corpus_raws if pipeline.prepare(raw).msg.server.tags == ()))
    msg, server = prepared.msg, prepared.msg.server
    placement = kernel.Linker(bounded=False).place(prepared)
    # Records sharing the `id` object (one slot of the table), differing in one field or
    # none (a copy: the same fields, not the same record); tags equal but not the same tuple
    # (`tuple("ab")`: made at run time); two service names.
    records = [server, replace(server), replace(server, name=server.name + "-other"),
               replace(server, version="9.9.9"), replace(server, host="elsewhere"), replace(server, cluster="c2"),
               replace(server, domain="d2"), replace(server, jetstream=not server.jetstream),
               replace(server, tags=("a", "b")), replace(server, tags=tuple("ab")),
               replace(server, tags=("a", "c")), server]
    for service_name in ("nats", "{server}@{cluster}", "nats"):
        options = MappingOptions(service_name)
        for record in records + records[::-1]:
            resource = kernel.map_encode(replace(msg, server=record), prepared.ctx, placement, options)[0]
            assert resource == mapping.server_resource(record, service_name)
