"""Tooling for tests, the demo and load tests: never imported by the core or the bridge.

Real embedded nats-server topologies (`config`, `process`, `topology`), real OTLP test
receivers (`receivers`), the traffic emulator (`emulate`) and the demo (`demo`).
"""
