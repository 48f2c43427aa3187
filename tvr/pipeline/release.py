"""Import a released checkpoint (CLIP4Clip ``pytorch_model.bin``, GARE ``best.pth``) as a tvr checkpoint: the
job behind ``tvr import-checkpoint``. The key mapping is :mod:`tvr.models.import_checkpoint`; the file written is
a self-describing training checkpoint (:func:`tvr.train.checkpoint.save_checkpoint`), so ``tvr eval --checkpoint``
needs nothing else."""

from __future__ import annotations

from pathlib import Path

from tvr.config import Config
from tvr.models.import_checkpoint import ImportReport, import_release_checkpoint
from tvr.utils.errors import UserError
from tvr.utils.io import atomic_write_json


def import_checkpoint(
    src: str | Path, cfg: Config, out: str | Path, *, partial: bool = False, report_path: str | Path | None = None
) -> ImportReport:
    """Map the release state dict ``src`` onto the model ``cfg`` describes and save it at ``out`` (the resolved
    config included); ``report_path`` also receives the full key report (JSON). Returns the report. Raises
    ``CheckpointImportError`` when the file does not fit the model (nothing is written then)."""
    from tvr.models.run_spec import resolve_run
    from tvr.train.checkpoint import save_checkpoint

    run = resolve_run(cfg)
    out = Path(out)
    if out.is_dir():
        raise UserError(f"--out {out} is a folder; expected a checkpoint file such as {out}/best.pt")
    model, report = import_release_checkpoint(src, run, partial=partial)
    state = {
        "imported_from": str(src),
        "import_layout": report.layout,
        "import_counts": {k: len(v) for k, v in report.to_dict().items() if isinstance(v, list)},
    }
    save_checkpoint(out, model, state=state, config=run.config)
    if report_path is not None:
        atomic_write_json(report_path, report.to_dict())
    return report
