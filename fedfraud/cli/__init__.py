"""The ``fedfraud`` command line: one module per subcommand, discovered by :mod:`fedfraud.cli.app`."""
