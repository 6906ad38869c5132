"""``python -m clover_engine.eval``: the agent-task evaluation (`clover_engine.eval.main`). Wing: ``eval``."""

from clover_engine.eval import main

raise SystemExit(main())
