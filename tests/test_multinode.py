"""Two "machines" on loopback: two torchrun agents (one process each) meet through a c10d rendezvous on 127.0.0.1,
as two nodes of a cluster would, with the launch lines of docs/scaling.md and docs/search.md. ``tvr train`` (GARE:
the per-rank loss, sharded validation and test) must equal one process training on the same global batch: the same
weights (to float rounding), losses and test metrics; ``tvr index`` must build the index one process builds. So
multi-node launch is proven, not assumed."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest
import torch
import yaml
from search_fixtures import index_args
from test_end_to_end import make_msrvtt
from test_search_distributed import OPTIONS, assert_built_like_one_process
from two_process import free_port, torchrun

from tvr.config import config_from_dict
from tvr.pipeline import run_train
from tvr.train.logging import read_jsonl


def _node(launcher: str, node_rank: int, port: int, tvr_args: list[str], log: Path) -> subprocess.Popen:
    command = [
        launcher,
        "--nnodes", "2",
        "--node_rank", str(node_rank),
        "--nproc_per_node", "1",
        "--rdzv_backend", "c10d",
        "--rdzv_endpoint", f"127.0.0.1:{port}",
        "--rdzv_id", "tvr-loopback",
        # node 0 hosts the rendezvous store; both nodes reach each other through the loopback address
        "--rdzv_conf", f"is_host={'true' if node_rank == 0 else 'false'}",
        "--local_addr", "127.0.0.1",
        "-m", "tvr.cli", *tvr_args,
    ]  # fmt: skip
    env = {**os.environ, "GLOO_SOCKET_IFNAME": "lo", "OMP_NUM_THREADS": "1"}
    return subprocess.Popen(command, stdout=log.open("w"), stderr=subprocess.STDOUT, env=env)


def _run_two_nodes(tvr_args: list[str], logs: Path) -> None:
    """``python -m tvr.cli *tvr_args`` on two loopback "nodes"; fails the test unless both finish with code 0."""
    launcher = torchrun()
    port = free_port()
    paths = [logs / f"node{k}.log" for k in range(2)]
    nodes = [_node(launcher, k, port, tvr_args, paths[k]) for k in range(2)]
    try:
        codes = [node.wait(timeout=420) for node in nodes]
    except subprocess.TimeoutExpired:
        for node in nodes:
            node.kill()
        pytest.fail("the two torchrun nodes did not finish within 420 s:\n" + paths[0].read_text()[-3000:])
    assert codes == [0, 0], "\n".join(path.read_text()[-3000:] for path in paths)


def test_two_nodes_on_loopback_train_like_one_process(tmp_path: Path) -> None:
    values = make_msrvtt(tmp_path / "data")
    # GARE without ψ dropout (a pair's dropout draw on a rank is not the single process's draw)
    values["head"] = {"name": "gare", "options": {"psi_dropout": 0.0}}
    values["train"].update({"epochs": 1, "batch_size": 4})
    config = tmp_path / "c.yaml"
    config.write_text(yaml.safe_dump(values))

    out = tmp_path / "two_nodes"
    _run_two_nodes(["train", "-c", str(config), "-o", str(out)], tmp_path)

    single = run_train(config_from_dict(json.loads(json.dumps(values))), tmp_path / "one")
    two = json.loads((out / "summary.json").read_text())
    assert two["steps"] == single["steps"] == 2  # 10 pairs, global batch 4: 2 steps
    # the logged loss and global gradient norm (before clipping) of every step: the gradient itself is compared
    runs = (out, tmp_path / "one")
    records = [[r for r in read_jsonl(run / "train_log.jsonl") if r.get("kind") == "train"] for run in runs]
    for key in ("loss", "grad_norm"):
        assert [r[key] for r in records[0]] == pytest.approx([r[key] for r in records[1]], rel=1e-4), key
    # weights: Adam turns any gradient entry into a step of about ±lr, so an entry whose true gradient is as small as
    # the two runs' rounding differences can step the other way: up to 2·lr per step (lr 1e-3, 2 steps). Every
    # entry stays within that bound, and all but a few (≤ 1 %) agree to the rounding of one step
    a = torch.load(out / "last.pt", weights_only=True)["model"]
    b = torch.load(tmp_path / "one" / "last.pt", weights_only=True)["model"]
    assert a.keys() == b.keys()
    bound = 2 * values["train"]["lr"] * two["steps"]
    for key in a:
        torch.testing.assert_close(a[key], b[key], rtol=0, atol=bound, msg=lambda m, k=key: f"{k}: {m}")
        if a[key].is_floating_point() and a[key].numel():
            close = torch.isclose(a[key], b[key], rtol=1e-4, atol=2e-4)
            assert close.float().mean() >= 0.99, f"{key}: {int((~close).sum())} of {close.numel()} entries differ"
    for tag in ("last", "best"):
        metrics = [json.loads((run / f"test_{tag}" / "metrics.json").read_text()) for run in runs]
        assert metrics[0]["t2v"] == metrics[1]["t2v"] and metrics[0]["v2t"] == metrics[1]["v2t"], tag


def test_two_nodes_on_loopback_index_like_one_process(search_setup, tmp_path: Path) -> None:
    """docs/search.md's multi-node ``tvr index`` line on loopback: each node embeds its share of the videos, rank 0
    builds the IVF shortlist once; the index equals one process's (manifest, row tables, embeddings, FAISS bytes)."""
    extra = ["--ann", "ivf", "--nlist", str(OPTIONS.nlist), "--shard-windows", str(OPTIONS.shard_windows)]
    _run_two_nodes(index_args(search_setup.videos, tmp_path / "two", search_setup.checkpoint, *extra), tmp_path)
    assert_built_like_one_process(search_setup, tmp_path / "two", tmp_path / "one")
