"""clover_engine.data.packages: third-party code split by package, permissive licences only; and the
code summary of clover_engine.eval."""

from __future__ import annotations

import importlib.metadata as md

from clover_engine.data.packages import HELDOUT_PACKAGES, TRAIN_PACKAGES, licence_of, manifest, package_files
from clover_engine.eval import summarise_code


def test_split_by_package_is_disjoint_deterministic_and_capped():
    assert not set(TRAIN_PACKAGES) & set(HELDOUT_PACKAGES)
    train, held = package_files("train"), package_files("heldout")
    assert train and held and not set(train) & set(held)
    assert package_files("heldout") == held  # same order every call
    m = manifest()
    assert m == manifest()
    for name, info in m["packages"].items():
        assert info["bytes"] <= 3_000_000, name
        if info["version"] is not None:
            assert info["files"] > 0 and info["licence"], name
    # numpy and pandas are installed by the project's own extras: each lands on its side of the split
    assert m["packages"]["numpy"]["split"] == "train" and m["packages"]["numpy"]["files"] > 0
    assert m["packages"]["pandas"]["split"] == "heldout" and m["packages"]["pandas"]["files"] > 0
    assert all(p.is_file() and p.suffix == ".py" for p in held)  # real installed sources
    assert not any(part in {"tests", "test", "testing"} for p in held for part in p.parts[-4:-1])


def test_licence_is_read_from_metadata():
    assert "BSD" in licence_of(md.distribution("numpy"))


def test_summarise_code_counts_tokens_forwards_and_speed():
    rows = [dict(decoded_correct=[1] * 16 + [0] * 16, slot_correct=[1] + [0] * 31, nfe=10,
                 bd32=dict(n_tokens=64, nfe=32, n_forced=16, wall_s=2.0, correct=32),
                 ar1=dict(n_tokens=64, nfe=64, n_forced=8, wall_s=4.0, correct=48))]
    s = summarise_code(rows)
    assert s["first_block_token_acc"] == 0.5 and s["masked_slot_acc_by_index"][0] == 1.0
    assert s["bd32"]["tokens_per_forward"] == 2.0 and s["bd32"]["forced_fill_rate"] == 0.25
    assert s["ar1"]["token_acc"] == 0.75 and s["speedup_tokens_per_s_bd32_vs_ar1"] == 2.0
    assert summarise_code([]) == {}
