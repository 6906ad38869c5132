"""The value-copy probe masks exactly the call's values and scores them.

Run: .venv/bin/python -m pytest tests/clover_engine/test_eval_probe.py -q
"""

import torch
import torch.nn.functional as F

from clover_engine.backbones.base import Capabilities
from clover_engine.backbones.clover.config import CloverConfig
from clover_engine.checkpoint import load_tokenizer
from clover_engine.eval import value_probe

TOK = load_tokenizer("models/clover-tiny")


class Oracle(torch.nn.Module):
    """forward_train returns one-hot rows of `clean` (predicts every slot right) or of `noisy`
    (predicts MASK on masked slots); lm_head is the identity. Records the masked tokens."""

    def __init__(self, cheat: bool):
        super().__init__()
        self.config = CloverConfig(**{**CloverConfig.from_name("clover-test").to_dict(), "vocab_size": 4096,
                                      "mask_token_id": 1, "eos_token_id": 3})
        self.cheat, self.masked = cheat, []
        self.lm_head = torch.nn.Identity()
        # what the probe asks: both memory modes run (clover-test has an attention window)
        self.capabilities = Capabilities(family="clover", memory_modes=("state", "state+window"), cost_family="clover")

    def forward_train(self, clean, noisy, L, use_window):
        assert clean.shape[1] % L == 0
        self.masked.append(TOK.decode(clean[noisy == 1].tolist()))
        return F.one_hot(clean if self.cheat else noisy, 4096).float(), None


def test_probe_scores_one_when_right_and_zero_when_it_predicts_mask():
    right = value_probe(Oracle(True), TOK, n_tasks=4)
    assert set(right) == {"window", "state"}
    assert all(v == 1.0 for mode in right.values() for v in mode.values())
    assert value_probe(Oracle(True), TOK, n_tasks=2, block_size=1) == value_probe(Oracle(True), TOK, n_tasks=2)
    assert {"name", "request"} <= set(right["window"])
    wrong = Oracle(False)
    out = value_probe(wrong, TOK, n_tasks=4)
    assert all(v == 0.0 for mode in out.values() for v in mode.values())
    # what was masked is the values and the name, nothing of the JSON around them
    from clover_engine.data.agent import eval_tasks

    t = eval_tasks(n=1)[0]
    masked = wrong.masked[0].replace(" ", "")
    assert t.name.replace("_", "") in masked.replace("_", "")
    assert '"' not in masked and "{" not in masked and "arguments" not in masked


def test_eval_cli_writes_every_setting_and_the_probe(tmp_path):
    import json

    from clover_engine.eval import main

    out = tmp_path / "eval.json"
    assert main(["--model", "models/clover-tiny", "--tasks", "2", "--ar-tasks", "1", "--stdlib-files", "1",
                 "--probe-tasks", "2", "--open-tasks", "2", "--workers", "1", "--max-new-tokens", "40",
                 "--out", str(out)]) == 0
    r = json.loads(out.read_text())
    assert set(r["agent"]) == {"bd32-window", "ar1-window", "bd32-state", "ar1-state"}
    assert r["open_tools_tasks"] == 2 and set(r["open_tools"]) == set(r["agent"])
    assert r["agent"]["bd32-window"]["n_tasks"] == 2 and r["agent"]["ar1-state"]["n_tasks"] == 1
    for s in r["agent"].values():
        assert 0 <= s["exact_match"] <= s["json_valid"] <= 1 and s["tokens_per_forward"] > 0
    assert r["speedup_common_tasks_window"] == 1 and r["speedup_tokens_per_s_bd32_vs_ar1_window"] > 0
    assert set(r["value_probe"]) == set(r["value_probe_teacher_forced"]) == {"window", "state"}
    assert len(r["stdlib"]["masked_slot_acc_by_index"]) == 32


def test_the_open_name_probe_runs_on_probe_tasks_turns(tmp_path):
    """The teacher-forced name/key probe covers min(--probe-tasks, --open-tasks) open turns (a
    blocks-of-1 pass costs like the value probe: over all --open-tasks it took minutes)."""
    import json

    from clover_engine.eval import main

    out = tmp_path / "eval.json"
    assert main(["--model", "models/clover-tiny", "--tasks", "1", "--settings", "ar1-window", "--stdlib-files", "0",
                 "--probe-tasks", "2", "--open-tasks", "3", "--workers", "1", "--max-new-tokens", "8",
                 "--out", str(out)]) == 0
    r = json.loads(out.read_text())
    assert r["open_name_probe_tasks"] == 2 and set(r["open_name_probe"]) == {"window", "state"}
