"""The live bridge: NATS subscriptions in, OTLP out, with metrics, health and worker processes.

`loop` runs source -> `processor` (the core's convert, then export) -> ack; `workers`
runs the processor in several processes; `sources/` and `export/` do the I/O. Imports
point one way: this package uses `nats_otel.core`, never the other way round.
"""
