"""The hand-written word lists of open-vocabulary tool calls (`clover_engine.data.open_tools`), one per
split, **disjoint** word for word: verbs and nouns of tool names, attribute words of argument keys
(each with the type its values take), key modifiers, enum sets and value words; and `eval_words`,
the eval split's words, which the harvested training vocabulary (`clover_engine.data.open_words`) keeps
away from.

`clover_engine.data.open_tools` extends the training verbs and nouns with the harvested words; the
tables here are the hand-written ones, as `clover_engine.data.open_words` needs them (without reading
the harvested list it writes).

Wing: ``ground``.
"""

from __future__ import annotations

SPLITS = ("train", "eval")

# ------------------------------------------------------------------ vocabularies (disjoint)
VERBS = {
    "train": ("get create update delete list send book cancel check find add remove schedule track "
              "reserve search start stop archive approve assign publish upload rename share sync export "
              "merge notify register renew reset restore submit verify order close open move").split(),
    "eval": ("fetch void revoke enroll dispatch rebook reschedule annotate quarantine provision escalate "
             "forecast reconcile pin mute clone deploy rollback throttle audit").split(),
}
NOUNS = {
    "train": ("invoice ticket flight booking account payment message meeting package product user report "
              "task project file folder note event contact subscription review coupon shipment playlist "
              "recipe vehicle device alarm table room order customer").split(),
    "eval": ("reservation voucher parcel itinerary ledger badge sensor warehouse patient prescription lease "
             "course manuscript podcast greenhouse turbine locker permit grant kiosk").split(),
}
# attribute words of argument keys, each with the type its values take
ATTRS = {
    "train": dict(id="code", name="person", city="city", date="date", amount="number", count="integer",
                  email="email", title="word", status="enum", priority="enum", color="enum", size="enum",
                  price="number", quantity="integer", note="word", code="code", level="integer",
                  limit="integer", region="city", language="enum", currency="enum", tags="array",
                  owner="person", label="word", mode="enum", reason="word", duration="integer",
                  weight="number", rating="integer", urgent="boolean", public="boolean", notify="boolean",
                  address="object", contact="object", start="date", guests="integer"),
    "eval": dict(seat="code", tenant="person", locale="enum", tier="enum", quota="integer", shelf="code",
                 batch="code", ward="city", serial="code", vendor="person", deadline="date",
                 humidity="number", altitude="number", margin="number", lane="integer", bay="integer",
                 gauge="number", dosage="number", keywords="array", sealed="boolean", express="boolean",
                 recurring="boolean", destination="object", sponsor="object", cohort="word", motto="word"),
}
MODIFIERS = {"train": "new max min first last home work primary".split(),
             "eval": "backup peak spare outer inner interim".split()}
ENUMS = {
    "train": [["low", "normal", "high"], ["red", "green", "blue"], ["small", "medium", "large"],
              ["draft", "active", "closed"], ["en", "de", "fr", "es"], ["EUR", "USD", "GBP"],
              ["auto", "manual"], ["daily", "weekly", "monthly"]],
    "eval": [["bronze", "silver", "gold", "platinum"], ["pt-BR", "ja-JP", "ko-KR"], ["alpha", "beta", "rc"],
             ["north", "south", "east", "west"], ["standard", "priority", "overnight"]],
}
WORDS = {"train": ("alpha bravo harbor summit meadow copper violet orbit falcon maple delta nova "
                   "lunar cedar prism ember").split(),
         "eval": ("quartz tundra zephyr obsidian saffron juniper basalt monsoon walnut cobalt "
                  "lagoon tangerine").split()}


def eval_words() -> set[str]:
    """Every lower-case word of the eval split's vocabulary: verbs, nouns, key attributes,
    modifiers, value words and enum values (the words `clover_engine.data.open_words` keeps away from)."""
    out = set(VERBS["eval"]) | set(NOUNS["eval"]) | set(ATTRS["eval"]) | set(MODIFIERS["eval"]) | set(WORDS["eval"])
    out |= {v.lower() for e in ENUMS["eval"] for v in e if v.isalpha()}
    return out
