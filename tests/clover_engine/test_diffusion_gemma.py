"""clover_engine.backbones.diffusion_gemma: DiffusionGemma's own sampler recorded as events and a Trace, and
the revision fields (rewritten / remasked / previous_tokens) through traces, the slot index
and the block view.

A tiny random DiffusionGemma (2 layers, 4 experts top-2, vocab 96, canvas 8) is built
here, saved with ``save_pretrained`` and loaded back through `load_diffusion_gemma`.

Run: ``.venv/bin/python -m pytest tests/clover_engine/test_diffusion_gemma.py -q``
"""

from __future__ import annotations

import itertools
import json
import threading
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest
import torch
from transformers import DiffusionGemmaConfig, DiffusionGemmaForBlockDiffusion
from transformers.models.diffusion_gemma.generation_diffusion_gemma import (
    EntropyBoundSamplerConfig,
)

from clover_engine.backbones.base import capabilities_of
from clover_engine.backbones.clover.config import recorded_clover_config
from clover_engine.backbones.diffusion_gemma import DiffusionGemmaDecodeConfig
from clover_engine.decoding import decoder_for
from clover_engine.decoding.decoder import BlockDecoder, DecodeConfig
from clover_engine.decoding.diffusion_gemma import DiffusionGemmaDecoder, load_diffusion_gemma
from clover_engine.recording.events import BlockEnd, BlockStart, DecodeEnd, StepEvent
from clover_engine.recording.trace import Trace

SMALL_TRACE = Path(__file__).resolve().parents[1] / "data" / "small_trace.parquet"
PROMPT = [2, 5, 6, 7, 8]
V, L, N_LAYERS, N_EXPERTS = 96, 8, 2, 4
EOS, PAD = 1, 0
ALL_SLOTS = 1000.0  # an entropy bound above L * ln(V): every slot is accepted (re-sampled) at every step


def _tiny_config() -> DiffusionGemmaConfig:
    return DiffusionGemmaConfig(
        text_config={
            "vocab_size": V, "hidden_size": 32, "intermediate_size": 32, "num_hidden_layers": N_LAYERS,
            "num_attention_heads": 2, "num_key_value_heads": 1, "head_dim": 16, "global_head_dim": 16,
            "num_experts": N_EXPERTS, "top_k_experts": 2, "moe_intermediate_size": 16, "sliding_window": 16,
            "max_position_embeddings": 256, "layer_types": ["sliding_attention", "full_attention"],
            "pad_token_id": PAD, "eos_token_id": EOS, "bos_token_id": 2},
        # the vision tower is built whatever the prompt: keep it tiny too
        vision_config={"model_type": "gemma4_vision", "hidden_size": 16, "intermediate_size": 16,
                       "num_hidden_layers": 1, "num_attention_heads": 1, "num_key_value_heads": 1, "head_dim": 16,
                       "position_embedding_size": 16, "patch_size": 4},
        canvas_length=L,
    )


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory) -> Path:
    torch.manual_seed(0)
    model = DiffusionGemmaForBlockDiffusion(_tiny_config()).eval()
    path = tmp_path_factory.mktemp("tiny-diffusion-gemma")
    model.save_pretrained(path)
    return path


@pytest.fixture(scope="module")
def decoder(checkpoint) -> DiffusionGemmaDecoder:
    return load_diffusion_gemma(checkpoint)


@pytest.fixture(scope="module")
def reference(checkpoint) -> DiffusionGemmaForBlockDiffusion:
    """The same checkpoint as a plain transformers model, never touched by the adapter."""
    return DiffusionGemmaForBlockDiffusion.from_pretrained(checkpoint).eval()


def _own_generate(model, settings: dict, seed: int) -> list[int]:
    """DiffusionGemma's own generate with the settings the adapter resolved."""
    torch.manual_seed(seed)
    out = model.generate(
        torch.tensor([PROMPT]), max_new_tokens=settings["max_new_tokens"],
        max_denoising_steps=settings["max_denoising_steps"],
        sampler_config=EntropyBoundSamplerConfig(entropy_bound=settings["entropy_bound"]),
        t_min=settings["t_min"], t_max=settings["t_max"], stability_threshold=settings["stability_threshold"],
        confidence_threshold=settings["confidence_threshold"], eos_token_id=settings["eos_token_id"],
        pad_token_id=settings["pad_token_id"])
    return out.sequences[0].tolist()


