"""Multi-process training (torchrun): wrapping the model in DistributedDataParallel and the per-rank shard of a
deterministic epoch order. Joining the process group for a job (training, evaluation, indexing) is
:mod:`tvr.utils.process_group`; the process-group primitives and the feature all-gather live in
:mod:`tvr.utils.distributed` (models use the gather, and must not import the training package).

Gradient convention. With ``W`` ranks, rank ``r`` encodes its own ``B_r`` items; the features are all-gathered
(:func:`tvr.utils.distributed.gather_batch`) and the head's loss gets the gathered batch of ``B = Σ B_r`` items with
rank ``r``'s :class:`~tvr.utils.distributed.RowShard`. Every rank ends with the *same* value ``L``, the loss one
process computes on the whole batch (spec §1.4), but a head that takes the shard does only part of the work: the
pairwise part (GARE's ψ, TV-ProxyNet's proxy generator, GraviAlign's all-pairs S_align) for its own texts against
every gathered video, ``B_r × B`` pairs; the pieces are combined by differentiable collectives (the B × B logits
all-gathered from each rank's rows, sums over pairs all-reduced from each rank's partial sums) and the cheap rest
(cross-entropies over the B × B logits, statistics of those sums) is evaluated identically on every rank.

Why every parameter still gets exactly the single-process gradient. Treat the W replicas as one computation with
parameters ``θ_0 … θ_{W−1}`` (equal) and objective ``Φ = Σ_r L_r``, where ``L_r = L`` is what rank r backpropagates.
Every collective's backward is the exact adjoint of its forward (all-gather ↔ reduce-scatter with sum; sum over
ranks ↔ sum over ranks), so the gradient rank r's autograd leaves on its replica is exactly ``∂Φ/∂θ_r``: every path
from ``θ_r`` to every rank's loss, whichever rank evaluated it. Summed over the replicas that is ``dΦ/dθ = W·dL/dθ``
(``Φ = W·L`` while they agree), and DDP's averaging (sum / W) leaves ``dL/dθ``. Concretely:

* a parameter used identically on every rank after the gather (the logit scale in the cross-entropy): each rank's
  gradient is already ``∂L/∂θ``; their mean is ``∂L/∂θ``;
* a parameter of the per-rank pairwise work (ψ on rank r's rows): every rank computes the same ``g = ∂L/∂S`` of the
  gathered logits, and the reduce-scatter hands rank r the sum ``W·g[rows of r]``, so rank r's gradient is
  ``W·∂L/∂θ|via r's rows``; the mean over ranks is ``Σ_r ∂L/∂θ|via r's rows = ∂L/∂θ``;
* a parameter before the feature gather (encoders, temporal module) likewise gets ``W·∂L/∂θ|via r's items`` on
  rank r, and the same mean.

So no rank's partial term needs a scale of its own: what a rank backpropagates is always the global ``L``, and the
collectives route the gradient of every piece back to the rank that computed it. ``tests/test_distributed.py``
checks this against one process for every registered head. A head that ignores its ``shard`` computes the
whole loss on every rank (the special case where the pairwise work is replicated): the same gradient, W times the
work. The CLIP4Clip reference returns the local slice in its gather's backward instead of the sum, which under DDP
averaging scales encoder gradients by 1/W relative to head gradients (Adam mostly hides this; global gradient
clipping does not).

Dropout under the per-rank loss: a pair's dropout mask is drawn once, by the rank that owns its row, as in one
process (replicated pairwise work drew W different masks for every pair, so the ranks' losses differed). The draws
come from each rank's own generator, so they are not the single process's draws; the gradient equality above is
exact with dropout off and holds in distribution with it on.

DDP settings (:func:`wrap_model`). ``find_unused_parameters`` is off by default: finding them costs a traversal of
the autograd graph every step, and every trainable parameter of our models takes part in the loss. Frozen
parameters (``requires_grad=False``, e.g. a frozen backbone) are not a problem: DDP leaves them out of its
gradient buckets. A model that does leave a trainable parameter unused is reported by the trainer after the first
backward, naming the parameters (freeze them, or pass ``find_unused_parameters=True``). Buffers are not re-broadcast
before every forward: ours are constants (position ids, attention masks) that every rank builds identically from
the same config, not running statistics. On torch ≥ 2.13 (``forward_sync_buffers=False``) DDP still copies rank 0's
buffers once when it wraps the model; older torch (``broadcast_buffers=False``) skips that copy too.
"""

from __future__ import annotations

import inspect

import torch
from torch import Tensor, nn

from tvr.utils.process_group import DistInfo


def wrap_model(model: nn.Module, info: DistInfo, find_unused_parameters: bool = False) -> nn.Module:
    """``model`` wrapped in DistributedDataParallel when ``info`` has several ranks; ``model`` itself otherwise.

    The model must already sit on ``info.device``. Wrapping copies rank 0's parameters to every rank, so all
    replicas start identical. ``device_ids`` is given on CUDA only (one GPU per process); on CPU (gloo) it must be
    left out. Call the wrapper's ``forward`` for training steps, so DDP's hooks see them; everything else (evaluation,
    checkpoints, the logit-scale clamp) uses the unwrapped module (:func:`tvr.train.checkpoint.unwrap_model`).
    """
    if not info.distributed:
        return model
    if not any(p.requires_grad for p in model.parameters()):
        raise ValueError("distributed training needs at least one trainable parameter; every parameter is frozen")
    device_ids = [info.device.index] if info.device.type == "cuda" else None
    ddp = nn.parallel.DistributedDataParallel
    # torch 2.13 renamed broadcast_buffers (deprecated, warns) to forward_sync_buffers
    if "forward_sync_buffers" in inspect.signature(ddp.__init__).parameters:
        buffers = {"forward_sync_buffers": False}
    else:
        buffers = {"broadcast_buffers": False}
    return ddp(
        model,
        device_ids=device_ids,
        output_device=info.device.index if device_ids else None,
        find_unused_parameters=find_unused_parameters,
        **buffers,
    )


# --------------------------------------------------------------------------------------------- data order


def epoch_permutation(n: int, seed: int, epoch: int) -> Tensor:
    """The order of ``n`` training items in ``epoch``: a fixed function of (seed, epoch), identical on all ranks."""
    generator = torch.Generator().manual_seed(int(seed) + int(epoch))
    return torch.randperm(n, generator=generator)


def shard_batches(
    order: Tensor | list[int], batch_size: int, rank: int = 0, world_size: int = 1, drop_last: bool = True
) -> list[list[int]]:
    """Cut ``order`` into global batches of ``batch_size × world_size`` items; rank r gets the r-th slice of each.

    So the set of items in global batch k does not depend on how many ranks share it. With ``drop_last=False`` the
    final partial global batch is split as evenly as possible (sizes differ by at most one; a rank may get none).
    """
    if batch_size <= 0 or world_size <= 0 or not 0 <= rank < world_size:
        raise ValueError(f"shard_batches: bad batch_size={batch_size}, rank={rank}, world_size={world_size}")
    items = order.tolist() if isinstance(order, Tensor) else list(order)
    global_size = batch_size * world_size
    out = []
    full = len(items) // global_size
    for k in range(full):
        start = k * global_size + rank * batch_size
        out.append(items[start : start + batch_size])
    rest = items[full * global_size :]
    if rest and not drop_last:
        base, extra = divmod(len(rest), world_size)
        start = rank * base + min(rank, extra)
        out.append(rest[start : start + base + (1 if rank < extra else 0)])
    return out
