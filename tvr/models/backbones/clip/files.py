"""CLIP facts and file handling shared by the backbone and the OpenAI checkpoint converter (a leaf module, so
neither imports the other back)."""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable
from pathlib import Path

from transformers import CLIPModel

from tvr.utils.io import create_temporary_dir, default_file_mode, is_temporary_name, write_error

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
    more files into the temporary folder before the rename (a backbone's own tensors, the tokenizer files). Files
    get the umask's mode (safetensors alone would write the weights 0600). Temporaries of an earlier, killed save
    to the same ``out_dir`` are removed first (a folder moved aside by a save killed mid-swap is put back). A write
    that fails for the file system (a full disk) raises an OSError naming ``out_dir``, whatever the library that
    wrote called it.
    """
    out_dir = Path(out_dir)
    _sweep_killed_saves(out_dir)
    if out_dir.exists() and not overwrite:
        raise FileExistsError(f"output folder already exists: {out_dir} (pass --overwrite to replace it)")
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    tmp = create_temporary_dir(out_dir)  # umask-honouring mode (mkdtemp gives 0700) and a name cleanup knows
    old = None
    try:
        model.save_pretrained(str(tmp))
        if extra is not None:
            extra(tmp)
        mode = default_file_mode()
        for path in tmp.rglob("*"):
            if path.is_file():
                os.chmod(path, mode)
        if out_dir.exists():
            old = create_temporary_dir(out_dir)
            os.replace(out_dir, old / _ASIDE)
        os.replace(tmp, out_dir)
    except BaseException as exc:
        shutil.rmtree(tmp, ignore_errors=True)
        if old is not None and (old / _ASIDE).exists() and not out_dir.exists():
            os.replace(old / _ASIDE, out_dir)
        # a full disk reads as one, naming the folder (safetensors reports it as its own error type)
        failure = write_error(exc, out_dir) if isinstance(exc, Exception) else None
        if failure is not None:
            raise failure from exc
        raise
    finally:
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)
    return out_dir


#: inside a temporary folder, the previous ``out_dir`` moved aside while the new one is renamed into place
_ASIDE = "previous"


def _sweep_killed_saves(out_dir: Path) -> None:
    if not out_dir.parent.is_dir():
        return
    for entry in out_dir.parent.iterdir():
        if not is_temporary_name(entry.name, target=out_dir.name):
            continue
        if (entry / _ASIDE).is_dir() and not out_dir.exists():
            os.replace(entry / _ASIDE, out_dir)  # killed between moving the old folder aside and the rename
        if entry.is_dir() and not entry.is_symlink():
            shutil.rmtree(entry, ignore_errors=True)
        else:
            entry.unlink(missing_ok=True)