def _revision_trace(decoder) -> Trace:
    return decoder.generate(PROMPT, DiffusionGemmaDecodeConfig(
        max_new_tokens=16, max_denoising_steps=4, entropy_bound=ALL_SLOTS, seed=0)).trace


# ---------------------------------------------------------------------- loading
def test_loader_reads_the_checkpoint(decoder):
    info = decoder.info
    assert (info.vocab_size, info.canvas_length, info.num_hidden_layers, info.num_experts) == (V, L, N_LAYERS,
                                                                                               N_EXPERTS)
    assert (info.eos_token_id, info.pad_token_id, info.mask_token_id, info.revisable) == (EOS, PAD, None, True)
    assert decoder.tokenizer is None  # the folder has no tokenizer files
    assert not decoder.model.training


def test_loader_refuses_what_is_not_diffusion_gemma(tmp_path):
    with pytest.raises(FileNotFoundError, match="no DiffusionGemma checkpoint"):
        load_diffusion_gemma(tmp_path / "absent")
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "llama"}))
    with pytest.raises(ValueError, match="not a DiffusionGemma checkpoint"):
        load_diffusion_gemma(tmp_path)


def test_loader_dtype(checkpoint):
    assert load_diffusion_gemma(checkpoint, dtype="bfloat16").model.dtype == torch.bfloat16
    with pytest.raises(ValueError, match="dtype must be one of"):
        load_diffusion_gemma(checkpoint, dtype="int3")


@pytest.mark.parametrize("kwargs, match", [
    ({"t_min": 0.8, "t_max": 0.4}, "t_min must be below t_max"),
    ({"entropy_bound": 0.0}, "entropy_bound must be"),
    ({"max_denoising_steps": 0}, "max_denoising_steps must be"),
    ({"eos_token_id": []}, "eos_token_id must be"),
])
def test_bad_settings_are_refused(kwargs, match):
    with pytest.raises(ValueError, match=match):
        DiffusionGemmaDecodeConfig(**kwargs)


def test_bad_prompts_are_refused(decoder):
    with pytest.raises(TypeError, match="needs a tokenizer"):
        decoder.generate("hello")
    with pytest.raises(ValueError, match="outside the vocabulary"):
        decoder.generate([2, V])
    with pytest.raises(ValueError, match="max_position_embeddings"):
        decoder.generate(PROMPT, DiffusionGemmaDecodeConfig(max_new_tokens=256))


# ---------------------------------------------------------------------- agreement with generate
@pytest.mark.parametrize("entropy_bound, seed", [(None, 0), (None, 1), (2.0, 2), (ALL_SLOTS, 3)])
def test_tokens_equal_its_own_generate(decoder, reference, entropy_bound, seed):
    dc = DiffusionGemmaDecodeConfig(max_new_tokens=24, max_denoising_steps=5, entropy_bound=entropy_bound, seed=seed)
    result = decoder.generate(PROMPT, dc)
    own = _own_generate(reference, result.settings, seed)
    assert result.sequences == own
    generated = own[len(PROMPT):]
    answer = generated[:generated.index(EOS)] if EOS in generated else generated
    assert result.tokens == answer
    trace = result.trace
    canvases = np.concatenate([b.tokens for b in trace.block_ends]).tolist()
    assert len(canvases) == len(generated) and canvases[:len(answer) + 1] == generated[:len(answer) + 1]
    assert [s.tokens.tolist() for s in trace.steps if s.step_index == trace.blocks[s.block_index]["n_steps"] - 1] \
        == [b.tokens.tolist() for b in trace.block_ends]


def test_stops_at_eos_like_its_own_generate(decoder, reference):
    dc = DiffusionGemmaDecodeConfig(max_new_tokens=32, max_denoising_steps=3, seed=5)
    free = decoder.generate(PROMPT, dc).sequences[len(PROMPT):]
    first, second = free[:L], free[L:2 * L]
    k, eos = next((k, t) for k, t in enumerate(second) if t not in first and t not in second[:k])
    result = decoder.generate(PROMPT, DiffusionGemmaDecodeConfig(max_new_tokens=32, max_denoising_steps=3, seed=5,
                                                                 eos_token_id=eos))
    own = _own_generate(reference, result.settings, 5)
    assert result.sequences == own and len(own) == len(PROMPT) + 2 * L  # stopped after the canvas with EOS
    assert result.tokens == first + second[:k]
    assert result.stop_reason == "eos"
    assert result.trace.block_ends[-1].hit_eos and not result.trace.block_ends[0].hit_eos
    assert result.trace.decode_end.tokens.tolist() == result.tokens


