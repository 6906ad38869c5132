"""Where a checkpoint is: the file names every model directory shares (``config.json``,
``tokenizer.json``), the bundled model every entry point opens by default, and resolving a path --
a directory or a file inside one -- to the checkpoint directory, with the one message for a file
given where a directory belongs (`file_as_model_dir`). Wing ``backbones``: below both the Clover
weights (`clover_engine.backbones.clover.weights`) and the format dispatch (`clover_engine.checkpoint`, which
re-exports `DEFAULT_MODEL_DIR` and `file_as_model_dir` as its public API)."""

from __future__ import annotations

from pathlib import Path

DEFAULT_MODEL_DIR = "models/clover-tiny"
"""The bundled model every entry point opens by default (relative to the repository root; found from any
directory and from an installed wheel by `find_model_dir`)."""
CONFIG_NAME = "config.json"
TOKENIZER_NAME = "tokenizer.json"
PACKAGES_ROOT = Path(__file__).resolve().parents[2]
"""The folder that holds the ``clover_engine`` package: the checkout's root, or ``site-packages`` of an install."""
BUNDLED_DATA_PACKAGE = "clover_models"
"""The installed wheel's copy of the checkout's ``models/`` (pyproject.toml: a data package beside ``clover_engine``)."""


def bundled_models_dir(root: Path = PACKAGES_ROOT) -> Path:
    """Where the bundled models are: ``clover_models/`` beside the packages when installed from the wheel,
    else the checkout's ``models/`` (``root``: the folder holding the packages)."""
    installed = root / BUNDLED_DATA_PACKAGE
    return installed if installed.is_dir() else root / "models"


def find_model_dir(text: str) -> str:
    """A command line's ``--model`` as a directory: ``text`` itself when that path exists (a checkpoint of
    one's own, ``runs/...``) or is absolute; else the bundled model it names, by name (``clover-tiny``) or
    by its checkout path (``models/clover-tiny``, the default) -- so the commands work from any directory
    and from an installed wheel; else ``text`` unchanged (the loader's message then names it)."""
    path = Path(text).expanduser()
    if path.is_absolute() or path.exists():
        return text
    parts = path.parts
    if len(parts) == 1 or (len(parts) == 2 and parts[0] == "models"):
        bundled = bundled_models_dir() / parts[-1]
        if (bundled / CONFIG_NAME).is_file():
            return str(bundled)
    return text


def file_as_model_dir(given: str | Path, found: str | Path | None = None) -> str:
    """The one message for a file given where a model directory belongs: ``--model`` of the command
    lines, the explorer's model field, `load_model`. It names what was typed and what to pass
    instead: the file's own folder when that holds a ``config.json`` (``models/clover-tiny/config.json``
    -> ``models/clover-tiny``), else the bundled model's directory as an example.

    Args:
        given: the path as the user typed it (shown as typed).
        found: where that path was found, when it was resolved against another folder (the app
            tries the working directory, then the repository root); default ``given``.

    Returns:
        One sentence, without a leading ``error:``.
    """
    parent = Path(found if found is not None else given).expanduser().parent
    if (parent / CONFIG_NAME).is_file():
        instead = str(Path(given).parent) if Path(given).parent != Path(".") else str(parent)
    else:
        instead = DEFAULT_MODEL_DIR
    return f"{str(given)!r} is a file; pass the model's directory (the folder that holds config.json), e.g. {instead}"


def _checkpoint_dir(path_or_dir: str | Path) -> Path:
    path = Path(path_or_dir)
    if path.is_file():
        if not (path.parent / "config.json").is_file():
            raise ValueError(file_as_model_dir(path_or_dir))
        path = path.parent  # a file inside a checkpoint (e.g. its config.json): the checkpoint
    if not path.is_dir():
        parent = path.parent
        near = sorted(p.name for p in parent.iterdir() if p.is_dir() and not p.name.startswith(".")) \
            if parent.is_dir() else []
        hint = f" ({parent} holds: {', '.join(near[:8])})" if near else ""
        raise ValueError(
            f"checkpoint directory {path} does not exist{hint}; pass a directory holding config.json and "
            f"model.safetensors (create one with `python -m clover_engine.checkpoint --init clover-test "
            f"--out {path}`)"
        )
    return path
