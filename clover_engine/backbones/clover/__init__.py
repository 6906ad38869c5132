"""Parts of the Clover model (docs/architecture.md §3): `state` (recurrent state, forward
plans, outputs), `ops` (norms, RoPE, block attention, causal conv, delta-rule update), `gdn`
and `attention` (the two mixers), `moe` (sparse MoE). `clover_engine.backbones.clover.model.CloverModel` assembles them.

Wing: ``backbones``."""
