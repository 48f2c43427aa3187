"""The ``tvr index`` job: one process, or one share of the videos per process under torchrun (gloo on CPU)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from tvr.search.build import IndexOptions, build_index, check_target
from tvr.search.encoders import SearchEncoder, load_encoder
from tvr.search.query_encoder import export_query_encoder
from tvr.utils.process_group import distributed_job


def run_index(
    source: str | os.PathLike,
    out: str | os.PathLike,
    options: IndexOptions,
    *,
    checkpoint: str | os.PathLike | None = None,
    config: str | None = None,
    overrides: list[str] | tuple[str, ...] = (),
    device: str = "cpu",
    encoder: SearchEncoder | None = None,
    state: str | os.PathLike | None = None,
) -> dict[str, Any]:
    """Build or update the index ``out`` (a folder, or a Qdrant address with ``state``, the folder of its shards) of
    ``source`` (a folder or a list file) with ``checkpoint``, or the model of ``config`` (+ ``overrides``), or the
    default encoder; under torchrun every rank embeds its share into its own shards and rank 0 finalises. Returns the
    report (rank 0; other ranks return an empty dict)."""
    check_target(out, state)  # a bad address, or a server that does not answer, before any model loads
    with distributed_job(device) as info:
        if encoder is None:
            encoder = load_encoder(checkpoint, config, overrides, device=str(info.device))
        report = build_index(
            Path(source), out, encoder, options, rank=info.rank, world_size=info.world_size, state=state
        )
        if info.rank == 0:  # the first `tvr search` of the index then loads the model's text side alone
            export_query_encoder(encoder)
        return report
