"""``python -m engine.eval``: the agent-task evaluation (`engine.eval.main`). Wing: ``eval``."""

from engine.eval import main

raise SystemExit(main())