# ---------------------------------------------------------------------- events
def test_decodes_with_events(decoder):
    events: list = []
    dc = DiffusionGemmaDecodeConfig(max_new_tokens=16, max_denoising_steps=4, seed=0)
    result = decoder.generate(PROMPT, dc, hooks=[events.append])
    kinds = [type(e).__name__ for e in events]
    assert kinds[0] == "BlockStart" and kinds[-2:] == ["BlockEnd", "DecodeEnd"]
    steps = [e for e in events if isinstance(e, StepEvent)]
    assert len(steps) == result.nfe == events[-1].nfe <= 2 * 4
    starts = [e for e in events if isinstance(e, BlockStart)]
    assert [s.position_start for s in starts] == [len(PROMPT), len(PROMPT) + L]
    assert all(not s.prefilled.any() and s.length == L == s.block_size for s in starts)
    ends = [e for e in events if isinstance(e, BlockEnd)]
    for b, end in enumerate(ends):
        mine = [s for s in steps if s.block_index == b]
        assert [s.step_index for s in mine] == list(range(end.n_steps))
        assert mine[0].masked_before.all()  # a canvas starts as noise
        last = mine[-1]
        np.testing.assert_array_equal(last.tokens, end.tokens)
        np.testing.assert_array_equal(last.tokens, last.top_tokens[:, 0])  # read out as the argmax
        np.testing.assert_array_equal(last.candidate, last.tokens)
        # every noise slot of the read-out is written: accepted by the sampler or forced
        assert not (last.masked_before & ~(last.accepted | last.forced)).any()
        for s in mine[:-1]:  # a denoising step writes the sample it proposed
            w = s.accepted
            np.testing.assert_array_equal(s.tokens[w], s.candidate[w])
            assert not s.forced.any()
    for s in steps:
        assert s.confidence.shape == (L,) and np.isfinite(s.confidence).all()  # every slot re-predicted
        assert ((s.confidence > 0) & (s.confidence <= 1)).all()
        assert s.top_tokens.shape == (L, 5) and (np.diff(s.top_probs, axis=1) <= 0).all()
        assert s.expert_union.shape == (N_LAYERS,) and ((s.expert_union >= 2) & (s.expert_union <= N_EXPERTS)).all()
        assert s.state_norm is None and s.memory_share is None and s.bytes_read is None
        assert not s.eos_filled.any()
    assert [s.n_tokens_forward for s in steps if s.step_index == 0] == [L + len(PROMPT), 2 * L]
    assert result.n_forced == sum(int(s.forced.sum()) for s in steps)
    assert result.trace.decode_config["block_size"] == L and result.trace.decode_config["max_denoising_steps"] == 4


def test_revision_fields_follow_the_canvas(decoder):
    """previous_tokens are what the slot held after the step before; a withdrawn slot is masked next."""
    for bound, seed in ((ALL_SLOTS, 0), (None, 1)):
        trace = decoder.generate(PROMPT, DiffusionGemmaDecodeConfig(
            max_new_tokens=16, max_denoising_steps=5, entropy_bound=bound, seed=seed)).trace
        steps = trace.steps
        for prev, s in itertools.pairwise(steps):
            if s.block_index != prev.block_index:
                continue
            held = ~s.masked_before
            revised = s.rewritten | s.remasked
            assert not (revised & ~held).any()  # only a held slot can be rewritten or withdrawn
            np.testing.assert_array_equal(s.previous_tokens[revised], prev.tokens[revised])
            assert (s.previous_tokens[~revised] == -1).all()
            assert (s.tokens[s.rewritten] != s.previous_tokens[s.rewritten]).all()
            assert not (s.rewritten & ~(s.accepted | s.forced)).any()
    idx = trace.slot_index()
    assert idx.revisable and idx.n_remasked.sum() > 0  # the default bound accepts one slot a step: withdrawals


# ---------------------------------------------------------------------- traces
def test_rewrites_round_trip_through_parquet(decoder, tmp_path):
    trace = _revision_trace(decoder)
    idx = trace.slot_index()
    assert idx.n_rewritten.sum() > 0 and idx.revised
    back = Trace.load(trace.save(tmp_path / "dg.parquet"))
    assert len(back) == len(trace)
    for a, b in zip(trace.steps, back.steps):
        for name in ("tokens", "rewritten", "remasked", "previous_tokens", "accepted", "forced", "confidence"):
            np.testing.assert_array_equal(getattr(a, name), getattr(b, name))
    np.testing.assert_array_equal(back.slot_index().n_rewritten, idx.n_rewritten)
    assert back.meta["revisable"] is True and recorded_clover_config(back) is None
    assert back.decode_end.tokens.tolist() == trace.decode_end.tokens.tolist()


