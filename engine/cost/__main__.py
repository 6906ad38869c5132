"""``python -m engine.cost``: see `engine.cost.cli`."""

from engine.cost.cli import main

raise SystemExit(main())
