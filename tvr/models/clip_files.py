"""CLIP facts and file handling shared by the backbone and the OpenAI checkpoint converter (a leaf module, so
neither imports the other back)."""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path

from transformers import CLIPModel

from tvr.utils.io import create_temporary_dir

#: OpenAI CLIP's start/end-of-text ids; EOT is the largest id, so argmax(input_ids) finds it (spec §1.1)
SOT_ID = 49406
EOT_ID = 49407


def save_clip_atomic(
    model: CLIPModel,
    out_dir: str | os.PathLike,
    overwrite: bool = True,
    extra: Callable[[Path], object] | None = None,
) -> Path:
    """``model.save_pretrained`` into a temporary sibling folder, then rename it to ``out_dir``.

    A crash leaves either the old folder or the new one, never a half-written one. With ``overwrite``, an existing
    ``out_dir`` is moved aside first and deleted only after the new folder is in place. ``extra(folder)`` may write
    more files into the temporary folder before the rename (a backbone's own tensors).
    """
    out_dir = Path(out_dir)
    if out_dir.exists() and not overwrite:
        raise FileExistsError(f"output folder already exists: {out_dir}")
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    tmp = create_temporary_dir(out_dir)  # umask-honouring mode (mkdtemp gives 0700) and a name cleanup knows
    old = None
    try:
        model.save_pretrained(str(tmp))
        if extra is not None:
            extra(tmp)
        if out_dir.exists():
            old = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.", suffix=".old", dir=out_dir.parent))
            os.replace(out_dir, old / "x")
        os.replace(tmp, out_dir)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        if old is not None and (old / "x").exists() and not out_dir.exists():
            os.replace(old / "x", out_dir)
        raise
    finally:
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)
    return out_dir
