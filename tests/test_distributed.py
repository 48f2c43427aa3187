"""Distributed training: deterministic sharded data order, and (2 CPU processes over gloo) the feature all-gather,
its gradients through DistributedDataParallel, a 2-rank Trainer run against the 1-process run with the same global
batch, bit-exact 2-rank resume (after a stop, after kill -9 of both ranks mid-epoch, after a preemption signal to
one rank), and the report of trainable parameters that take no part in the loss."""

from __future__ import annotations

import gc
import importlib.util
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
import torch.multiprocessing as mp
import torch.nn.functional as F
from torch import nn
from two_process import free_port, run_two_processes

from tvr.config import Config, TrainConfig
from tvr.losses import symmetric_infonce
from tvr.models.heads.base import RetrievalHead
from tvr.models.model import RetrievalModel
from tvr.train.data import DatasetTrainData
from tvr.train.distributed import epoch_permutation, shard_batches, wrap_model
from tvr.types import TextFeatures, VideoFeatures
from tvr.utils.device import resolve_device
from tvr.utils.distributed import RowShard, all_reduce_mean, gather_batch, gather_features
from tvr.utils.process_group import DistInfo, distributed_job, init_distributed

D, F_SLOTS = 5, 3


# --------------------------------------------------------------------------------------------- data order


class CountingDataset(torch.utils.data.Dataset):
    def __init__(self, n: int) -> None:
        self.n = n
        self.loaded: list[int] = []
        self.epochs: list[int] = []

    def set_epoch(self, epoch: int) -> None:
        self.epochs.append(epoch)

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, k: int) -> dict:
        self.loaded.append(k)
        return {"index": torch.tensor(k)}


def _indices(data: DatasetTrainData, epoch: int, start: int = 0) -> list[list[int]]:
    return [b["index"].tolist() for b in data.batches(epoch, start)]


def test_epoch_order_is_deterministic_and_resumable() -> None:
    ds = CountingDataset(22)
    data = DatasetTrainData(ds, 4, seed=7)
    assert data.len_epoch() == 5  # 22 // 4, drop_last
    first = _indices(data, 0)
    assert first == _indices(DatasetTrainData(CountingDataset(22), 4, seed=7), 0)
    perm = torch.randperm(22, generator=torch.Generator().manual_seed(7)).tolist()
    assert first == [perm[k : k + 4] for k in range(0, 20, 4)]
    assert _indices(data, 1) != first  # a new order every epoch (seed + epoch)
    assert ds.epochs == [0, 1]  # set_epoch called before each epoch's loader
    ds.loaded.clear()
    tail = _indices(data, 0, start=3)
    assert tail == first[3:]
    assert sorted(ds.loaded) == sorted(i for b in first[3:] for i in b)  # skipped batches never loaded


def test_shards_partition_the_global_batch() -> None:
    order = epoch_permutation(23, seed=1, epoch=2)
    single = shard_batches(order, 6, 0, 1)
    shards = [shard_batches(order, 3, r, 2) for r in range(2)]
    assert len(single) == len(shards[0]) == len(shards[1]) == 3
    for k in range(3):
        assert shards[0][k] + shards[1][k] == single[k]  # global batch k, in rank order
    # no drop_last: the 5 leftover items are split 3 / 2 (gather_features allows unequal item counts)
    rest = [shard_batches(order, 3, r, 2, drop_last=False)[-1] for r in range(2)]
    assert [len(r) for r in rest] == [3, 2] and rest[0] + rest[1] == order.tolist()[18:]
    ds = CountingDataset(23)
    assert DatasetTrainData(ds, 3, rank=1, world_size=2, drop_last=False).len_epoch() == 4
    with pytest.raises(ValueError, match="rank"):
        DatasetTrainData(ds, 3, rank=2, world_size=2)


def test_single_process_helpers_are_no_ops() -> None:
    info = init_distributed("cpu")
    assert (info.rank, info.world_size, info.local_rank, info.device.type) == (0, 1, 0, "cpu")
    text = TextFeatures(torch.randn(3, D))
    assert gather_features(text) is text
    x = torch.randn(4)
    assert all_reduce_mean(x) is x
    module = nn.Linear(2, 2)
    assert wrap_model(module, info) is module  # one process: no DDP wrapper
    video = VideoFeatures(torch.randn(3, F_SLOTS, D), torch.ones(3, F_SLOTS))
    gathered_text, gathered_video, shard = gather_batch(text, video)
    assert gathered_text is text and gathered_video is video and shard == RowShard.whole(3)
    block = torch.randn(3, 3)
    assert shard.gather(block) is block and shard.sum(block) is block


