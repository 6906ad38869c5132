"""Shared test setup: one torch thread (CLOVER_TORCH_THREADS overrides).

With two threads on a 2-core machine that runs anything else, OpenMP spin-waits
made a 64-token decode ~70x slower; one thread is also what CI's runs need.
"""

import os

import torch

torch.set_num_threads(int(os.environ.get("CLOVER_TORCH_THREADS", "1")))
