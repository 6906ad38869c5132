"""``python -m clover_explorer COMMAND ...``: the same as ``clover-explorer COMMAND ...`` (`clover_explorer.cli`)."""

from clover_explorer.cli import main

raise SystemExit(main())
