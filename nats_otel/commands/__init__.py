"""One module per `nats-otel` subcommand: HELP, add_arguments(parser), run(args)."""
