"""One forward split over several GPUs (expert and tensor parallel, as `clover_engine.decoding.parallel`
splits the model): bytes and FLOPs per GPU, their roofline time, and a ring all-reduce
communication term at the datasheet interconnect bandwidth (`INTERCONNECT_BYTES_PER_S`; collective
latency not modelled unless given) -- `project_parallel`, `project_parallel_table`,
``python -m clover_engine.cost --parallel ep=N[,tp=N]``. Wing ``cost``.

Tests: ``.venv/bin/python -m pytest tests/clover_engine/test_cost_parallel.py -q``
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from clover_engine.backbones.clover.config import CloverConfig
from clover_engine.backbones.clover.parallel_syntax import parse_parallel  # the one parser of the --parallel syntax
from clover_engine.cost.devices import DEFAULT_DEVICE, Device, get_device
from clover_engine.cost.formulas import ForwardCost, _as_config, expected_union, forward_cost


INTERCONNECT_BYTES_PER_S: dict[str, tuple[float, str]] = {
    "h800": (200e9, "NVIDIA H800 SXM5 datasheet: NVLink 400 GB/s (both directions) -> 200 GB/s each way"),
    "h100-sxm": (450e9, ("NVIDIA H100 Tensor Core GPU datasheet, H100 SXM: NVLink 900 GB/s (both directions, "
                        "18 NVLink 4 links) -> 450 GB/s each way")),
    "h200": (450e9, ("NVIDIA H200 Tensor Core GPU datasheet, H200 SXM: NVLink 900 GB/s (both directions) "
                    "-> 450 GB/s each way")),
    "a100-80gb": (300e9, ("NVIDIA A100 Tensor Core GPU datasheet, A100 80GB SXM: NVLink 600 GB/s (both "
                         "directions) -> 300 GB/s each way")),
    "b200": (900e9, ("NVIDIA HGX B200 datasheet: fifth-generation NVLink 1.8 TB/s per GPU (both directions) "
                    "-> 900 GB/s each way")),
    "rtx-4090": (31.5e9, ("no NVLink on the GeForce RTX 4090: PCIe 4.0 x16, 16 GT/s x 16 lanes with 128b/130b "
                         "coding = 31.5 GB/s each way (PCI-SIG PCIe 4.0 base specification)")),
}
"""Per-GPU interconnect bandwidth in one direction, bytes/s, and its source, per device of
`clover_engine.cost.devices.DEVICES`: what a ring all-reduce's send (or receive) stream can use."""

_SPLIT_BY_TP = ("gdn_mixers", "attention_mixers", "state_read", "state_write", "window_kv", "block_attention")
_REPLICATED = ("embedding", "norms", "routers", "lm_head")


@dataclass(frozen=True)
class ParallelForward:
    """One forward of a model split over ``gpus`` GPUs, per GPU (labelled "projected").

    ``ep`` and ``tp`` split over the same GPUs, as `clover_engine.decoding.parallel` does: each is 1 or ``gpus``.

    Attributes:
        config_name, device: the model and the device (`clover_engine.cost.devices.DEVICES`).
        gpus, ep, tp: the split (``ep=G``: routed experts sharded; ``tp=G``: mixer heads, states and
            shared experts sharded).
        single: the whole forward on one GPU (`forward_cost`).
        bytes_by_component, flops_by_component: per GPU, the keys of `single`'s.
        bytes_per_gpu, flops_per_gpu: their sums.
        memory_time_s: ``bytes_per_gpu / bandwidth``; compute_time_s: ``flops_per_gpu / peak``;
            roofline_time_s: the max of the two.
        n_collectives: all_reduces per forward (per layer: 2 with tp (mixer and shared-expert outputs),
            2 with ep (the routed [T, hidden] output and the expert-union count), 4 with both).
        comm_bytes_per_gpu: bytes each GPU sends in them (ring all-reduce: ``2 (G-1)/G`` x message).
        comm_time_s: ``comm_bytes_per_gpu / link`` + ``n_collectives * collective_latency_s``.
        link_bytes_per_s, link_source: the interconnect bandwidth used (`INTERCONNECT_BYTES_PER_S`).
        time_s: ``roofline_time_s + comm_time_s`` (no overlap of communication with compute).
    """

    config_name: str
    device: str
    gpus: int
    ep: int
    tp: int
    single: ForwardCost
    bytes_by_component: dict[str, float]
    flops_by_component: dict[str, float]
    bytes_per_gpu: float
    flops_per_gpu: float
    memory_time_s: float
    compute_time_s: float
    roofline_time_s: float
    n_collectives: int
    comm_bytes_per_gpu: float
    comm_time_s: float
    link_bytes_per_s: float
    link_source: str
    time_s: float

    def tokens_per_s(self, tokens_per_forward: float) -> float:
        """Projected tokens/s at ``tokens_per_forward`` tokens finalised per forward: ``tpf / time_s``."""
        return tokens_per_forward / self.time_s