def test_slot_index_reads_a_revised_block_step_by_step(decoder):
    trace = _revision_trace(decoder)
    idx = trace.slot_index()
    for i, ev in enumerate(trace.steps):
        b = ev.block_index
        at, _, conf, _ = idx.written_as_of(b, i)
        written_now = ev.accepted | ev.forced
        assert (at[written_now] == i).all()
        np.testing.assert_array_equal(conf[written_now], ev.confidence[written_now])
        states = idx.slot_states(i)
        np.testing.assert_array_equal(states == "masked", ~(written_now | (~ev.masked_before & ~ev.remasked)))
        np.testing.assert_array_equal(idx.written_by(b, i), at >= 0)
    last_of_block0 = idx.last_step(0)
    np.testing.assert_array_equal(idx.written_at[0], idx.written_as_of(0, last_of_block0)[0])


def test_old_trace_without_revision_columns_loads():
    assert "rewritten" not in pq.read_schema(SMALL_TRACE).names
    trace = Trace.load(SMALL_TRACE)
    for ev in trace.steps:
        assert ev.rewritten.shape == ev.remasked.shape == ev.previous_tokens.shape == ev.tokens.shape
        assert not ev.rewritten.any() and not ev.remasked.any() and (ev.previous_tokens == -1).all()
    idx = trace.slot_index()
    assert not idx.revisable and idx.n_rewritten.sum() == 0
    assert trace.column("rewritten").dtype == bool


def test_a_new_trace_stripped_of_the_columns_loads_as_unrevised(decoder, tmp_path):
    trace = _revision_trace(decoder)
    table = trace.to_arrow()
    table = table.drop_columns(["rewritten", "remasked", "previous_tokens"])
    pq.write_table(table, tmp_path / "stripped.parquet")
    back = Trace.load(tmp_path / "stripped.parquet")
    assert back.slot_index().n_rewritten.sum() == 0
    assert all((s.previous_tokens == -1).all() for s in back.steps)


def test_step_event_defaults_and_shape_check():
    L4 = 4
    common = {
        "block_index": 0, "step_index": 0, "position_start": 0, "tokens": np.arange(L4),
        "masked_before": np.ones(L4, bool), "confidence": np.ones(L4, np.float32), "candidate": np.arange(L4),
        "top_tokens": np.zeros((L4, 1), np.int64), "top_probs": np.ones((L4, 1), np.float32),
        "accepted": np.ones(L4, bool), "forced": np.zeros(L4, bool), "eos_filled": np.zeros(L4, bool),
        "expert_union": None, "state_norm": None, "memory_share": None, "n_tokens_forward": L4, "wall_s": 0.0}
    ev = StepEvent(**common)
    assert ev.rewritten.dtype == bool and not ev.rewritten.any() and ev.n_rewritten == 0
    assert (ev.previous_tokens == -1).all() and ev.previous_tokens.dtype == np.int64
    with pytest.raises(ValueError, match=r"rewritten must have shape \(4,\)"):
        StepEvent(**common, rewritten=np.zeros(3, bool))


