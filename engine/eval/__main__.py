"""``python -m engine.eval``: the agent-task evaluation (`engine.eval.main`)."""

from engine.eval import main

raise SystemExit(main())
