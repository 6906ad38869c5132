"""Every command line's ``--help`` explains every flag.

Each CLI's parser is built the way its ``main`` builds it, but not run: `_capture_parser` stops
``main`` at ``parse_args`` and hands back the parser. A flag without ``help=`` shows in
``--help`` as a bare name (``--block-size BLOCK_SIZE``), which tells a newcomer neither its
unit nor its default.

Run: .venv/bin/python -m pytest tests/clover_engine/test_cli_help.py -q
"""

from __future__ import annotations

import argparse
import importlib

import pytest


class _Built(Exception):
    def __init__(self, parser: argparse.ArgumentParser):
        super().__init__(parser.prog)
        self.parser = parser


def _capture_parser(monkeypatch, module: str, argv: list[str]) -> argparse.ArgumentParser:
    """The parser ``module.main(argv)`` builds, captured at its ``parse_args`` (nothing runs)."""

    def stop(self, *args, **kwargs):
        raise _Built(self)

    monkeypatch.setattr(argparse.ArgumentParser, "parse_args", stop)
    main = importlib.import_module(module).main
    with pytest.raises(_Built) as built:
        main(argv)
    return built.value.parser


# (module, argv that reaches its parser): clover_engine.train causal-lm (or --objective block-diffusion --init-from <a pinned base>)
# and clover_engine.eval on a transformers model dispatch to clover_engine.training.causal_lm / clover_engine.eval.chat, listed by their own name.
CLIS = [
    ("clover_engine.generate", []),
    ("clover_engine.eval", []),
    ("clover_engine.eval.chat", []),
    ("clover_engine.sweep", []),
    ("clover_engine.train", []),
    ("clover_engine.train", ["causal-lm"]),
    ("clover_engine.train", ["causal-lm", "distill"]),
    ("clover_engine.training.causal_lm", []),
    ("clover_engine.training.causal_lm", ["distill"]),
    ("clover_engine.checkpoint", []),
    ("clover_engine.cost", []),
    ("clover_engine.plan", []),
    ("clover_engine.convert", []),
    ("clover_engine.data.tokenizer", []),
    ("clover_engine.data.open_words", []),
]


@pytest.mark.parametrize("module,argv", CLIS, ids=[" ".join([m, *a]) for m, a in CLIS])
def test_every_flag_of_every_cli_has_a_help_text(monkeypatch, module, argv):
    parser = _capture_parser(monkeypatch, module, argv)
    bare = [a.option_strings[0] if a.option_strings else a.dest for a in parser._actions
            if not isinstance(a, argparse._HelpAction) and not (a.help or "").strip()]
    assert not bare, f"python -m {module}: flags without a help text: {bare}"
