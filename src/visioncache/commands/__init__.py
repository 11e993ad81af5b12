"""One module per ``visioncache`` subcommand, each with ``add_parser(subparsers)`` and
``run(args) -> int`` (`visioncache.cli` dispatches)."""
