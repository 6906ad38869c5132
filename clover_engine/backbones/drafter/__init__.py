"""The block drafter family over a frozen causal LM: `net`, `files`, `model`. Wing: ``backbones``."""
