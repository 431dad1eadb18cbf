"""`python -m resin_app ...` is the `resin` command (what subprocesses start)."""

from resin_app.cli import main

raise SystemExit(main())
