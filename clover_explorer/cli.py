"""``clover-explorer``: the one command of the installed package (``pyproject.toml``'s ``[project.scripts]``).

Wing: the top (`clover_explorer`). Each engine subcommand hands its arguments,
unchanged, to the ``main`` of the ``python -m clover_engine.<tool>`` command it names (`TOOLS`), so the flags and
their ``--help`` are that command's; the other two are the explorer and the tutorials::

    clover-explorer serve [--port 5006] [--show] [--model-root DIR]... [--model-id ORG/NAME]... [panel serve options]
    clover-explorer generate --example "agent tool call"      # = python -m clover_engine.generate ...
    clover-explorer eval | sweep | train | convert | cost | plan ...  # = python -m clover_engine.<tool> ...
    clover-explorer tutorials DIR                             # copy the notebooks into DIR

Tests: ``.venv/bin/python -m pytest tests/test_wheel.py tests/test_cli.py -q``
"""

from __future__ import annotations

import argparse
import importlib
import shutil
import sys
from collections.abc import Sequence
from pathlib import Path

TOOLS: dict[str, tuple[str, str]] = {  # subcommand -> ("module:function" called with the argv, what it does)
    "generate": ("clover_engine.generate:main", "decode one prompt and print the text and its summary line"),
    "eval": ("clover_engine.eval:main", "score a model on the held-out tasks (writes its eval.json)"),
    "sweep": ("clover_engine.sweep:main", "decode a grid of settings x models x tasks, resumable, each cell against "
              "its careful decode (a frontier table and plot per model)"),
    "train": ("clover_engine.train:main", "train a model (the clover recipe, or causal-lm to adapt a transformers model)"),
    "convert": ("clover_engine.convert:main", "convert a transformers checkpoint to a Clover one"),
    "cost": ("clover_engine.cost.cli:main", "the cost model: bytes, FLOPs and tokens/s projected to a device"),
    "plan": ("clover_engine.plan:main", "a checkpoint's memory per device with its experts split over N devices, "
             "from the safetensors headers only"),
}
"""Imported only when run (a registry of names, as transformers' auto classes): ``--help`` stays fast, and
the engine's commands need nothing the ``viz`` extra brings."""
DEFAULT_PORT = 5006
DESCRIPTION = ("Clover Explorer: the explorer app, the engine's commands (each takes the flags of python -m "
               "clover_engine.<command>; see clover-explorer <command> --help) and the tutorials.")


def tutorials_dir() -> Path:
    """The tutorials: the installed wheel's ``clover_explorer/tutorials`` (setup.py), else the checkout's
    ``notebooks/``."""
    here = Path(__file__).resolve().parent
    return here / "tutorials" if (here / "tutorials").is_dir() else here.parent / "notebooks"


def build_parser() -> argparse.ArgumentParser:
    """The ``clover-explorer`` parser: one subparser per command (the engine tools parse their own argv)."""
    p = argparse.ArgumentParser(prog="clover-explorer", description=DESCRIPTION)
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")
    serve = sub.add_parser("serve", help="open the explorer app in the browser (panel serve)",
                           description="Serve the explorer at http://localhost:PORT/explorer; options not "
                                       "listed here go to `panel serve` as they are.")
    serve.add_argument("--port", type=int, default=DEFAULT_PORT, help=f"port to serve on (default {DEFAULT_PORT})")
    serve.add_argument("--show", action="store_true", help="open the page in a browser")
    serve.add_argument("--model-root", action="append", default=[], metavar="DIR",
                       help="a folder visitors may load models from (repeatable; default ./runs and ./models; "
                            "the bundled models always)")
    serve.add_argument("--model-id", action="append", default=[], metavar="ORG/NAME[@REV]",
                       help="a Hugging Face hub model visitors may load by its id (repeatable; none by default; "
                            "fetched into the huggingface_hub cache on first load)")
    for name, (_, what) in TOOLS.items():
        sub.add_parser(name, help=what, add_help=False)  # its own --help: python -m clover_engine.<tool> --help
    tut = sub.add_parser("tutorials", help="copy the tutorial notebooks into a folder (created if missing)")
    tut.add_argument("dir", type=Path, help="where to copy them (an existing notebook is not overwritten)")
    return p


def run_tool(name: str, argv: Sequence[str]) -> int:
    """``python -m clover_engine.<name> ARGV``: that command's ``main`` with the arguments as given."""
    module, function = TOOLS[name][0].split(":")
    return int(getattr(importlib.import_module(module), function)(list(argv)) or 0)


