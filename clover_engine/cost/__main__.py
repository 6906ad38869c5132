"""``python -m clover_engine.cost``: see `clover_engine.cost.cli`. Wing: ``cost``."""

from clover_engine.cost.cli import main

raise SystemExit(main())
