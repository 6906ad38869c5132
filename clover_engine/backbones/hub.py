"""Hub ids as model names: ``org/name`` and ``org/name@revision`` wherever a model is named (`load_model`,
``--model`` of the command lines, the explorer's model field), resolved to a checkpoint directory through
``huggingface_hub.snapshot_download`` -- its cache (``HF_HOME``, ``HF_HUB_CACHE``), ``HF_HUB_OFFLINE``,
``HF_TOKEN`` and its progress bars, none of it reimplemented here.

Wing ``backbones``: beside `clover_engine.backbones.checkpoint_dir` (a local path or a bundled model's name,
`find_model_dir`, keeps its meaning and wins over a hub id of the same shape), below the format dispatch
(`clover_engine.checkpoint.load_model`, which loads what `model_source` finds and records the hub id as the
model's ``model_id``). Only the files a checkpoint format needs are fetched (`CHECKPOINT_FILES`); each hub
failure becomes one `ValueError` that says what happened and what to do (`hub_snapshot`).

``huggingface_hub`` is imported when a hub id is first resolved, not with this module: it reads ``HF_HOME``
and ``HF_HUB_OFFLINE`` when imported, and a process that names only local folders never needs it.
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from clover_engine.backbones import load_progress
from clover_engine.backbones.checkpoint_dir import find_model_dir

CHECKPOINT_FILES: tuple[str, ...] = (
    "config.json", "generation_config.json",
    "*.safetensors", "*.safetensors.index.json",
    "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "added_tokens.json", "vocab.json",
    "merges.txt",
    "tokenizer.model",
    "chat_template.jinja", "chat_template.json",
    "*.py",  # the custom modeling code some families ship (Dream, LLaDA): small, harmless to fetch
)
"""The ``allow_patterns`` of a download: what the checkpoint formats read (no ``*.bin``, ``*.gguf``, ``*.pt``:
the engine reads safetensors only)."""

_PART = r"[A-Za-z0-9](?:[A-Za-z0-9._-]*[A-Za-z0-9_])?"
HUB_ID_SHAPE = re.compile(rf"(?P<repo>{_PART}/{_PART})(?:@(?P<revision>[A-Za-z0-9._/-]+))?")
"""The shape of a hub id, ``org/name[@revision]`` (``fullmatch``; `parse_hub_id` also asks that no local path
has that name)."""


@dataclass(frozen=True)
class HubId:
    """A model on the Hugging Face hub: ``repo_id`` (``org/name``) and an optional ``revision`` (a branch,
    tag or commit; None: the default branch). ``str()`` gives it back as written: ``org/name[@revision]``."""

    repo_id: str
    revision: str | None = None

    def __str__(self) -> str:
        return self.repo_id if self.revision is None else f"{self.repo_id}@{self.revision}"

    @property
    def page(self) -> str:
        """The repo's page on the hub (licences are accepted there)."""
        return f"https://huggingface.co/{self.repo_id}"


def parse_hub_id(text: object) -> HubId | None:
    """``text`` as a hub id, or None when it names something local or is not shaped like one.

    A hub id is a ``str`` shaped ``org/name`` or ``org/name@revision`` (letters, digits, ``.``, ``_``,
    ``-``; no ``..`` or ``--``) that is not an existing path and not a bundled model
    `find_model_dir` resolves (``models/clover-tiny``): a local folder that looks like ``a/b`` keeps its
    meaning. A `pathlib.Path` is always local.
    """
    if not isinstance(text, str):
        return None
    s = text.strip()
    m = HUB_ID_SHAPE.fullmatch(s)
    if m is None or ".." in m["repo"] or "--" in m["repo"] or ".." in (m["revision"] or ""):
        return None
    if Path(s).expanduser().exists() or Path(s.split("/")[0]).is_dir() or find_model_dir(s) != s:
        return None
    return HubId(m["repo"], m["revision"])


def model_source(path_or_dir: str | Path) -> tuple[str | Path, str | None]:
    """Where a model name's checkpoint is, and the id its traces record.

    Returns:
        ``(snapshot directory, "org/name[@revision]")`` for a hub id (`parse_hub_id`; fetched by
        `hub_snapshot` when not cached), else ``(path_or_dir, None)`` unchanged -- a local path is
        checked by the loader, which names it in its message.

    Raises:
        ValueError: from `hub_snapshot`, for a hub id that cannot be had.
    """
    ref = parse_hub_id(path_or_dir)
    if ref is None:
        return path_or_dir, None
    return hub_snapshot(ref), str(ref)


