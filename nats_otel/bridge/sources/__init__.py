"""Where trace messages come from: archive files, NATS core subscriptions, JetStream."""
