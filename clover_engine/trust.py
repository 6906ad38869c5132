"""How much to trust an answer, in one sentence: the share of it that was forced.

A forced fill writes the most confident slot of a forward in which no slot reached the threshold: the
model was not sure of any of them. When more than half of an answer's tokens are forced fills, the text is
mostly the model's guesses -- what a random or untrained model, or a prompt outside what a model was
trained on, produces. `forced_share_note` says so with the numbers and names a bundled model that answers
plain questions; the CLI (`clover_engine.generate`) prints it, the explorer (`clover_viz.state`, app and
notebook) appends it to the done line.

Wing: ``entry points``.
"""

from __future__ import annotations

MOSTLY_FORCED = 0.5
"""The share of an answer's tokens written as forced fills above which the answer is called mostly guessed."""

PLAIN_QUESTION_MODEL = "smollm2-drafter"
"""The bundled model that answers plain questions correctly: in verify mode it writes its base's own greedy
answer (models/smollm2-drafter/README.md)."""


def forced_share_note(n_tokens: int, n_forced: int, model_name: str | None = None) -> str:
    """One sentence when more than `MOSTLY_FORCED` of an answer was forced, else ``""``.

    Args:
        n_tokens: tokens in the answer kept (after the cut at EOS).
        n_forced: forced fills among those tokens (not the ones that wrote end-of-text slots past the answer).
        model_name: the model's name, to leave out the hint when it is the suggested model itself.

    Returns:
        e.g. ``"mostly guessed: 128 of 128 tokens were forced fills (no slot reached the threshold) -- for a
        plain question try smollm2-drafter with policy verify, which writes its base model's own answer"``.
    """
    if n_tokens <= 0 or n_forced <= MOSTLY_FORCED * n_tokens:
        return ""
    note = (f"mostly guessed: {n_forced} of {n_tokens} tokens were forced fills (no slot reached the threshold)")
    if model_name != PLAIN_QUESTION_MODEL:
        note += (f" -- for a plain question try {PLAIN_QUESTION_MODEL} with policy verify, which writes its base "
                 "model's own answer")
    return note


__all__ = ["MOSTLY_FORCED", "PLAIN_QUESTION_MODEL", "forced_share_note"]


SAMPLER_NAMES = {"sdar": "SDAR", "fast_dllm_v2": "Fast-dLLM v2", "llada2": "LLaDA2.0", "llada21": "LLaDA2.1",
                 "llada": "LLaDA", "dream": "Dream"}
"""The official samplers' names as their papers write them (``decode_config["sampler"]`` -> name)."""


def budget_note(settings: dict, n_tokens: int, stop_reason: str) -> str:
    """One sentence when a family's own sampler wrote another number of tokens than its budget, else ``""``.

    The block-causal samplers decode whole blocks aligned to absolute positions, the prompt included: SDAR and
    LLaDA2.0 run every block up to ``ceil((prompt + gen_length) / block_length)``, so an answer can pass the
    budget by up to a block; Fast-dLLM v2 decodes ``max_new_tokens // block_size`` blocks, the first one only
    finishing the prompt's last block, plus the token its last commit forward writes, so an answer can fall short
    of the budget. Said for a run that stopped on its budget (``stop_reason == "max_new_tokens"``).

    Args:
        settings: a run's ``decode_config`` (``sampler`` and ``max_new_tokens`` / ``gen_length``, block size).
        n_tokens: tokens in the answer kept. stop_reason: the run's.
    """
    sampler = settings.get("sampler")
    budget = settings.get("max_new_tokens", settings.get("gen_length"))
    if sampler not in SAMPLER_NAMES or budget is None or stop_reason != "max_new_tokens" or n_tokens == budget:
        return ""
    name, block = SAMPLER_NAMES[sampler], settings.get("block_size", settings.get("block_length"))
    if n_tokens > budget:
        return (f"{name} decodes whole blocks aligned to the prompt's start: {n_tokens} tokens for a budget of "
                f"{budget} (blocks of {block})")
    if sampler == "fast_dllm_v2":
        return (f"Fast-dLLM v2 decodes max_new_tokens // block_size = {budget // block} block(s), the first "
                f"finishing the prompt's last block of {block}: {n_tokens} tokens for a budget of {budget}")
    return f"{name} wrote {n_tokens} tokens for a budget of {budget} (blocks of {block})"
