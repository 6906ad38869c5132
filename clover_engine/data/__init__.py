"""Training and evaluation corpora, deterministic from a seed.

Modules::

    clover_engine.data.agent      synthetic tool-using conversations (Qwen chat layout) with
                           ground-truth calls, held-out eval tasks, parse_call / score_call
    clover_engine.data.open_tools open-vocabulary tool calls: names, keys and schemas from
                           disjoint train / eval vocabularies (copy from the schema)
    clover_engine.data.open_words the large train vocabulary, harvested from real API names
    clover_engine.data.tool_words the hand-written word lists of both splits (disjoint), eval_words
    clover_engine.data.packages   installed third-party sources, split by package
    clover_engine.data.stdlib     the running CPython's standard-library sources, split by file
    clover_engine.data.tokenizer  byte-level BPE with fixed special-token ids 0..7

Seed rule for the agent corpus: training uses conversation seeds < ``EVAL_SEED_START``
(10_000_000), evaluation uses seeds >= it; `iter_conversations` refuses a range that
crosses the boundary.

Wing: ``ground``.
"""

from clover_engine.data.agent import (
    EVAL_SEED_START,
    CallTurn,
    Conversation,
    FieldInfo,
    eval_tasks,
    generate_conversation,
    iter_conversations,
    parse_call,
    score_call,
)
from clover_engine.data.stdlib import iter_stdlib_text, manifest, stdlib_files

# clover_engine.data.tokenizer is not imported here so that ``python -m clover_engine.data.tokenizer`` runs
# cleanly; import SPECIAL_TOKENS, train_tokenizer, build_default_tokenizer from it directly.

__all__ = [
    "EVAL_SEED_START", "CallTurn", "Conversation", "FieldInfo", "eval_tasks", "generate_conversation",
    "iter_conversations", "parse_call", "score_call", "iter_stdlib_text", "manifest", "stdlib_files",
]