def serve(port: int, show: bool, model_roots: Sequence[str], panel_args: Sequence[str],
          model_ids: Sequence[str] = ()) -> int:
    """``panel serve`` of the packaged app (`clover_viz.explorer`, run per session), in this process;
    ``model_roots`` and ``model_ids`` (hub ids) reach the app as ``--args --model-root DIR --model-id ID``
    (`clover_viz.limits.model_roots`)."""
    try:
        import clover_viz.explorer as app  # local: the viz extra (plotly, Panel); the engine commands run without it
        from panel.command import main as panel_main
    except ImportError as exc:
        raise SystemExit(f"error: clover-explorer serve needs the viz extra ({exc}); "
                         "install it with: pip install 'clover-explorer[viz]'") from None
    argv = ["panel", "serve", app.__file__, "--port", str(port), *(["--show"] if show else []), *panel_args]
    if model_roots or model_ids:
        argv += ["--args", *(a for root in model_roots for a in ("--model-root", root)),
                 *(a for hub_id in model_ids for a in ("--model-id", hub_id))]
    sys.argv = argv  # panel's command line reads sys.argv
    return int(panel_main() or 0)


def copy_tutorials(dest: Path) -> tuple[list[Path], list[Path]]:
    """Copy the tutorial notebooks into ``dest`` (made if missing); a notebook already there is kept
    (it may hold the user's edits), never overwritten.

    Returns:
        (the notebooks copied now, the notebooks that were already there and were kept), each in order.
    """
    dest.mkdir(parents=True, exist_ok=True)
    copied, kept = [], []
    for nb in sorted(tutorials_dir().glob("*.ipynb")):
        target = dest / nb.name
        if target.exists():
            kept.append(target)
        else:
            shutil.copyfile(nb, target)
            copied.append(target)
    return copied, kept


def tutorials_message(dest: Path, copied: list[Path], kept: list[Path]) -> str:
    """What ``clover-explorer tutorials DIR`` prints: what it copied, what it kept, and how to open them."""
    names = sorted(copied + kept)
    if not names:
        return f"no tutorials found in {tutorials_dir()}"
    lines = []
    if copied:
        lines.append(f"copied {len(copied)} tutorials into {dest}/")
    if kept:
        lines.append(f"kept {len(kept)} already in {dest}/ (not overwritten, your edits stay): "
                     f"{', '.join(p.name for p in kept)} -- delete one to get a fresh copy")
    lines.append(f"start with {names[0].name}: jupyter lab {dest}")
    return "\n".join(lines)


def write_frontier_plots(out_dir: Path) -> list[Path]:
    """Draw a finished sweep's frontier, one plot per (model, task set): ``frontier-<model>-<task set>.html`` in
    ``out_dir`` (plotly pages beside one ``plotly.min.js``: they open offline). Nothing when the sweep compared
    nothing with the careful decode (``--no-careful``).

    Raises:
        ImportError: the viz extra (plotly) is not installed.
    """
    import re

    import pyarrow.parquet as pq

    from clover_engine.sweep import FRONTIER_NAME  # local: the engine loads only when a command runs
    from clover_viz.figures.frontier import sweep_frontier_figure  # local: the viz extra (plotly)

    path = Path(out_dir) / FRONTIER_NAME
    rows = pq.read_table(path).to_pylist() if path.is_file() else []
    written = []
    for model, task_set in dict.fromkeys((r["model"], r["task_set"]) for r in rows):
        group = [r for r in rows if (r["model"], r["task_set"]) == (model, task_set)]
        slug = re.sub(r"[^A-Za-z0-9._-]+", "_", f"{Path(model).name or model}-{task_set}").strip("_")
        target = Path(out_dir) / f"frontier-{slug}.html"
        sweep_frontier_figure(group, model, task_set).write_html(target, include_plotlyjs="directory")
        written.append(target)
    return written


def sweep(argv: Sequence[str]) -> int:
    """``clover-explorer sweep``: ``python -m clover_engine.sweep ARGV``, then its frontier drawn per model
    (`write_frontier_plots`) where the viz extra is installed."""
    code = run_tool("sweep", argv)
    if code != 0:
        return code
    from clover_engine.sweep import build_parser as sweep_parser  # local: the engine loads only when a command runs

    out = sweep_parser().parse_known_args(list(argv))[0].out
    try:
        plots = write_frontier_plots(out)
    except ImportError as exc:
        print(f"frontier plots not drawn: they need the viz extra ({exc}): pip install 'clover-explorer[viz]'")
        return 0
    for plot in plots:
        print(f"frontier plot: {plot}")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] == "sweep" and not {"-h", "--help"} & set(argv[1:]):
        return sweep(argv[1:])
    if argv and argv[0] in TOOLS:  # everything after the name is the tool's, --help included
        return run_tool(argv[0], argv[1:])
    parser = build_parser()
    args, rest = parser.parse_known_args(argv)
    if args.command == "serve":
        return serve(args.port, args.show, args.model_root, rest, args.model_id)
    if rest:
        parser.error(f"unrecognized arguments: {' '.join(rest)}")
    copied, kept = copy_tutorials(args.dir)
    print(tutorials_message(args.dir, copied, kept))
    return 0 if copied or kept else 1


if __name__ == "__main__":
    raise SystemExit(main())
