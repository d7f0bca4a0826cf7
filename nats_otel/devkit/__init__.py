"""Tooling for tests, the demo and load tests: never imported by the core or the bridge.

Real embedded nats-server topologies: what they are (`topology`), their config files
(`server_config`), their processes (`processes`) and when they have formed (`readiness`);
real OTLP test receivers (`receivers`), the traffic emulator (`emulate`) and the demo (`demo`).
"""
