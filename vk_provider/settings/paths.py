"""Where vk-provider keeps state on disk when nothing else is configured."""

from __future__ import annotations

import os
from pathlib import Path


def state_root() -> Path:
    """``$VK_PROVIDER_STATE_DIR``, else ``$XDG_STATE_HOME/vk-provider`` (``~/.local/state``)."""
    override = os.environ.get("VK_PROVIDER_STATE_DIR")
    if override:
        return Path(override).expanduser()
    base = os.environ.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
    return Path(base) / "vk-provider"
