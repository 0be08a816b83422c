"""Sequence parallelism (Ulysses) and CFG parallelism on torch.distributed (NCCL on GPUs, gloo on CPU).

Ranks form `cfg` branches of `sp` ranks each (world = cfg x sp). With CFG parallelism, branch 0 runs
the conditional prompt and branch 1 the unconditional one; the two velocities are exchanged and
combined on every rank with the single-process formula, in the same order: u + g (c - u).

Within a branch, the media tokens are split along the sequence (padded to a multiple of sp). In every
layer each rank projects its tokens, then an all-to-all turns "my tokens, all heads" into "all tokens,
my heads" for attention: the text K/V, identical on every rank, are sliced to the rank's heads, the
padding rows are dropped from the keys, and a second all-to-all brings the outputs back to "my
tokens, all heads". After the last layer each rank projects its rows to patch velocities and one
all-gather assembles them. Every rank draws the same noise from the request seed, so all ranks hold
identical latents after every step.
"""

import atexit
import os
from dataclasses import dataclass

import torch
import torch.distributed as dist

from .errors import InputError


@dataclass(frozen=True)
class Group:
    """A process group and this process's place in it."""

    group: object
    size: int
    rank: int


@dataclass(frozen=True)
class Parallel:
    sp: Group | None = None  # sequence-parallel ranks of this CFG branch
    cfg: Group | None = None  # the ranks (one per branch) holding the same sequence shard
    is_main: bool = True  # global rank 0: prints and writes outputs


def init_from_env(sp: int = 1, cfg_parallel: bool = False) -> tuple[Parallel, torch.device]:
    """Join the torchrun job described by the environment and build the process groups.

    Returns the layout and this rank's device (cuda:LOCAL_RANK with NCCL, else CPU with gloo).
    """
    if "RANK" not in os.environ:
        raise InputError("multi-process generation needs a launcher: torchrun --nproc-per-node N -m cosmos3_runtime ...")
    cuda = torch.cuda.is_available()
    device = torch.device(f"cuda:{int(os.environ.get('LOCAL_RANK', 0))}") if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(device)
    if not dist.is_initialized():
        dist.init_process_group("nccl" if cuda else "gloo")
        # torn down before the interpreter exits: gloo's threads otherwise abort a finished rank now and then
        atexit.register(lambda: dist.is_initialized() and dist.destroy_process_group())
    world, rank = dist.get_world_size(), dist.get_rank()
    branches = 2 if cfg_parallel else 1
    if world != sp * branches:
        raise InputError(f"{world} processes cannot run sp={sp} x cfg={branches}; launch {sp * branches} processes")
    branch, sp_rank = divmod(rank, sp)
    # Every rank creates every group, in the same order (torch.distributed requires it).
    sp_groups = [dist.new_group(list(range(b * sp, (b + 1) * sp))) for b in range(branches)]
    cfg_groups = [dist.new_group([r + b * sp for b in range(branches)]) for r in range(sp)] if branches > 1 else None
    return Parallel(
        sp=Group(sp_groups[branch], sp, sp_rank) if sp > 1 else None,
        cfg=Group(cfg_groups[sp_rank], branches, branch) if cfg_groups else None,
        is_main=rank == 0,
    ), device


def check_heads(group: Group, heads: int, kv_heads: int) -> None:
    if heads % group.size or kv_heads % group.size:
        raise InputError(
            f"sequence parallelism over {group.size} ranks needs head counts divisible by {group.size}; this model "
            f"has {heads} query and {kv_heads} key/value heads (use sp = a divisor of {kv_heads})"
        )


_WITHOUT_ALL_TO_ALL: set[str] = set()  # process-group backends this torch runs no all-to-all on


class SequenceShards:
    """How one forward's media tokens are split over the ranks of a sequence-parallel group."""

    def __init__(self, group: Group, tokens: int):
        self.group = group
        self.tokens = tokens
        self.local = -(-tokens // group.size)  # rows per rank
        self.padded = self.local * group.size

    def shard(self, x: torch.Tensor) -> torch.Tensor:
        """Full rows [N, ...] -> this rank's rows [N_pad / sp, ...] (zero rows pad the last shard)."""
        if self.padded != self.tokens:
            x = torch.cat([x, x.new_zeros(self.padded - self.tokens, *x.shape[1:])])
        start = self.group.rank * self.local
        return x[start : start + self.local]

    def _all_to_all(self, chunks: list[torch.Tensor]) -> list[torch.Tensor]:
        sent = [c.contiguous() for c in chunks]
        backend = dist.get_backend(self.group.group)
        if backend not in _WITHOUT_ALL_TO_ALL:
            received = [torch.empty_like(c) for c in chunks]
            try:
                dist.all_to_all(received, sent, group=self.group.group)
                return received
            except RuntimeError as exc:  # raised before any rank sends: every rank falls back alike
                if "alltoall" not in str(exc).replace("_", "").lower():
                    raise
                _WITHOUT_ALL_TO_ALL.add(backend)
        # gloo in older torch releases (2.7 among them) has no all-to-all: every rank gathers every rank's chunks and
        # keeps those meant for it (sp times the traffic; NCCL, the GPUs' backend, has all-to-all)
        parts = [sent[0].new_empty((len(sent), *sent[0].shape)) for _ in sent]
        dist.all_gather(parts, torch.stack(sent), group=self.group.group)
        return [part[self.group.rank] for part in parts]

    def to_heads(self, x: torch.Tensor) -> torch.Tensor:
        """[N_pad / sp, heads, D] (my tokens) -> [N_pad, heads / sp, D] (all tokens, my heads)."""
        return torch.cat(self._all_to_all(list(x.chunk(self.group.size, dim=1))), dim=0)

    def to_tokens(self, x: torch.Tensor) -> torch.Tensor:
        """[N_pad, heads / sp, D] -> [N_pad / sp, heads, D]."""
        return torch.cat(self._all_to_all(list(x.chunk(self.group.size, dim=0))), dim=1)

    def my_heads(self, x: torch.Tensor) -> torch.Tensor:
        """Slice replicated [L, heads, D] to this rank's heads."""
        per_rank = x.shape[1] // self.group.size
        return x[:, self.group.rank * per_rank : (self.group.rank + 1) * per_rank]

    def gather(self, x: torch.Tensor) -> torch.Tensor:
        """Every rank's rows [N_pad / sp, F] -> all real rows [N, F]."""
        parts = [torch.empty_like(x) for _ in range(self.group.size)]
        dist.all_gather(parts, x.contiguous(), group=self.group.group)
        return torch.cat(parts)[: self.tokens]


def exchange_branches(cfg: Group, velocity: torch.Tensor) -> list[torch.Tensor]:
    """[velocity of branch 0, velocity of branch 1, ...] on every rank of a CFG group."""
    parts = [torch.empty_like(velocity) for _ in range(cfg.size)]
    dist.all_gather(parts, velocity.contiguous(), group=cfg.group)
    return parts