def test_row_shard_rows_and_positives() -> None:
    assert RowShard.split(7, 1, 3).sizes == (3, 2, 2)  # counts differ by at most one, earlier ranks first
    shard = RowShard(1, (3, 2, 2))
    assert (shard.world_size, shard.total, shard.start, shard.stop) == (3, 7, 3, 5)
    items = torch.arange(7)
    assert shard.local(items).tolist() == [3, 4]
    block = torch.arange(2 * 7).view(2, 7)  # this rank's 2 rows against all 7 items
    assert shard.positives(block).tolist() == [3, 11]  # (own item 0, item 3), (own item 1, item 4)
    for bad in [(3, (1, 1)), (0, ()), (0, (2, -1))]:
        with pytest.raises(ValueError, match="RowShard"):
            RowShard(*bad)


def test_the_model_passes_every_head_its_shard() -> None:
    """``loss(text, video, shard=None)`` is the contract (declared in the base): the model always passes the shard,
    and a head that ignores it computes the whole loss."""
    seen = []

    class Sharded(_Head):
        def loss(self, text, video, shard=None):
            seen.append(shard)
            return super().loss(text, video, shard)

    batch = {k: torch.stack([item[k] for item in _Pairs()][:4]) for k in ("text_eot", "frame_feats", "video_mask")}
    RetrievalModel(None, _Temporal(), Sharded())(batch)
    assert seen == [RowShard.whole(4)]


# --------------------------------------------------------------------------------------------- devices


