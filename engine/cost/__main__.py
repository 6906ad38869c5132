"""``python -m engine.cost``: see `engine.cost.cli`. Wing: ``cost``."""

from engine.cost.cli import main

raise SystemExit(main())
