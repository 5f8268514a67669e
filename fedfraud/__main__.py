"""``python -m fedfraud``: the CLI (what the retrain scheduler runs a cycle with)."""

from fedfraud.cli.app import main

raise SystemExit(main())
