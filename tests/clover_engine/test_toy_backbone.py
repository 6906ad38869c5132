"""One new backbone = one module + one registry row (`tests/toy_backbone.py`).

The toy registers its ``model_type`` and then goes through everything a bundled family goes
through -- `clover_engine.checkpoint.load_model`, the block decoder, a trace saved and loaded, the cost
meter, the explorer's session state and views, the notebook `Explorer` -- with no edit anywhere
else in the engine or the front ends. What it does not emit (expert union, state norms, memory
share) the views call "not applicable".

Run: .venv/bin/python -m pytest tests/clover_engine/test_toy_backbone.py -q
"""

from __future__ import annotations

import pytest
import toy_backbone as toy

from clover_engine.backbones import registry
from clover_engine.backbones.base import Backbone, capabilities_of


@pytest.fixture(scope="module")
def toy_dir(tmp_path_factory):
    registry.register(toy.MODEL_TYPE, "toy_backbone:load_toy", "a toy backbone (tests/toy_backbone.py)")
    try:
        yield toy.save_toy(tmp_path_factory.mktemp("models") / "toy-model")
    finally:
        registry.unregister(toy.MODEL_TYPE)


def test_decoder_trace_and_cost(toy_dir, tmp_path):
    from clover_engine.checkpoint import load_model, load_tokenizer, supported_formats
    from clover_engine.decoding.decoder import BlockDecoder, DecodeConfig
    from clover_engine.recording.trace import Trace

    assert toy.MODEL_TYPE in supported_formats()
    model = load_model(toy_dir)
    assert isinstance(model, toy.ToyBackbone) and isinstance(model, Backbone)
    assert capabilities_of(model).cost_family == "recompute"
    r = BlockDecoder(model, load_tokenizer(toy_dir), DecodeConfig(block_size=8, max_new_tokens=16)).generate(
        "def f(x):", record_trace=True)
    assert r.nfe > 0 and len(r.tokens) > 0 and r.bytes_read > 0 and r.flops > 0  # priced by the cost meter
    assert r.trace.meta["capabilities"]["family"] == "toy"
    path = r.trace.save(tmp_path / "toy.parquet")
    back = Trace.load(path)
    assert len(back) == r.nfe and back.generated_tokens.tolist() == r.tokens
    assert back.meta["capabilities"]["cost_family"] == "recompute"


def test_explorer_state_views_and_notebook(toy_dir):
    from clover_viz import figures as F
    from clover_viz.panel_views import ExplorerApp
    from clover_viz.state import ExplorerState
    from clover_viz.widgets import Explorer

    s = ExplorerState(model_dir=str(toy_dir), max_new_tokens=16, block_size=8, prompt="def f(x):")
    try:
        assert s.load_model() is not None and s.model_ok, s.error
        assert s.memory_mode == "state" and not s.window_available  # what the toy declares
        assert s.generate(), s.error
        assert s.wait(60) and s.status.startswith("done"), s.status
        app = ExplorerApp(state=s)
        for tab in range(len(app.tabs.TABS)):
            app.tabs.tabs.active = tab
            app.tabs.refresh(force=True)
        for fig in (F.expert_union_figure(s.trace), F.state_norm_figure(s.trace), F.memory_share_figure(s.trace)):
            assert F.NOT_APPLICABLE in str(fig.to_dict()["layout"])
        assert s.cost_projection() is not None
    finally:
        s.close()
        s.wait(5)
    ex = Explorer(str(toy_dir))
    try:
        trace = ex.decode("def g(y):", max_new_tokens=8)
        assert len(trace) > 0 and trace.meta["capabilities"]["family"] == "toy"
    finally:
        ex.close()
