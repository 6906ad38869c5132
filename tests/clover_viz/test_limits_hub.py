"""The served explorer and hub ids: a hub id loads only when the host lists it (``--model-id`` /
``CLOVER_MODEL_IDS``, beside the model roots); any other id gets exactly the refusal an unlisted path gets.

Nothing is downloaded here: `clover_viz.models.resolve_model` only decides (a listed id becomes a ``hub``
spec, fetched when loaded -- `tests/clover_engine/test_hub.py` loads one from a real huggingface_hub cache).

Run: ``.venv/bin/python -m pytest tests/clover_viz/test_limits_hub.py -q``
"""

from __future__ import annotations

import pytest

from clover_viz.limits import folder_roots, listed_hub_ids, model_roots, outside_roots
from clover_viz.models import REPO_ROOT, ModelSpec, bundled_models, resolve_model

pytest.importorskip("param")

BUNDLED = REPO_ROOT / "models"


@pytest.fixture
def served(tmp_path, monkeypatch):
    """A server started in ``tmp/server`` listing two hub ids (one by flag, one by environment), with a
    checkpoint folder outside its roots."""
    server, outside = tmp_path / "server", tmp_path / "outside" / "ckpt"
    (server / "runs").mkdir(parents=True)
    outside.mkdir(parents=True)
    (outside / "config.json").write_text("{}")
    monkeypatch.chdir(server)
    roots = model_roots(["--model-id", "clover-org/listed", "--other", "x"],
                        {"CLOVER_MODEL_IDS": "other-org/pinned@v1.0, clover-org/listed"},
                        start_dir=server, bundled=BUNDLED)
    return server, outside, roots


def test_the_host_lists_hub_ids_beside_the_model_roots(served, tmp_path):
    server, _, roots = served
    assert listed_hub_ids(roots) == ("clover-org/listed", "other-org/pinned@v1.0")
    assert folder_roots(roots) == (BUNDLED.resolve(), (server / "runs").resolve(), (server / "models").resolve())
    assert listed_hub_ids(tuple(roots)) == listed_hub_ids(roots)  # a session keeps tuple(roots): the ids survive
    assert listed_hub_ids(model_roots((), {}, start_dir=server, bundled=BUNDLED)) == ()  # none unless listed
    # the model the page opens on, named by a hub id, is listed too
    opened = model_roots((), {"CLOVER_MODEL_DIR": "GSAI-ML/LLaDA-8B-Instruct"}, start_dir=server, bundled=BUNDLED)
    assert listed_hub_ids(opened) == ("GSAI-ML/LLaDA-8B-Instruct",)
    with pytest.raises(ValueError, match="is not a hub id"):
        model_roots(["--model-id", "not a/hub id"], {}, start_dir=server)


def test_a_listed_hub_id_resolves_and_any_other_gets_the_unlisted_path_refusal(served):
    server, outside, roots = served
    for listed in ("clover-org/listed", "other-org/pinned@v1.0"):
        assert resolve_model(listed, roots=tuple(roots)) == ModelSpec("hub", listed)
    refusal = outside_roots(roots, bundled_models())
    assert "clover-org/listed" in refusal  # the refusal offers the listed ids with the folders
    for text in ("nobody/unlisted", "clover-org/listed@main", "other-org/pinned", "GSAI-ML/LLaDA-8B-Instruct",
                 str(outside), str(outside.parent / "missing"), "../outside/ckpt"):
        with pytest.raises(ValueError) as refused:
            resolve_model(text, roots=tuple(roots))
        assert str(refused.value) == refusal, text  # the same sentence, whether a path or an id
    # the notebook and the command line (no roots): any hub id
    assert resolve_model("nobody/unlisted") == ModelSpec("hub", "nobody/unlisted")


def test_the_app_state_refuses_an_unlisted_id_as_an_unlisted_path(served):
    from clover_viz.state import ExplorerState

    _, outside, roots = served
    state = ExplorerState(model_dir="clover-test", model_roots=roots, max_new_tokens=8)
    errors = []
    try:
        assert state.load_model() is not None, state.error
        for text in ("nobody/unlisted", str(outside)):
            state.model_dir = text
            errors.append(state.error)
            assert state.model_ok and state.model_dir == "clover-test"  # refused: the model before it is kept
    finally:
        state.close()
    assert len(set(errors)) == 1 and outside_roots(roots, bundled_models()) in errors[0], errors
