"""Every command line's ``--help`` explains every flag.

Each CLI's parser is built the way its ``main`` builds it, but not run: `_capture_parser` stops
``main`` at ``parse_args`` and hands back the parser. A flag without ``help=`` shows in
``--help`` as a bare name (``--block-size BLOCK_SIZE``), which tells a newcomer neither its
unit nor its default.

Run: .venv/bin/python -m pytest tests/engine/test_cli_help.py -q
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


# (module, argv that reaches its parser): engine.train causal-lm (or --objective block-diffusion --init-from <a pinned base>)
# and engine.eval on a transformers model dispatch to engine.training.causal_lm / engine.eval.chat, listed by their own name.
CLIS = [
    ("engine.generate", []),
    ("engine.eval", []),
    ("engine.eval.chat", []),
    ("engine.sweep", []),
    ("engine.train", []),
    ("engine.train", ["causal-lm"]),
    ("engine.train", ["causal-lm", "distill"]),
    ("engine.training.causal_lm", []),
    ("engine.training.causal_lm", ["distill"]),
    ("engine.checkpoint", []),
    ("engine.cost", []),
    ("engine.convert", []),
    ("engine.data.tokenizer", []),
    ("engine.data.open_words", []),
]


@pytest.mark.parametrize("module,argv", CLIS, ids=[" ".join([m, *a]) for m, a in CLIS])
def test_every_flag_of_every_cli_has_a_help_text(monkeypatch, module, argv):
    parser = _capture_parser(monkeypatch, module, argv)
    bare = [a.option_strings[0] if a.option_strings else a.dest for a in parser._actions
            if not isinstance(a, argparse._HelpAction) and not (a.help or "").strip()]
    assert not bare, f"python -m {module}: flags without a help text: {bare}"