# ---------------------------------------------------------------------- figures
def test_block_view_renders_rewrites(decoder):
    import clover_viz.figures as F

    trace = _revision_trace(decoder)
    idx = trace.slot_index()
    i = int(np.flatnonzero(idx.n_rewritten)[0])
    fig = F.block_figure(trace, i)
    marks = {t.name: t for t in fig.data}
    assert len(marks[F.REWRITTEN_MARKS].x) == idx.n_rewritten[i]
    assert len(marks[F.REMASKED_MARKS].x) == idx.n_remasked[i]
    ev = trace.steps[i]
    s = int(np.flatnonzero(ev.rewritten)[0])
    hover = fig.data[0].customdata[s // 8][s % 8][1]
    assert "rewritten this step" in hover and f"(id {int(ev.previous_tokens[s])})" in hover
    assert fig.data[0].customdata[s // 8][s % 8][0] in ("accepted", "forced")
    assert "rewritten" in fig.layout.title.text
    other = F.block_figure(trace, 0)
    F.update_block_figure(other, trace, i)
    assert other.to_json() == fig.to_json()
    for j in range(len(trace)):  # every step draws; text and heatmap views too
        F.block_figure(trace, j)
        F.text_html(trace, step=j)
    F.confidence_heatmap(trace)
    F.text_figure(trace)
    F.expert_union_figure(trace)


def test_accept_once_block_view_has_no_revision_marks():
    import clover_viz.figures as F

    trace = Trace.load(SMALL_TRACE)
    names = {t.name for t in F.block_figure(trace, 3).data}
    assert F.REWRITTEN_MARKS not in names and F.REMASKED_MARKS not in names
    assert F.block_revision_marks(trace, 3) is None


# ---------------------------------------------------------------------- cancel
def test_cancel_keeps_finished_canvases(decoder):
    events: list = []
    stop = threading.Event()

    def hook(ev):
        events.append(ev)
        if isinstance(ev, BlockEnd):
            stop.set()  # cancel during the second canvas

    result = decoder.generate(PROMPT, DiffusionGemmaDecodeConfig(max_new_tokens=32, max_denoising_steps=3, seed=0),
                              hooks=[hook], cancel=stop)
    assert result.stop_reason == "cancelled" and result.sequences == []
    assert result.tokens == events[[type(e) for e in events].index(BlockEnd)].tokens.tolist()
    assert isinstance(events[-1], DecodeEnd) and isinstance(events[-2], BlockEnd)
    assert sum(isinstance(e, BlockEnd) for e in events) == 2


# ---------------------------------------------------------------------- in the explorer
def _byte_level_checkpoint(path: Path) -> Path:
    """A tiny random DiffusionGemma over the byte-level tokenizer (tokenizer.json beside it), as a user's
    folder would hold a tokenizer: the app and the notebook widget take text prompts."""
    from clover_engine.tokenizer import byte_tokenizer

    tok = byte_tokenizer()
    cfg = _tiny_config()
    cfg.text_config.vocab_size = tok.get_vocab_size()
    cfg.text_config.eos_token_id = tok.token_to_id("<|endoftext|>")
    torch.manual_seed(1)
    DiffusionGemmaForBlockDiffusion(cfg).eval().save_pretrained(path)
    tok.save(str(path / "tokenizer.json"))
    return path


def test_load_model_opens_it_by_path(checkpoint):
    from clover_engine.checkpoint import load_model, model_format

    assert model_format(checkpoint) == "diffusion_gemma"
    model = load_model(checkpoint)  # a model, as for every format; its capabilities name its sampler
    caps = capabilities_of(model)
    assert (caps.sampler, caps.revises_commits, caps.largest_trained_block) == ("diffusion_gemma", True, L)
    assert model.config.revisable and not model.training
    dec = decoder_for(model, config=DecodeConfig(max_new_tokens=8))  # picked by the capabilities
    assert isinstance(dec, DiffusionGemmaDecoder) and dec.model is model
    assert dec.config == DiffusionGemmaDecodeConfig(max_new_tokens=8)  # of DecodeConfig only max_new_tokens applies
    with pytest.raises(TypeError, match="runs its own sampler"):
        BlockDecoder(model)


def test_a_decode_config_runs_like_its_max_new_tokens(decoder):
    """Callers that hold the project's DecodeConfig (the explorer's settings) need no special case."""
    own = decoder.generate(PROMPT, DiffusionGemmaDecodeConfig(max_new_tokens=16, seed=3)).tokens
    torch.manual_seed(3)
    shared = decoder.generate(PROMPT, config=DecodeConfig(max_new_tokens=16, block_size=4, threshold=0.5)).tokens
    assert shared == own
    with pytest.raises(TypeError, match="DiffusionGemmaDecodeConfig or a DecodeConfig"):
        decoder.generate(PROMPT, config={"max_new_tokens": 16})


def test_the_app_shows_it_beside_a_clover_run_on_the_same_prompt(tmp_path):
    """Clover (accept-once) then DiffusionGemma (revisable) on one prompt in the app's session:
    both traces are kept, compared in one table, and the block view draws the revisable one."""
    from clover_viz import figures as F
    from clover_viz.runs import compare
    from clover_viz.state import ExplorerState
    from clover_viz.widgets import Explorer

    d = _byte_level_checkpoint(tmp_path / "tiny-gemma")
    s = ExplorerState(model_dir="clover-test", prompt="Hello, diffusion", max_new_tokens=16, block_size=8)
    try:
        assert s.generate() and s.wait(60)
        s.tick(0.02)
        clover_run = s.trace
        s.model_dir = str(d)  # typed into the model field
        assert s.error == "", s.error
        assert s.generate() and s.wait(120)
        s.tick(0.02)
        gemma_run = s.trace
        assert s.previous is clover_run and gemma_run.model_id == "tiny-gemma"
        end = gemma_run.decode_end
        assert end is not None and len(gemma_run) == end.nfe >= 2 and len(gemma_run.generated_tokens) >= 1
        table = compare(clover_run, gemma_run)
        assert table is not None
        assert len(F.compare_table(clover_run, gemma_run).data) == 1
        assert len(F.block_figure(gemma_run).data) >= 1
    finally:
        s.close()
        s.wait(5)
    ex = Explorer(str(d))
    try:
        tr = ex.decode("Hi")
        assert len(tr) >= 2 and "NFE" in ex.status.value
    finally:
        ex.close()


def test_the_app_block_view_moves_the_revision_marks_with_the_step(decoder):
    """The Panel block view's fast path (a snapshot updated per step) equals the full figure,
    revision markers included, at every step of a revisable trace."""
    pytest.importorskip("panel")
    from clover_viz import figures as F
    from clover_viz.panel_views import BlockView, FigureSnapshot
    from clover_viz.state import ExplorerState

    trace = _revision_trace(decoder)
    s = ExplorerState(model_dir="clover-test")
    try:
        s.trace = trace
        view = BlockView(state=s)
        marked = 0
        for pos in range(len(trace)):
            s.position = pos
            shown = view.pane.object.to_dict()
            want = FigureSnapshot.of(F.block_figure(trace, pos)).to_dict()
            names = [t.get("name") for t in want["data"]]
            for name in (F.REWRITTEN_MARKS, F.REMASKED_MARKS):
                i = names.index(name)
                got = shown["data"][i]
                assert list(got.get("x", [])) == list(want["data"][i].get("x", [])), (pos, name)
                assert list(got.get("text", [])) == list(want["data"][i].get("text", [])), (pos, name)
                marked += len(want["data"][i].get("x", []))
        assert marked > 0  # the trace has rewrites to show
    finally:
        s.close()


def test_generate_cli_runs_its_own_sampler(tmp_path, capsys):
    from clover_engine.generate import main

    d = _byte_level_checkpoint(tmp_path / "tiny-gemma")
    assert main(["--model", str(d), "--prompt", "Hello", "--max-new-tokens", "16", "--threads", "1",
                 "--trace", str(tmp_path / "t.parquet")]) == 0
    out = capsys.readouterr().out
    assert "DiffusionGemma, canvas 8" in out and "tokens=16" in out and (tmp_path / "t.parquet").is_file()
    assert len(Trace.load(tmp_path / "t.parquet")) >= 2


def test_two_threads_decoding_one_model_each_get_their_own_seeded_answer(decoder):
    """A served explorer's sessions (and a background careful decode) share one loaded model. DiffusionGemma's
    recording wraps the model object and its random canvases come from torch's process-wide generator, so
    two decodes of one model take turns (the second waits for the first) and each gives the answer it gives
    alone: before, the second thread's exit removed the first's wrapper ("no attribute '_prepare_sampler'")."""
    import threading

    configs = [DiffusionGemmaDecodeConfig(max_new_tokens=24, max_denoising_steps=5, seed=seed) for seed in (4, 5)]
    alone = [decoder.generate(PROMPT, dc, record_trace=False).sequences for dc in configs]
    together: dict = {}
    errors: list = []

    def run(i):
        try:
            together[i] = decoder.generate(PROMPT, configs[i]).sequences
        except Exception as exc:  # noqa: BLE001  (reported below)
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(i,)) for i in (0, 1, 0, 1)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not errors, errors
    assert together == {0: alone[0], 1: alone[1]} and alone[0] != alone[1]


def test_a_decode_waiting_for_the_model_can_be_cancelled(decoder):
    """While another decode holds the model, a cancelled decode returns at once, cancelled, with no tokens."""
    from clover_engine.backbones.diffusion_gemma.recording import _decode_lock

    lock = _decode_lock(decoder.model.lm)
    with lock:  # another decode of this model is under way
        result = decoder.generate(PROMPT, DiffusionGemmaDecodeConfig(max_new_tokens=16, seed=0), cancel=lambda: True)
    assert result.stop_reason == "cancelled" and result.tokens == []