def _fake_cuda(monkeypatch, count: int) -> None:
    """Pretend this process sees ``count`` GPUs (``torch.device("cuda", k)`` itself needs none)."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: count > 0)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: count)


def test_resolve_device_maps_auto_and_bare_cuda_to_the_local_rank(monkeypatch) -> None:
    _fake_cuda(monkeypatch, 0)
    assert resolve_device("auto", local_rank=1) == torch.device("cpu")
    assert resolve_device("cpu") == torch.device("cpu")
    _fake_cuda(monkeypatch, 2)
    assert resolve_device() == torch.device("cuda", 0)
    assert resolve_device("auto", local_rank=1) == torch.device("cuda", 1)
    assert resolve_device("cuda", local_rank=1) == torch.device("cuda", 1)
    assert resolve_device("cuda:0", local_rank=1) == torch.device("cuda", 0)  # an explicit index is kept
    assert resolve_device(" cpu ") == torch.device("cpu")


def test_resolve_device_errors_name_the_setting_and_what_is_available(monkeypatch) -> None:
    _fake_cuda(monkeypatch, 0)
    with pytest.raises(ValueError, match=r"train\.device='cuda' but CUDA is not available.*available: cpu"):
        resolve_device("cuda")
    with pytest.raises(ValueError, match=r"train\.device='gpu' is not a device name.*available here: cpu"):
        resolve_device("gpu")
    with pytest.raises(ValueError, match=r"eval\.device='cuda:1'"):
        resolve_device("cuda:1", setting="eval.device")
    _fake_cuda(monkeypatch, 2)
    with pytest.raises(ValueError, match=r"needs GPU 2, but this process sees 2; available: cpu, cuda:0, cuda:1"):
        resolve_device("cuda:2")
    with pytest.raises(ValueError, match=r"local rank 3\) needs GPU 3"):
        resolve_device("cuda", local_rank=3)


def test_train_and_eval_refuse_a_missing_gpu_before_writing_anything(monkeypatch, tmp_path) -> None:
    from tvr.pipeline import run_eval, run_train

    _fake_cuda(monkeypatch, 0)
    cfg = Config(train=TrainConfig(device="cuda"))
    with pytest.raises(ValueError, match=r"train\.device='cuda' but CUDA is not available"):
        run_train(cfg, tmp_path / "run")
    with pytest.raises(ValueError, match=r"train\.device='cuda' but CUDA is not available"):
        run_eval(cfg, tmp_path / "missing.pt", tmp_path / "eval")
    assert list(tmp_path.iterdir()) == []
    with pytest.raises(ValueError, match=r"train\.device='cuda' but CUDA is not available"):
        init_distributed("cuda")


# --------------------------------------------------------------------------------------------- 2 processes


class _Temporal(nn.Module):
    """Trainable parameters before the gather (like an encoder) and a frozen one (like a frozen backbone)."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(D, D)
        self.frozen_gain = nn.Parameter(torch.full((D,), 1.1), requires_grad=False)

    def forward(self, frames: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        return frames + self.lin(frames) * self.frozen_gain


class _Head(RetrievalHead):
    def __init__(self, unused: bool = False) -> None:
        super().__init__(D, logit_scale_init=2.0)
        self.text_proj = nn.Linear(D, 4)
        self.video_proj = nn.Linear(D, 4)
        if unused:
            self.spare = nn.Linear(D, 4)  # trainable but never in the loss

    def encode_texts(self, text):
        return F.normalize(self.text_proj(text.eot), dim=-1)

    def encode_videos(self, video):
        m = video.frame_mask.float().unsqueeze(-1)
        return F.normalize((self.video_proj(video.frames) * m).sum(1) / m.sum(1).clamp(min=1), dim=-1)

    def score_block(self, t, v):
        return t @ v.t()

    def loss(self, text, video, shard=None):
        # the per-rank loss: this rank's texts against every video, the logits all-gathered
        shard = shard or RowShard.whole(len(text))
        scores = shard.gather(self.score_block(self.encode_texts(shard.local(text)), self.encode_videos(video)))
        return {"loss": symmetric_infonce(self.logit_scale.exp() * scores)}


class _Pairs(torch.utils.data.Dataset):
    def __init__(self, n: int = 16) -> None:
        g = torch.Generator().manual_seed(5)
        self.frames = torch.randn(n, F_SLOTS, D, generator=g)
        self.text = self.frames.mean(1) + 0.5 * torch.randn(n, D, generator=g)
        self.mask = torch.ones(n, F_SLOTS, dtype=torch.bool)
        self.mask[::2, -1] = False

    def __len__(self) -> int:
        return len(self.frames)

    def __getitem__(self, k: int) -> dict:
        return {"text_eot": self.text[k], "frame_feats": self.frames[k], "video_mask": self.mask[k]}


class _ToyContrastive(nn.Module):
    """Encoders run before the gather (per rank), a projection and the scale after it (on the global batch).
    Float64, so one process and two ranks agree to rounding error far below any real gradient error."""

    def __init__(self, gather) -> None:
        super().__init__()
        torch.manual_seed(11)
        self.lin_t, self.lin_v = nn.Linear(D, D), nn.Linear(D, D)
        self.proj = nn.Linear(D, D)
        self.scale = nn.Parameter(torch.tensor(1.5))
        self.double()
        self.gather = gather

    def forward(self, text: TextFeatures, video: VideoFeatures) -> torch.Tensor:
        t = self.gather(TextFeatures(self.lin_t(text.eot.double())))
        v = self.gather(VideoFeatures(self.lin_v(video.frames.double()), video.frame_mask))
        t_hat = F.normalize(self.proj(t.eot), dim=-1)
        m = v.frame_mask.double().unsqueeze(-1)
        v_hat = F.normalize(self.proj((v.frames * m).sum(1) / m.sum(1)), dim=-1)
        return symmetric_infonce(self.scale.exp() * t_hat @ v_hat.t())


def _assert_grads_equal(model: nn.Module, ref: nn.Module) -> None:
    """Gradient equality up to float64 rounding.

    Two ranks sum each gradient in a different order than one process (rank 0's items, rank 1's items, then the
    all-reduce, instead of one pass over all items), so the results differ by a few ulps of the summed terms. In
    float32 that reached 2.7e-7 on an element of a cancelling sum, beyond any fixed absolute tolerance that is still
    small. In float64 those differences are ~1e-16 relative to the terms (all O(1) here), so rtol = 1e-9 leaves seven
    orders of magnitude of margin while any convention error (a missing sum over ranks, a wrong slice, no averaging)
    changes gradients by O(1) relative and fails.
    """
    for (name, p), ref_p in zip(model.named_parameters(), ref.parameters(), strict=True):
        assert p.grad is not None and p.grad.dtype == torch.float64, name
        torch.testing.assert_close(p.grad, ref_p.grad, rtol=1e-9, atol=1e-12, msg=lambda m, n=name: f"{n}: {m}")


def _train_config(**kw) -> Config:
    values = dict(epochs=2, batch_size=4, lr=5e-2, seed=0, device="cpu", log_every=1, save_every_steps=0, grad_clip=0.5)
    values.update(kw)
    return Config(train=TrainConfig(**values))


def _model(unused: bool = False) -> RetrievalModel:
    torch.manual_seed(3)
    return RetrievalModel(None, _Temporal(), _Head(unused))


def _rank_checks(rank: int, world: int, info: DistInfo, out_dir: str) -> None:
    assert (info.rank, info.world_size, info.local_rank, info.device.type) == (rank, 2, rank, "cpu")
    _worker_checks(rank, world, out_dir, info)


def _worker_checks(rank: int, world: int, out_dir: str, info: DistInfo) -> None:
    # --- forward: unequal item counts (3 + 2), a None field and a bool mask survive the gather
    g = torch.Generator().manual_seed(0)
    eot, frames = torch.randn(5, D, generator=g), torch.randn(5, F_SLOTS, D, generator=g)
    mask = torch.rand(5, F_SLOTS, generator=g) > 0.3
    mask[:, 0] = True
    rows = slice(0, 3) if rank == 0 else slice(3, 5)
    text, video = TextFeatures(eot[rows]), VideoFeatures(frames[rows], mask[rows])
    gathered = gather_features(video)
    assert torch.equal(gathered.frames, frames) and torch.equal(gathered.frame_mask, mask)
    assert gathered.frame_mask.dtype == torch.bool
    gt = gather_features(text)
    assert torch.equal(gt.eot, eot) and gt.words is None

    # --- backward through DDP: every gradient equals the 1-process full-batch gradient
    ref = _ToyContrastive(lambda x: x)
    ref(TextFeatures(eot), VideoFeatures(frames, mask)).backward()
    local = _ToyContrastive(gather_features)
    local(text, video).backward()
    # without DDP's averaging this rank's encoder gradient is W x its own items' share, not the full gradient
    assert not torch.allclose(local.lin_t.weight.grad, ref.lin_t.weight.grad, rtol=1e-3)
    toy = _ToyContrastive(gather_features)
    ddp = wrap_model(toy, info)
    assert isinstance(ddp, nn.parallel.DistributedDataParallel)
    ddp(text, video).backward()
    _assert_grads_equal(toy, ref)

    # --- padded lengths that differ across ranks are refused with a clear message on every rank
    bad = VideoFeatures(torch.zeros(2, F_SLOTS + rank, D), torch.ones(2, F_SLOTS + rank))
    try:
        gather_features(bad)
    except ValueError as exc:
        assert "VideoFeatures.frames differs across ranks" in str(exc) and "rank 1: (2, 4, 5)" in str(exc)
    else:
        raise AssertionError("mismatched padded lengths were not refused")

    torch.testing.assert_close(all_reduce_mean(torch.tensor([float(rank)])), torch.tensor([0.5]))

    # --- a 2-rank Trainer run (2 items per rank) follows the 1-process run with batch 4
    def trainer(out: Path, model: RetrievalModel, **train):  # noqa: ANN202
        return _rank_trainer(rank, world, info, out, model, **train)

    model = _model()
    if rank == 1:  # DDP must start every replica from rank 0's parameters
        with torch.no_grad():
            model.head.text_proj.weight.add_(1.0)
    straight = trainer(Path(out_dir), model)
    assert isinstance(straight.train_model, nn.parallel.DistributedDataParallel)
    assert straight.train_model.module is model and straight.model is model
    assert straight.fit()["steps"] == 8
    if rank == 0:
        torch.save(model.state_dict(), Path(out_dir) / "rank0_params.pt")
        ckpt = torch.load(Path(out_dir) / "last.pt", weights_only=True)["model"]
        assert ckpt.keys() == model.state_dict().keys()  # saved through the unwrapped module: no "module."

    # --- 2-rank resume is bit-exact: stop after 3 steps, resume to the end, match the straight run
    resumed_dir = Path(out_dir) / "resumed"
    assert trainer(resumed_dir, _model(), max_steps=3).fit()["steps"] == 3
    resumed = _zeroed_model()
    assert trainer(resumed_dir, resumed).fit(resume=True)["steps"] == 8
    for key, value in model.state_dict().items():
        assert torch.equal(resumed.state_dict()[key], value), key

    # --- a trainable parameter outside the loss: named before the first optimizer step, or handled on request
    with pytest.raises(RuntimeError, match=r"took no part in the loss: head\.spare\.weight, head\.spare\.bias"):
        trainer(Path(out_dir) / "unused", _model(unused=True)).fit()
    spare = _model(unused=True)
    cfg = _train_config(batch_size=2, max_steps=2)
    data = DatasetTrainData(_Pairs(), 2, seed=cfg.train.seed, rank=rank, world_size=world)
    from tvr.train.trainer import Trainer

    summary = Trainer(spare, cfg, data, Path(out_dir) / "unused_ok", dist_info=info, find_unused_parameters=True)
    assert summary.fit()["steps"] == 2


def _rank_trainer(rank: int, world: int, info: DistInfo, out: Path, model: RetrievalModel, callback=None, **train):  # noqa: ANN001, ANN201
    """A Trainer on this rank's share of _Pairs: 2 items per rank, 4 steps per epoch with 2 ranks."""
    from tvr.train.trainer import Trainer

    cfg = _train_config(batch_size=2, **train)
    data = DatasetTrainData(_Pairs(), 2, seed=cfg.train.seed, rank=rank, world_size=world)
    return Trainer(model, cfg, data, out, dist_info=info, step_callback=callback)


def _zeroed_model() -> RetrievalModel:
    model = _model()
    with torch.no_grad():
        for p in model.parameters():
            p.zero_()  # everything must come from the checkpoint
    return model


def _assert_resumed_equals_straight(rank: int, world: int, info: DistInfo, out_dir: Path) -> None:
    """Resume the stopped run in ``out_dir / "stopped"`` to the end, train the same run straight through, and compare
    bit for bit: parameters and the logged losses and gradient norms."""
    from tvr.train.logging import read_jsonl

    resumed = _zeroed_model()
    assert _rank_trainer(rank, world, info, out_dir / "stopped", resumed).fit(resume="auto")["steps"] == 8
    straight = _model()
    _rank_trainer(rank, world, info, out_dir / "straight", straight).fit()
    for key, value in straight.state_dict().items():
        assert torch.equal(resumed.state_dict()[key], value), key
    if rank == 0:
        logs = [read_jsonl(out_dir / run / "train_log.jsonl") for run in ("stopped", "straight")]
        drop = {"seconds", "it_s"}
        assert [{k: v for k, v in r.items() if k not in drop} for r in logs[0]] == [
            {k: v for k, v in r.items() if k not in drop} for r in logs[1]
        ]


def _preempted_ranks(rank: int, world: int, info: DistInfo, out_dir: str) -> None:
    from tvr.train.checkpoint import read_checkpoint
    from tvr.train.preemption import PreemptedError

    out = Path(out_dir)

    def signal_rank_1(trainer, record) -> None:  # noqa: ANN001
        if rank == 1 and trainer.global_step == 5:
            os.kill(os.getpid(), signal.SIGUSR1)

    with pytest.raises(PreemptedError) as stop:
        _rank_trainer(rank, world, info, out / "stopped", _model(), callback=signal_rank_1).fit()
    # both ranks stop after the same step; rank 0 learns of the signal through the reduced flag
    assert stop.value.step == 5
    assert stop.value.signal_name == ("SIGUSR1" if rank == 1 else "a preemption signal to another rank")
    state = read_checkpoint(out / "stopped" / "last.pt")["state"]
    assert (state["epoch"], state["batch_in_epoch"], state["global_step"]) == (1, 1, 5)
    assert len(state["rng_per_rank"]) == 2
    _assert_resumed_equals_straight(rank, world, info, out)


def test_a_preemption_signal_to_one_rank_stops_both_after_the_same_step(tmp_path) -> None:
    run_two_processes(_preempted_ranks, str(tmp_path))


def _killed_rank(out_dir: str, port: int, rank: int) -> None:
    """Entry point of one rank of :func:`test_kill_9_of_both_ranks_mid_epoch_resumes_bit_exact`: train with
    last.pt every 3 steps, and during step 7 say READY and wait to be killed."""
    os.environ.update(
        MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE="2", LOCAL_RANK=str(rank)
    )
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    torch.set_num_threads(1)
    info = init_distributed("cpu")

    def announce(trainer, record) -> None:  # noqa: ANN001
        if trainer.global_step == 7:
            print("READY", flush=True)
            time.sleep(120)

    _rank_trainer(rank, 2, info, Path(out_dir) / "stopped", _model(), callback=announce, save_every_steps=3).fit()


def _resume_killed(rank: int, world: int, info: DistInfo, out_dir: str) -> None:
    _assert_resumed_equals_straight(rank, world, info, Path(out_dir))


def test_kill_9_of_both_ranks_mid_epoch_resumes_bit_exact(tmp_path) -> None:
    """Two ranks (separate processes, as torchrun starts them) save last.pt every 3 steps (4 steps per epoch: step 6
    is epoch 2, batch 2) and are killed with SIGKILL during step 7; two new ranks resume from the mid-epoch
    checkpoint and end bit-identical to a run that never stopped."""
    from tvr.train.checkpoint import read_checkpoint

    port = free_port()
    here = str(Path(__file__).parent)
    procs = [
        subprocess.Popen(
            [
                sys.executable,
                "-c",
                f"import sys; sys.path.insert(0, {here!r}); import test_distributed as t; "
                f"t._killed_rank({str(tmp_path)!r}, {port}, {rank})",
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )  # fmt: skip
        for rank in range(2)
    ]
    try:
        for proc in procs:
            line = proc.stdout.readline()
            if line.strip() != "READY":
                pytest.fail(f"a rank did not reach step 7:\n{proc.stderr.read()}")
        for proc in procs:
            os.kill(proc.pid, signal.SIGKILL)
        for proc in procs:
            proc.wait(timeout=30)
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    assert [proc.returncode for proc in procs] == [-signal.SIGKILL] * 2
    state = read_checkpoint(tmp_path / "stopped" / "last.pt")["state"]
    assert (state["epoch"], state["batch_in_epoch"], state["global_step"]) == (1, 2, 6)
    run_two_processes(_resume_killed, str(tmp_path))


def _job_worker(rank: int, world: int, ports: tuple[int, int, int]) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(rank))
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    torch.set_num_threads(1)
    dist = torch.distributed

    def job(info: DistInfo) -> float:  # a DDP step, so a reducer holds the group until the job returns
        model = wrap_model(nn.Linear(3, 1), info)
        model(torch.ones(2, 3)).sum().backward()
        return float(all_reduce_mean(torch.tensor([float(rank)])))

    # each group rendezvouses on a port of its own: re-joining one port right after its group is gone is racy
    # a group that existed before the job belongs to its owner
    os.environ["MASTER_PORT"] = str(ports[0])
    init_distributed("cpu")
    with distributed_job("cpu") as info:
        assert job(info) == 0.5
    assert dist.is_initialized()
    gc.collect()
    dist.destroy_process_group()
    # a group the job created is gone when the job returns
    os.environ["MASTER_PORT"] = str(ports[1])
    with distributed_job("cpu") as info:
        assert dist.is_initialized() and info.world_size == 2
        assert job(info) == 0.5
    assert not dist.is_initialized()
    # a job that raises leaves its group to the exiting process
    os.environ["MASTER_PORT"] = str(ports[2])
    try:
        with distributed_job("cpu"):
            raise KeyError("job failed")
    except KeyError:
        pass
    assert dist.is_initialized()
    dist.destroy_process_group()


def test_a_job_destroys_only_the_process_group_it_created() -> None:
    ports = (free_port(), free_port(), free_port())
    context = mp.start_processes(_job_worker, args=(2, ports), nprocs=2, join=False, start_method="fork")
    deadline = time.monotonic() + 120
    while not context.join(timeout=2):
        if time.monotonic() > deadline:
            for process in context.processes:
                process.kill()
            pytest.fail("the two-process job did not finish within 120 s")


def test_two_process_gather_gradients_and_training(tmp_path) -> None:
    run_two_processes(_rank_checks, str(tmp_path))

    from tvr.train.logging import read_jsonl
    from tvr.train.trainer import Trainer

    model = _model()
    cfg = _train_config()
    single = Trainer(model, cfg, DatasetTrainData(_Pairs(), 4, seed=cfg.train.seed), tmp_path / "single").fit()
    assert single["steps"] == 8
    two_rank = torch.load(tmp_path / "rank0_params.pt", weights_only=True)
    for key, value in model.state_dict().items():
        torch.testing.assert_close(two_rank[key], value, rtol=1e-4, atol=1e-5)
    losses_2 = [r["loss"] for r in read_jsonl(tmp_path / "train_log.jsonl")]
    losses_1 = [r["loss"] for r in read_jsonl(tmp_path / "single" / "train_log.jsonl")]
    assert len(losses_2) == 8
    assert losses_2 == pytest.approx(losses_1, rel=1e-4)
    if importlib.util.find_spec("tensorboard") is not None:  # rank 0 alone writes TensorBoard scalars, once
        from test_tensorboard_logs import assert_events_equal_jsonl

        assert len(list((tmp_path / "tensorboard").glob("events.out.tfevents.*"))) == 1
        assert [value for _, value in assert_events_equal_jsonl(tmp_path)["train/loss"]] == pytest.approx(losses_2)
