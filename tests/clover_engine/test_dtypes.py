"""Every model dtype `load_model` documents decodes; state, logits and confidences stay fp32 (issue 15, item 2).

Run: .venv/bin/python -m pytest tests/clover_engine/test_dtypes.py -q
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from clover_engine.checkpoint import MODEL_DTYPES, load_model, save_model
from clover_engine.backbones.clover.config import CloverConfig
from clover_engine.decoding.decoder import BlockDecoder, DecodeConfig
from clover_engine.recording.events import StepEvent
from clover_engine.backbones.clover.model import CloverModel
from clover_engine.tokenizer import byte_tokenizer

# Long enough for a prefill of several commit blocks before the first decoded block.
PROMPT = "def f(x):\n    return x\n\n" * 4


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    torch.manual_seed(0)
    d = tmp_path_factory.mktemp("ckpt")
    save_model(CloverModel(CloverConfig.from_name("clover-test")), d, tokenizer=byte_tokenizer())
    return d


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float64], ids=str)
@pytest.mark.parametrize("memory_mode", ["state", "state+window"])
@pytest.mark.parametrize("block_size", [1, 8, 32])
def test_low_precision_models_decode(checkpoint, dtype, memory_mode, block_size):
    model = load_model(checkpoint, dtype=dtype)
    assert model.dtype == dtype
    steps = []
    res = BlockDecoder(model, byte_tokenizer(), DecodeConfig(
        block_size=block_size, threshold=0.5, max_new_tokens=12, memory_mode=memory_mode,
    )).generate(PROMPT, hooks=[lambda e: steps.append(e) if isinstance(e, StepEvent) else None])
    assert res.nfe >= 1 and 1 <= len(res.tokens) <= 12 or res.stop_reason == "eos"
    assert steps and all(s.confidence.dtype == np.float32 for s in steps)
    conf = np.concatenate([s.confidence[s.masked_before] for s in steps])
    assert np.all(np.isfinite(conf)) and np.all((conf > 0) & (conf <= 1))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
def test_state_and_logits_stay_fp32_and_follow_the_fp32_model(checkpoint, dtype):
    """The recurrent state and the logits are fp32 in a half-precision model, and its logits
    track the fp32 model's (a wrong cast -- e.g. a bf16 state -- drifts far more)."""
    ref, low = load_model(checkpoint), load_model(checkpoint, dtype=dtype)
    ids = torch.tensor([byte_tokenizer().encode(PROMPT).ids[:24]])
    block = torch.tensor([[65, 66] + [ref.config.mask_token_id] * 6])
    outs = []
    for m in (ref, low):
        st = m.setup_state(1, "state+window")
        out = m(block, st, commit_ids=ids, block_size=8)
        assert out.logits.dtype == torch.float32
        assert all(layer.S.dtype == torch.float32 for layer in st.layers)
        outs.append(out.logits)
    assert torch.allclose(outs[0], outs[1], atol=0.15), (outs[0] - outs[1]).abs().max()


def test_dtype_outside_the_supported_ones_is_refused(checkpoint):
    assert set(MODEL_DTYPES) == {torch.float32, torch.bfloat16, torch.float16, torch.float64}
    with pytest.raises(ValueError, match="float32, bfloat16, float16, float64"):
        load_model(checkpoint, dtype=torch.float8_e4m3fn)
