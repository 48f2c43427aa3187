"""Reaching the Hugging Face hub: whether HF's offline switches are on, and whether the hub answers at all, so that a
model that is not cached fails in seconds with what to do instead of retrying for a minute."""

from __future__ import annotations

import os
import socket


def offline_requested() -> bool:
    """Whether HF's offline switches are on (the hub is then never asked)."""
    return any(
        os.environ.get(name, "").strip().lower() in ("1", "true", "yes", "on")
        for name in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE")
    )


def hub_unreachable(timeout: float = 3.0) -> str | None:
    """Why the Hugging Face hub cannot be reached from here (no name resolution, no route, …), or None when a
    connection opens (or a proxy is configured, which this check cannot see through)."""
    if any(os.environ.get(name) for name in ("HTTPS_PROXY", "https_proxy", "ALL_PROXY", "all_proxy")):
        return None
    from urllib.parse import urlparse

    from huggingface_hub import constants

    url = urlparse(constants.ENDPOINT)
    host, port = url.hostname or "huggingface.co", url.port or (443 if url.scheme == "https" else 80)
    try:
        socket.create_connection((host, port), timeout=timeout).close()
    except OSError as exc:
        return f"{host}: {exc.strerror or exc}"
    return None
