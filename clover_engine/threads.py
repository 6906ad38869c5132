"""CPU thread count for every entry point (CLIs, benchmarks, the explorer app).

torch's own default is one thread per physical core. The models here are
small, and on a machine whose cores are shared (a laptop running a browser, a
CI runner, a 2-core box with other jobs) that default makes the threads wait
on each other: the same ``clover_engine.generate`` decode took ~3 minutes with
torch's default and 6-15 s with one thread on a loaded 2-core machine. So an
entry point sets the count itself, in this order:

1. ``--threads N`` on its command line (``requested``);
2. the ``OMP_NUM_THREADS`` environment variable, when set to an int >= 1;
3. otherwise half the CPUs this process may run on, at least 1 and at most
   `MAX_DEFAULT_THREADS` (1 on a 2-core machine, 4 on 8 cores or more).

Use `add_threads_argument` on an ``argparse`` parser and call
`configure_threads` with the parsed value before any torch work.

Wing: ``ground``.
"""

from __future__ import annotations

import argparse
import os

MAX_DEFAULT_THREADS = 4
ENV_VAR = "OMP_NUM_THREADS"


def usable_cpus() -> int:
    """CPUs this process may run on (its affinity mask where the OS has one), >= 1."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):
        return max(1, os.cpu_count() or 1)


def default_threads() -> int:
    """The thread count used when neither ``--threads`` nor ``OMP_NUM_THREADS`` says one:
    ``clamp(usable_cpus() // 2, 1, MAX_DEFAULT_THREADS)``."""
    return max(1, min(MAX_DEFAULT_THREADS, usable_cpus() // 2))


def resolve_threads(requested: int | None = None, environ: dict | None = None) -> int:
    """The thread count an entry point should use (see the module docstring for the order).

    Args:
        requested: the user's ``--threads`` value, or None when not given.
        environ: the environment to read ``OMP_NUM_THREADS`` from (default ``os.environ``).

    Returns:
        An int >= 1.

    Raises:
        ValueError: `requested` is not an int >= 1, or ``OMP_NUM_THREADS`` is set to
            something other than an int >= 1 (the message names the variable and the fix).
    """
    if requested is not None:
        if isinstance(requested, bool) or not isinstance(requested, int) or requested < 1:
            raise ValueError(f"--threads must be an int >= 1, got {requested!r}")
        return requested
    env = os.environ if environ is None else environ
    raw = env.get(ENV_VAR, "").strip()
    if raw:
        try:
            n = int(raw)
        except ValueError:
            n = 0
        if n < 1:
            raise ValueError(f"{ENV_VAR}={raw!r} is not an int >= 1; unset it or set e.g. {ENV_VAR}=1")
        return n
    return default_threads()


def configure_threads(requested: int | None = None) -> int:
    """Set torch's intra-op thread count (`resolve_threads`) and return it.

    Raises:
        ValueError: as `resolve_threads`.
    """
    import torch

    n = resolve_threads(requested)
    if torch.get_num_threads() != n:
        torch.set_num_threads(n)
    return n


def _positive_int(text: str) -> int:
    try:
        n = int(text)
    except ValueError:
        n = 0
    if n < 1:
        raise argparse.ArgumentTypeError(f"expected an int >= 1, got {text!r}")
    return n


def add_threads_argument(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """Add ``--threads N`` (default: ``OMP_NUM_THREADS`` if set, else `default_threads`) to `parser`."""
    parser.add_argument(
        "--threads", type=_positive_int, default=None, metavar="N",
        help=f"torch CPU threads (default: ${ENV_VAR} if set, else half the CPUs, 1 to "
             f"{MAX_DEFAULT_THREADS}; here {default_threads()})",
    )
    return parser
