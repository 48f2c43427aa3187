"""The ``tvr index`` job: one process, or one share of the videos per process under torchrun (gloo on CPU)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from tvr.search.build import IndexOptions, build_index, check_source, check_target
from tvr.search.encoders import SearchEncoder, check_encoder_arguments, load_encoder
from tvr.search.query_encoder import export_query_encoder
from tvr.utils.errors import Interrupted
from tvr.utils.lock import check_unlocked
from tvr.utils.process_group import distributed_job


def run_index(
    source: str | os.PathLike,
    out: str | os.PathLike,
    options: IndexOptions,
    *,
    checkpoint: str | os.PathLike | None = None,
    config: str | None = None,
    overrides: list[str] | tuple[str, ...] = (),
    device: str = "auto",
    encoder: SearchEncoder | None = None,
    model: str | None = None,
    state: str | os.PathLike | None = None,
) -> dict[str, Any]:
    """Build or update the index ``out`` of ``source`` (a folder or a list file) with ``checkpoint``, a pretrained
    dual encoder (``model``), the model of ``config`` (+ ``overrides``), or the default encoder; under torchrun every
    rank embeds its share into its own shards and rank 0 finalises. ``out``: a folder, or a Qdrant address (with
    ``state``, the folder of its shards, for a server's collection). Returns the report (rank 0; other ranks return an
    empty dict).

    Everything that can be checked without the model is checked before it loads (a load takes seconds to minutes):
    the options, the videos (a folder or list with at least one video: :class:`~tvr.search.build.NoVideosError`
    otherwise), ``out`` (a folder or nothing yet, not held by another ``tvr index``; a Qdrant address that parses and,
    for a server, answers), what names the model, and the device."""
    options.validate()
    work = check_target(out, state)
    check_source(source, work)
    if encoder is None:
        checkpoint, model = check_encoder_arguments(checkpoint, config, overrides, model)
    with distributed_job(device, setting="--device") as info:
        if info.rank == 0:
            check_unlocked(work, "index")
        try:
            if encoder is None:
                encoder = load_encoder(checkpoint, config, overrides, device=str(info.device), model=model)
        except KeyboardInterrupt:
            raise Interrupted(
                f"stopped while the model loaded, before anything was written: {out} is as it was"
            ) from None
        report = build_index(
            Path(source), out, encoder, options, rank=info.rank, world_size=info.world_size, state=state
        )
        if info.rank == 0:  # the first `tvr search` of the index then loads the model's text side alone
            try:
                export_query_encoder(encoder)
            except KeyboardInterrupt:
                raise Interrupted(
                    f"the index {out} is finished and kept; its query side was not exported (the first search "
                    "exports it)"
                ) from None
        return report
