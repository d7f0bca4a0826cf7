"""`nats-otel` command line: a thin dispatcher to one module per subcommand.

Each subcommand module has `HELP`, `add_arguments(parser)` and `run(args) -> int`, and is
imported only when chosen, so `convert` never loads the NATS client or Spark.
"""

from __future__ import annotations

import argparse
import importlib
import sys

from nats_otel import __version__

__all__ = ["main"]

# name -> module; the order is the order of `nats-otel --help`.
COMMANDS = {
    "demo": "nats_otel.commands.demo",
    "bridge": "nats_otel.commands.bridge",
    "convert": "nats_otel.commands.convert",
    "show": "nats_otel.commands.show",
    "emulate": "nats_otel.commands.emulate",
}


def build_parser(argv: list[str]) -> tuple[argparse.ArgumentParser, dict]:
    parser = argparse.ArgumentParser(
        prog="nats-otel",
        description="NATS message-path traces (ADR-41) as OpenTelemetry spans.",
    )
    parser.add_argument("--version", action="version", version=f"nats-otel {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    chosen = next((a for a in argv if not a.startswith("-")), None)
    modules = {}
    for name, module_name in COMMANDS.items():
        try:
            # Only the chosen command's module is imported for real; the others only
            # need their help line, kept in a tiny import.
            module = importlib.import_module(module_name)
        except ModuleNotFoundError as exc:
            if name == chosen:
                raise SystemExit(f"nats-otel {name}: not available ({exc})") from None
            continue
        modules[name] = module
        command_parser = sub.add_parser(name, help=module.HELP, description=module.HELP)
        module.add_arguments(command_parser)
    return parser, modules


def main(argv: list[str] | None = None) -> int:
    """Entry point of the `nats-otel` console script."""
    argv = sys.argv[1:] if argv is None else argv
    parser, modules = build_parser(argv)
    args = parser.parse_args(argv)
    if not args.command:
        parser.print_help()
        return 2
    try:
        return int(modules[args.command].run(args) or 0)
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        return 0


if __name__ == "__main__":
    sys.exit(main())
