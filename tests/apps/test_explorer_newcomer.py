"""The explorer as a newcomer met it (items 3-7 of their review), driven through `ExplorerState`,
the Panel views and the notebook `Explorer` with the random ``clover-test`` and bundled clover-tiny.

Run: ``.venv/bin/python -m pytest tests/apps/test_explorer_newcomer.py -q``
"""

from __future__ import annotations

import re

import pytest
import torch

pytest.importorskip("panel")

from clover_viz.runs import forced_past_answer, run_stats  # noqa: E402
from clover_viz.state import ExplorerState  # noqa: E402
from clover_engine.recording.trace import Trace  # noqa: E402

ROOT = __import__("pathlib").Path(__file__).resolve().parents[2]
SMALL_TRACE = ROOT / "tests" / "data" / "small_trace.parquet"


pytestmark = pytest.mark.usefixtures("one_torch_thread")  # tests/conftest.py


def other_models_trace() -> Trace:
    """A saved run of another model (smollm2-bd) with its own prompt, settings and memory mode."""
    tr = Trace.load(SMALL_TRACE)  # block 8, threshold 0.4, memory state, 30 new tokens, EOS bias after 6
    tr.model_id = "smollm2-bd"
    tr.meta = {"model_label": "smollm2-bd (models/smollm2-bd)", "prompt": "What is the capital of France?"}
    return tr


def test_opening_another_models_trace_takes_every_setting_it_can_and_says_so():
    """Item 3: with clover-tiny loaded, opening a smollm2-bd trace changed only the memory mode,
    silently. Now every setting the loaded model can run is taken (prompt and budget too), the
    status line lists what was and was not taken, and Generate names the model it decodes with."""
    s = ExplorerState(model_dir="models/clover-tiny")
    try:
        assert s.load_model() is not None and s.memory_mode == "state+window"
        assert s.load_trace(other_models_trace(), name="chat.parquet")
        assert (s.block_size, s.memory_mode, s.max_new_tokens) == (8, "state", 30)
        assert s.prompt == "What is the capital of France?"
        assert s.eos_bias and s.eos_soft_limit == 6 and not s.repetition_control
        assert s.threshold == 0.95  # 0.4 is below the slider: kept, and said
        st = s.status
        assert st.startswith("loaded trace chat.parquet: 17 steps from smollm2-bd")
        assert "taken from the trace: block size 8" in st and "memory mode state" in st and "prompt" in st
        assert "max new tokens 30" in st
        assert "not taken: threshold 0.4 (the slider spans 0.5-1)" in st
        assert "eos bias rate 0.3 (no control" in st
        assert "Generate decodes with the loaded model, clover-tiny" in st
        assert "not with the trace's model smollm2-bd" in st
        assert not s.running  # nothing re-decoded
        # Generate runs with exactly the settings on screen, on the loaded model
        s.max_new_tokens = 8
        assert s.generate() and s.wait(60)
        dc = s.trace.decode_config
        assert (dc["block_size"], dc["memory_mode"], dc["max_new_tokens"]) == (8, "state", 8)
        assert s.trace.model_id == "clover-tiny" and s.trace.meta["prompt"] == "What is the capital of France?"
    finally:
        s.close()
        s.wait(5)


def test_a_memory_mode_the_loaded_model_cannot_run_is_not_taken():
    """Item 3: a trace recorded in state+window opened beside a model without a window keeps `state`, and says why."""
    import dataclasses

    from clover_viz.models import LoadedModel, ModelSpec, load_model_cached
    from clover_engine.backbones.clover.model import CloverModel

    def loader(spec):
        base = load_model_cached(ModelSpec("random"))
        cfg = dataclasses.replace(base.model.config, attention_window=0)
        torch.manual_seed(0)
        return LoadedModel(spec, CloverModel(cfg).eval(), base.tokenizer, "no-window test model")

    s = ExplorerState(loader=loader, model_dir="clover-test")
    assert s.load_model() is not None and s.memory_mode == "state"
    tr = other_models_trace()
    tr.decode_config = {**tr.decode_config, "memory_mode": "state+window"}
    assert s.load_trace(tr)
    assert s.memory_mode == "state"
    assert "memory mode state+window (no-window test model has no attention window)" in s.status
    s.close()


def test_the_comparison_says_when_models_and_prompts_differ():
    """Item 4: a run of another model or prompt is named as such in the table and above the text diff."""
    from clover_viz.panel_views import ExplorerApp

    s = ExplorerState(model_dir="clover-test", max_new_tokens=8, block_size=8)
    app = ExplorerApp(state=s)
    try:
        assert s.load_trace(other_models_trace())
        s.prompt = "Hello there"
        assert s.generate() and s.wait(60)
        app.compare.refresh()
        cmp = s.comparison()
        assert cmp["model"]["same"] is False and cmp["prompt"]["same"] is False
        assert cmp["memory_mode"] == {"a": "state", "b": "state", "same": True}
        from clover_viz import figures as F
        from clover_viz.runs import RUN_LABELS

        cols = F.compare_table(cmp["previous"], cmp["current"], labels=RUN_LABELS).data[0].cells.values
        rows = {m: (x, y, d) for m, x, y, d in zip(*cols)}
        assert rows["model"] == ("smollm2-bd (models/smollm2-bd)", "random clover-test", "different")
        assert rows["prompt"][2] == "different prompts"
        assert "different prompts and different models" in app.compare.pane.object
        assert "the text difference compares unrelated answers" in app.compare.pane.object
    finally:
        s.close()
        s.wait(5)


