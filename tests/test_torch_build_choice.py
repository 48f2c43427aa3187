"""``make install`` picks the torch build for the machine (tools/torch_build.sh, run for real by ``make
torch-choice``, which says what ``make install`` would install without installing it): the CUDA build where an NVIDIA
GPU is found (``nvidia-smi -L``, or the driver's /proc entry), else the CPU build from PyTorch's CPU wheel index, and
the plain requirement, quickly, where that index cannot be reached; ``TORCH=cpu|cuda`` and ``TORCH_INDEX`` decide
instead. A fake ``nvidia-smi`` on PATH stands for the GPU; a local HTTP server for PyTorch's index."""

from __future__ import annotations

import functools
import http.server
import os
import shutil
import socket
import subprocess
import threading
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
H100 = "GPU 0: NVIDIA H100 80GB HBM3 (UUID: GPU-5d3c2f8e-0000-1111-2222-333344445555)"

pytestmark = pytest.mark.skipif(shutil.which("make") is None, reason="make is not installed")


def choice(tmp_path: Path, *settings: str, smi: str | None = None, gpus: int = 0) -> tuple[str, str, float]:
    """``make torch-choice SETTINGS``: (what it would install, the line saying why, seconds). ``smi``: what a fake
    ``nvidia-smi -L`` prints (None: it fails, as it does without a driver); ``gpus``: entries in the fake
    /proc/driver/nvidia/gpus."""
    fake = tmp_path / "bin"
    fake.mkdir(exist_ok=True)
    script = (
        f"echo '{smi}'"
        if smi
        else "echo 'NVIDIA-SMI has failed because it could not communicate with the driver'; exit 9"
    )
    (fake / "nvidia-smi").write_text(f"#!/bin/sh\n{script}\n")
    (fake / "nvidia-smi").chmod(0o755)
    proc = tmp_path / "proc-gpus"
    proc.mkdir(exist_ok=True)
    for k in range(gpus):
        (proc / f"0000:0{k}:00.0").mkdir(exist_ok=True)
    env = {**os.environ, "PATH": f"{fake}{os.pathsep}{os.environ['PATH']}"}
    for name in ("TORCH", "TORCH_INDEX", "TORCH_CPU_INDEX", "NVIDIA_PROC", "MAKEFLAGS"):
        env.pop(name, None)
    start = time.monotonic()
    done = subprocess.run(
        ["make", "-s", "-C", str(REPO), "torch-choice", f"NVIDIA_PROC={proc}", *settings],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    seconds = time.monotonic() - start
    if done.returncode != 0:
        return "", done.stderr, seconds
    return done.stdout.strip(), done.stderr.strip(), seconds


@pytest.fixture
def cpu_index(tmp_path: Path):
    """A local stand-in for PyTorch's CPU wheel index (it answers for /torch/)."""
    root = tmp_path / "index"
    (root / "torch").mkdir(parents=True)
    (root / "torch" / "index.html").write_text("<html><body>torch-2.13.0+cpu wheels</body></html>")
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(root))
    handler.log_message = lambda *args: None
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


@pytest.fixture
def closed_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def test_a_machine_without_an_nvidia_gpu_takes_the_cpu_build_from_pytorchs_index(tmp_path, cpu_index) -> None:
    installs, said, _ = choice(tmp_path, f"TORCH_CPU_INDEX={cpu_index}")
    assert installs == f"pip install torch==2.13.0 --index-url {cpu_index}"
    assert said.startswith("torch 2.13.0: the CPU build from PyTorch's CPU wheel index") and "no NVIDIA GPU" in said


def test_an_nvidia_gpu_takes_the_cuda_build(tmp_path, cpu_index) -> None:
    installs, said, _ = choice(tmp_path, f"TORCH_CPU_INDEX={cpu_index}", smi=H100)
    assert installs == "pip install torch===2.13.0" and "the CUDA build" in said and H100 in said
    # nvidia-smi not on PATH (or failing), but the driver lists a GPU
    installs, said, _ = choice(tmp_path, f"TORCH_CPU_INDEX={cpu_index}", gpus=1)
    assert installs == "pip install torch===2.13.0" and "proc-gpus/0000:00:00.0" in said


def test_torch_cpu_or_cuda_decides_whatever_the_machine(tmp_path, cpu_index) -> None:
    installs, said, _ = choice(tmp_path, "TORCH=cpu", f"TORCH_CPU_INDEX={cpu_index}", smi=H100)
    assert installs == f"pip install torch==2.13.0 --index-url {cpu_index}" and "TORCH=cpu" in said
    installs, said, _ = choice(tmp_path, "TORCH=cuda", f"TORCH_CPU_INDEX={cpu_index}")
    assert installs == "pip install torch===2.13.0" and "TORCH=cuda" in said
    installs, said, _ = choice(tmp_path, "TORCH_INDEX=https://example.org/whl/cu126", smi=H100)
    assert installs == "pip install torch==2.13.0 --index-url https://example.org/whl/cu126"
    installs, said, _ = choice(tmp_path, "TORCH=rocm")
    assert installs == "" and "TORCH=rocm: expected auto, cpu or cuda" in said


def test_an_unreachable_cpu_index_falls_back_to_the_plain_requirement_at_once(tmp_path, closed_port) -> None:
    installs, said, seconds = choice(tmp_path, f"TORCH_CPU_INDEX=http://127.0.0.1:{closed_port}/whl/cpu")
    assert installs == "pip install torch==2.13.0" and "cannot be reached" in said
    assert seconds < 5


def test_a_cpu_index_that_never_answers_is_given_up_after_5_seconds(tmp_path) -> None:
    """A firewall that drops packets, or a server that accepts and never answers: the fallback after the probe's
    5 s timeout, not after pip's retries."""
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen(8)  # connections complete in the kernel; nothing ever reads or answers them
        port = silent.getsockname()[1]
        installs, said, seconds = choice(tmp_path, f"TORCH_CPU_INDEX=http://127.0.0.1:{port}/whl/cpu")
    assert installs == "pip install torch==2.13.0" and "cannot be reached (5 s)" in said
    assert 4.5 < seconds < 15
