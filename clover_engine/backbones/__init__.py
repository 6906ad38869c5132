"""Backbones: the protocol every model family implements (`base`), and the registry that opens a
checkpoint by its ``model_type`` (`registry`). Wing ``backbones``, above ``recording``."""
