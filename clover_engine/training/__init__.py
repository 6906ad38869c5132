"""Block-diffusion training of Clover models (docs/architecture.md §9), one job per module:
`surgery` (presets, growing a checkpoint), `rows` (data rows), `masking` (noise), `probes`
(held-out metrics, value-copy probe), `loop` (the training loop). The command line is
`python -m clover_engine.train`.

Wing: ``training``."""
