"""The policy list offers only what the loaded model can run (`clover_viz.session_settings.policies_for`).

clover-tiny (Clover's own model) runs threshold decoding's slot policies only; smollm2-drafter adds ``verify``;
a Dream checkpoint adds LLaDA's and Dream's samplers; a LLaDA2.0 checkpoint its own two. The page's Select follows
the loaded model, and a policy the new model cannot run gives way to ``low_confidence``.

Run: ``.venv/bin/python -m pytest -q tests/clover_viz/test_policies_fit.py``
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from clover_engine.backbones.base import Capabilities
from clover_engine.decoding.policies import SLOT_POLICIES
from clover_viz.session_settings import OFFICIAL_SAMPLERS, policies_for


def _loaded(family: str, own: str | None = None, drafts: bool = False):
    caps = Capabilities(family=family, memory_modes=("state",), observables=frozenset(), drafts=drafts)
    return SimpleNamespace(capabilities=caps, config=SimpleNamespace(family=own))


def test_each_kind_of_model_is_offered_what_it_runs():
    assert policies_for(None) == [*SLOT_POLICIES, "verify", *OFFICIAL_SAMPLERS]
    assert policies_for(_loaded("clover")) == list(SLOT_POLICIES)
    assert policies_for(_loaded("causal_lm", drafts=True)) == [*SLOT_POLICIES, "verify"]
    assert policies_for(_loaded("masked_diffusion")) == [*SLOT_POLICIES, "llada", "dream"]
    assert policies_for(_loaded("block_causal", "sdar")) == [*SLOT_POLICIES, "sdar"]
    assert policies_for(_loaded("block_causal", "fast_dllm_v2")) == [*SLOT_POLICIES, "fast_dllm_v2"]
    assert policies_for(_loaded("block_causal", "llada2")) == [*SLOT_POLICIES, "llada2", "llada21"]


def test_the_page_offers_the_loaded_models_policies_and_leaves_one_it_cannot_run():
    from clover_viz.panel_settings import SettingsPanel
    from clover_viz.state import ExplorerState

    s = ExplorerState(model_dir="clover-tiny", prompt="Hi", auto_redecode=False)
    panel = SettingsPanel(state=s)
    try:
        assert s.load_model() is not None, s.error
        assert list(panel.policy.options) == list(SLOT_POLICIES) == list(s.param.policy.objects)
        with pytest.raises(ValueError):
            s.policy = "verify"  # clover-tiny drafts for no one: not offered, refused if set in code
        assert s.policy == "low_confidence"
    finally:
        s.close()


def test_the_policy_help_says_which_sampler_each_policy_is():
    from clover_viz.session_settings import OFFICIAL_SAMPLERS, POLICY_HELP
    from clover_viz.state import ExplorerState
    from clover_engine.decoding.policies import POLICIES

    assert ExplorerState.param.policy.doc == POLICY_HELP
    for name in (*POLICIES, *OFFICIAL_SAMPLERS):
        assert f"'{name}'" in POLICY_HELP, name
