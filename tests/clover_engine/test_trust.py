"""The one sentence on how much to trust an answer (`clover_engine.trust.forced_share_note`), in the CLI
and the explorer's done line (app and notebook share `ExplorerState`).

Run: ``.venv/bin/python -m pytest tests/clover_engine/test_trust.py -q``
"""

from __future__ import annotations

from clover_engine.trust import PLAIN_QUESTION_MODEL, forced_share_note


def test_the_sentence_appears_only_past_half_forced_and_names_the_model_that_answers():
    assert forced_share_note(128, 64) == "" and forced_share_note(0, 0) == ""
    note = forced_share_note(128, 128)
    assert note.startswith("mostly guessed: 128 of 128 tokens were forced fills") and PLAIN_QUESTION_MODEL in note
    assert PLAIN_QUESTION_MODEL not in forced_share_note(10, 9, model_name=PLAIN_QUESTION_MODEL)


def test_a_random_models_answer_is_called_mostly_guessed_in_the_cli_and_the_explorer(tmp_path, capsys):
    from clover_engine import CloverConfig, CloverModel
    from clover_engine.checkpoint import save_model
    from clover_engine.generate import main
    from clover_engine.tokenizer import byte_tokenizer
    from clover_viz.state import ExplorerState

    d = save_model(CloverModel(CloverConfig.from_name("clover-test")), tmp_path / "random", tokenizer=byte_tokenizer())
    assert main(["--model", str(d), "--prompt", "What is the capital of France?", "--max-new-tokens", "16",
                 "--block-size", "8", "--threads", "1"]) == 0
    out = capsys.readouterr()
    n = int(out.out.split("tokens=")[1].split()[0])
    assert n > 0 and f"note: mostly guessed: " in out.err and f"of {n} tokens were forced fills" in out.err, out.err

    s = ExplorerState(model_dir=str(d), prompt="What is the capital of France?", max_new_tokens=16, block_size=8,
                      memory_mode="state", auto_redecode=False)
    try:
        assert s.generate(), s.error
        assert s.wait(60) and s.status.startswith("done"), s.status
        s.tick(0.02)
        assert "mostly guessed" in s.status and PLAIN_QUESTION_MODEL in s.status, s.status
    finally:
        s.close()
        s.wait(5)