def hub_snapshot(hub_id: HubId | str) -> Path:
    """The local snapshot directory of a hub model, downloaded into the huggingface_hub cache first when
    it is not there (only `CHECKPOINT_FILES`; tqdm progress bars on stderr, unless
    ``HF_HUB_DISABLE_PROGRESS_BARS`` is set). ``HF_HOME`` / ``HF_HUB_CACHE`` choose the cache,
    ``HF_HUB_OFFLINE=1`` reads it without the network, ``HF_TOKEN`` (or ``hf auth login``) authenticates.

    Args:
        hub_id: a `HubId`, or its text ``org/name[@revision]``.

    Returns:
        The snapshot directory (``$HF_HOME/hub/models--org--name/snapshots/<commit>``), holding at least one
        ``*.safetensors`` file.

    Raises:
        ValueError: one sentence of what happened and what to do, for: a text that is no hub id; an unknown
            (or private) repo (``RepositoryNotFoundError``); a gated repo whose licence is not accepted
            (``GatedRepoError``: accept it on the repo's page, then ``hf auth login`` or ``HF_TOKEN``); a
            revision the repo does not have (``RevisionNotFoundError``); nothing cached while offline
            (``HF_HUB_OFFLINE=1``) or without a network (``LocalEntryNotFoundError``,
            ``OfflineModeIsEnabled``); a partial cached snapshot (``IncompleteSnapshotError``); another
            answer of the hub (``HfHubHTTPError``); a snapshot without ``*.safetensors`` (the engine reads
            safetensors only).
        clover_engine.backbones.load_progress.LoadCancelled: the thread's `load_progress.watching` watcher
            asked to stop (its progress counts the download's bytes).
    """
    ref = hub_id if isinstance(hub_id, HubId) else HUB_ID_SHAPE.fullmatch(str(hub_id).strip())
    if ref is None:
        raise ValueError(f"{hub_id!r} is not a hub id; name a hub model as org/name or org/name@revision")
    if not isinstance(ref, HubId):
        ref = HubId(ref["repo"], ref["revision"])
    # local: huggingface_hub reads HF_HOME / HF_HUB_OFFLINE when imported -- at the first hub id, not at startup
    import huggingface_hub
    from huggingface_hub import constants, errors

    local = (f" (and there is no local directory {str(ref)!r}: a local checkpoint is named by its path, "
             f"e.g. ./{ref})")
    try:
        watcher = load_progress.current()  # a front end's progress and Stop (cancels the download)
        bar = {"tqdm_class": load_progress.download_bar(watcher)} if watcher is not None else {}
        with _progress_bars_shown():
            folder = huggingface_hub.snapshot_download(ref.repo_id, revision=ref.revision,
                                                       allow_patterns=list(CHECKPOINT_FILES), **bar)
    except errors.GatedRepoError as e:  # before RepositoryNotFoundError: a subclass of it
        raise ValueError(
            f"{ref.repo_id} is a gated model on the Hugging Face hub: accept its licence at {ref.page} while "
            f"logged in, then authenticate here with `hf auth login` or the HF_TOKEN environment variable "
            f"(a token of the account that accepted it)") from e
    except errors.RepositoryNotFoundError as e:
        raise ValueError(
            f"no model {ref.repo_id!r} on the Hugging Face hub (or it is private and no token with access "
            f"was sent: `hf auth login` or HF_TOKEN); check the spelling, org/name as on its page{local}") from e
    except errors.RevisionNotFoundError as e:
        raise ValueError(
            f"{ref.repo_id} has no revision {ref.revision!r}; name a branch, tag or commit it has "
            f"({ref.page}/tree/main lists them) or drop '@{ref.revision}' for the default branch") from e
    except (errors.LocalEntryNotFoundError, errors.OfflineModeIsEnabled) as e:
        why = ("HF_HUB_OFFLINE=1 is set" if constants.HF_HUB_OFFLINE
               else "the hub cannot be reached (no network?)")
        raise ValueError(
            f"{ref} is not in the huggingface_hub cache ({constants.HF_HUB_CACHE}) and {why}: download it "
            f"first with network access (load it once online, or `hf download {ref.repo_id}"
            f"{' --revision ' + ref.revision if ref.revision else ''}`), then it loads offline{local}") from e
    except getattr(errors, "IncompleteSnapshotError", ()) as e:  # huggingface_hub >= 2.x: a partial download
        raise ValueError(f"the cached snapshot of {ref} is incomplete ({e}); load it again with network "
                         "access to finish the download") from e
    except errors.HfHubHTTPError as e:
        raise ValueError(f"the Hugging Face hub refused {ref}: {e}") from e
    directory = Path(folder)
    if not any(directory.glob("*.safetensors")):
        present = sorted(p.name for p in directory.iterdir())
        raise ValueError(
            f"{ref} (snapshot {directory}) has no *.safetensors weights -- it holds "
            f"{', '.join(present[:8]) or 'nothing we fetch'}; this engine reads safetensors only: pick a repo "
            "or revision that ships model.safetensors, or convert the weights (transformers' "
            "save_pretrained(DIR, safe_serialization=True)) and pass that directory")
    return directory


@contextlib.contextmanager
def _progress_bars_shown() -> Iterator[None]:
    """huggingface_hub's tqdm bars on for a download, unless the user turned them off
    (``HF_HUB_DISABLE_PROGRESS_BARS``): transformers' ``disable_progress_bar`` (`clover_engine.convert`)
    turns them off process-wide, which would hide a download of many GB."""
    from huggingface_hub import constants
    from huggingface_hub.utils import are_progress_bars_disabled, disable_progress_bars, enable_progress_bars

    turned_on = are_progress_bars_disabled() and not constants.HF_HUB_DISABLE_PROGRESS_BARS
    if turned_on:
        enable_progress_bars()
    try:
        yield
    finally:
        if turned_on:
            disable_progress_bars()


__all__ = ["CHECKPOINT_FILES", "HUB_ID_SHAPE", "HubId", "hub_snapshot", "model_source", "parse_hub_id"]
