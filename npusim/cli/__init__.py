"""The `npusim` command: each module here with a `register(subparsers)` adds one subcommand."""