def parse_split(text: str) -> dict[str, int]:
    """``"ep=8"`` -> ``{"ep": 8}``; ``"ep=8,tp=8"`` -> ``{"ep": 8, "tp": 8}`` (the `clover_engine.decoding.parallel` syntax).

    Raises:
        ValueError: not ``ep=N`` and/or ``tp=N`` with ints >= 1 and, when both are given, equal.
    """
    usage = f"--parallel expects ep=N and/or tp=N with N >= 1 (e.g. ep=8, tp=8, ep=8,tp=8), got {text!r}"
    try:
        out = parse_parallel(text)
    except ValueError:
        raise ValueError(usage) from None
    if len(set(out.values())) > 1:
        raise ValueError(usage + "; ep and tp split over the same GPUs, so they must be equal")
    return out


def project_parallel(
    config: CloverConfig | str = "clover-35b-a3b",
    device: Device | str = DEFAULT_DEVICE,
    ep: int = 1,
    tp: int = 1,
    n_tokens: int = 32,
    expert_union: float | Sequence[float] | None = None,
    n_commit_tokens: int = 0,
    weight_bytes: float = 2,
    *,
    act_bytes: float = 2,
    link_bytes_per_s: float | None = None,
    collective_latency_s: float = 0.0,
    **forward_kwargs: Any,
) -> ParallelForward:
    """Bytes and FLOPs per GPU of one forward split over GPUs, its roofline time and a communication term.

    Per GPU, from the single-GPU `forward_cost` breakdown (what `clover_engine.decoding.parallel` keeps on a rank):

    * ``routed_experts`` bytes and FLOPs / ep: the union's experts fall on the ep shards evenly (exact
      in expectation under independent routing; with correlated routing the busiest shard sets the
      time and this is a lower bound). The shards' bytes sum to the single-GPU expert bytes.
    * ``gdn_mixers``, ``attention_mixers``, ``state_read``, ``state_write``, ``window_kv``,
      ``block_attention`` / tp (heads split; every mixer weight, the states and the conv tails are
      per head or per channel).
    * ``shared_experts`` / tp, except the ``[1, hidden]`` sigmoid gate row of every layer (replicated).
    * ``embedding``, ``norms``, ``routers``, ``lm_head``: replicated, read in full by every GPU
      (norm FLOPs counted in full too: an upper bound, they are < 0.1 % of a forward's).

    Communication (what `clover_engine.decoding.parallel` runs, not an all-to-all dispatch): per layer one
    all_reduce of the mixer output and one of the shared-expert output ([T, hidden], ``act_bytes``
    per element) with tp, one of the routed-expert output plus one 8-byte union count with ep. A ring
    all-reduce over G GPUs sends ``2 (G - 1) / G`` times the message from each GPU, at
    ``link_bytes_per_s`` (default `INTERCONNECT_BYTES_PER_S` of the device, datasheet NVLink
    bandwidth each way). Latency per collective is ``collective_latency_s`` (default 0: **not
    modelled**; with ~4 N collectives per forward it matters at small T). Communication is not
    overlapped with compute.

    Args:
        config, device: the model (default ``clover-35b-a3b``) and a `Device` or name.
        ep, tp: each 1 or the GPU count G (both split over the same G GPUs).
        n_tokens, n_commit_tokens, weight_bytes, act_bytes, **forward_kwargs: as `forward_cost`.
        expert_union: distinct experts per layer over the whole forward; None = `expected_union`
            (independent routing).
        link_bytes_per_s: one-direction interconnect bandwidth, bytes/s; None = the device's entry.
        collective_latency_s: seconds added per collective (>= 0).

    Returns:
        A `ParallelForward`.

    Raises:
        ValueError: ep / tp < 1, both > 1 and different, no interconnect entry for the device and no
            ``link_bytes_per_s`` (when G > 1), a negative latency, or what `forward_cost` refuses.
    """
    cfg = _as_config(config)
    dev = get_device(device)
    ep, tp = int(ep), int(tp)
    if ep < 1 or tp < 1 or (ep > 1 and tp > 1 and ep != tp):
        raise ValueError(f"ep and tp must be >= 1 and, when both > 1, equal (they split over the same GPUs); "
                         f"got ep={ep}, tp={tp}")
    if collective_latency_s < 0:
        raise ValueError(f"collective_latency_s must be >= 0, got {collective_latency_s}")
    gpus = max(ep, tp)
    if link_bytes_per_s is None:
        link, source = INTERCONNECT_BYTES_PER_S.get(dev.name, (0.0, ""))
        if gpus > 1 and not link:
            raise ValueError(f"no interconnect bandwidth known for device {dev.name!r}; pass link_bytes_per_s")
    else:
        link, source = float(link_bytes_per_s), "given"
    if expert_union is None:
        expert_union = expected_union(cfg.num_experts, cfg.num_experts_per_tok, n_tokens)
    fc = forward_cost(cfg, n_tokens, expert_union, weight_bytes, n_commit_tokens, act_bytes=act_bytes,
                      **forward_kwargs)
    N, H = cfg.num_hidden_layers, cfg.hidden_size
    gate_b, gate_f = N * H * weight_bytes, N * fc.n_tokens * 2 * H  # shared_expert_gate rows, replicated
    b, f = {}, {}
    for key in fc.bytes_by_component:
        bb, ff = fc.bytes_by_component[key], fc.flops_by_component[key]
        if key == "routed_experts":
            b[key], f[key] = bb / ep, ff / ep
        elif key in _SPLIT_BY_TP:
            b[key], f[key] = bb / tp, ff / tp
        elif key == "shared_experts":
            b[key], f[key] = (bb - gate_b) / tp + gate_b, (ff - gate_f) / tp + gate_f
        elif key in _REPLICATED:
            b[key], f[key] = bb, ff
        else:
            raise ValueError(f"project_parallel does not know how to split component {key!r}")
    bytes_gpu, flops_gpu = float(sum(b.values())), float(sum(f.values()))
    t_mem, t_flop = bytes_gpu / dev.bandwidth_bytes_per_s, flops_gpu / dev.peak_flops
    msg = fc.n_tokens * H * act_bytes
    per_layer_msgs = (2 if tp > 1 else 0) + (1 if ep > 1 else 0)
    n_coll = N * (per_layer_msgs + (1 if ep > 1 else 0))
    ring = 2 * (gpus - 1) / gpus
    comm_bytes = ring * (N * per_layer_msgs * msg + (N * 8 if ep > 1 else 0))
    comm_t = (comm_bytes / link if comm_bytes else 0.0) + n_coll * collective_latency_s
    t_roof = max(t_mem, t_flop)
    return ParallelForward(cfg.name, dev.name, gpus, ep, tp, fc, b, f, bytes_gpu, flops_gpu, t_mem, t_flop,
                           t_roof, n_coll, comm_bytes, comm_t, link, source, t_roof + comm_t)


def project_parallel_table(split: str | Mapping[str, int], config: CloverConfig | str = "clover-35b-a3b",
                           device: Device | str = DEFAULT_DEVICE, **kwargs: Any) -> list[ParallelForward]:
    """`project_parallel` for 1, 2, 4, ... up to G GPUs (powers of two, then G), every key of `split`
    (``"ep=8"``, ``"tp=8"``, ``"ep=8,tp=8"``) set to the GPU count.

    Raises:
        ValueError: an unparsable split (`parse_split`), or what `project_parallel` refuses.
    """
    keys = parse_split(split) if isinstance(split, str) else dict(split)
    G = max(keys.values())
    counts = sorted({1, G} | {2**i for i in range(1, G.bit_length()) if 2**i <= G})
    return [project_parallel(config, device, **{k: g for k in keys}, **kwargs) for g in counts]
