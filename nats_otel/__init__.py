"""nats-otel: NATS message-path traces (ADR-41) as OpenTelemetry spans."""

__version__ = "0.2.0"
