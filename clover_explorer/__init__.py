"""The ``clover-explorer`` command of the installed package (`clover_explorer.cli`).

Wing: the top, beside ``apps``: it runs the engine's commands and serves the explorer (`clover_viz`);
nothing imports it. Its own module imports nothing heavy, so ``clover-explorer generate`` runs on the
base install (no plotly, no Panel), and ``serve`` asks for the ``viz`` extra only when it runs.
"""