def test_the_done_line_says_how_many_forced_fills_wrote_end_of_text_slots():
    """Item 5: 'N forced' counted end-of-text slots without saying so; the done line now says how
    many forced fills wrote end-of-text slots at or after the answer's end (the CLI's count)."""
    from clover_engine.generate import forced_past_answer as cli_count

    s = ExplorerState(model_dir="clover-test", prompt="Hello", max_new_tokens=32, block_size=8, eos_bias=True,
                      eos_soft_limit=0)
    try:
        assert s.generate() and s.wait(60)
        tr = s.trace
        assert tr.decode_end.stop_reason == "eos"
        past = forced_past_answer(tr)
        assert past == cli_count(tr, len(tr.prompt_ids) + len(tr.generated_tokens)) > 0
        assert (f"{tr.decode_end.n_forced} forced ({past} of them wrote end-of-text slots at or after the "
                "answer's end: forwards, not tokens)") in s.status
        assert run_stats(tr)["n_forced_past_answer"] == past
    finally:
        s.close()
        s.wait(5)


def test_the_notebook_status_says_it_too_and_its_errors_read_once():
    """Items 5 and 7b: the notebook's status names the end-of-text forced fills; decode(threshold=1.5)
    raises one 'threshold must ...' message (not 'ValueError: ValueError: ...'); the empty-prompt
    error names the notebook's Decode button."""
    from clover_viz.widgets import Explorer

    ex = Explorer("clover-test", decode_config={"block_size": 8, "max_new_tokens": 32, "eos_bias_soft_limit": 0})
    try:
        ex.decode("Hello")
        past = forced_past_answer(ex.state.trace)
        assert past > 0 and f"({past} of them end-of-text slots at or after the answer's end" in ex.status.value
        with pytest.raises(ValueError) as err:
            ex.decode(threshold=1.5)
        assert "ValueError" not in str(err.value) and "threshold" in str(err.value)
        with pytest.raises(ValueError, match=r"then Decode\.$"):
            ex.decode("   ")
        assert "then Generate" not in ex.status.value
    finally:
        ex.close()


def test_a_refused_decode_does_not_leave_the_last_done_line():
    """Item 7c: after an over-long prompt the status still read the previous run's 'done: ...'."""
    s = ExplorerState(model_dir="clover-test", prompt="Hello", max_new_tokens=8, block_size=8)
    try:
        assert s.generate() and s.wait(60)
        assert s.status.startswith("done:")
        s.prompt = "word " * 50_000
        assert not s.generate()
        assert "Cannot decode" in s.error
        assert s.status.startswith("not decoded: the new decode did not start")
        assert "done:" not in s.status
        s.prompt = " "
        assert not s.generate() and s.error.endswith("then Generate.")
        assert s.status.startswith("not decoded")
    finally:
        s.close()
        s.wait(5)


def test_each_measured_tokens_per_s_says_what_it_divides():
    """Item 7a: the headline, the Cost table's two columns and the Cost chart's subtitle gave three
    'measured' tokens/s; each label now says what it divides by what."""
    from clover_viz import figures as F
    from clover_viz.panel_views import ExplorerApp

    s = ExplorerState(model_dir="clover-test", prompt="Hello", max_new_tokens=16, block_size=8)
    app = ExplorerApp(state=s)
    try:
        assert s.generate() and s.wait(60)
        s.tick()
        head = app.summary.numbers.object
        assert "tokens ÷ whole decode time" in head
        html = F.cost_summary_html(s.trace, s.cost_projection())
        assert "answer tokens ÷ the decode's wall time (decode phase: less the prompt forward's)" in html
        assert "the Cost chart's curve divides the slots written by the forwards' own time" in html
        sub = F.cost_figure(s.trace).layout.title.text
        assert re.search(r"tok/s = slots written ÷ the forwards' own wall time", sub)
        assert "whole decode's time" in sub
    finally:
        s.close()
        s.wait(5)


def test_cli_help_says_what_the_processors_do_with_units():
    """Item 7d: --repetition-penalty '0 = off' and --eos-bias-soft-limit 'unset = off' said nothing else."""
    from clover_engine.generate import build_parser

    helps = {a.dest: a.help for a in build_parser()._actions}
    assert "logits" in helps["repetition_penalty"] and "3-gram" in helps["repetition_penalty"]
    assert "0 = off" in helps["repetition_penalty"]
    assert "generated tokens" in helps["eos_bias_soft_limit"] and "logit per" in helps["eos_bias_soft_limit"]
