"""Writing a file that holds a secret (a private key, a certificate with its
key): whole or not at all, and readable by its owner only.

A temporary file beside the target (``mkstemp``: mode 0600), written,
fsynced, then renamed over the target, so a reader sees the old file or the
new one, never a part; a failure leaves no temporary file behind.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from pathlib import Path

__all__ = ["write_private"]


def write_private(path: Path, data: bytes) -> None:
    """Replace ``path`` with ``data``, mode 0600; raises ``OSError``."""
    fd, name = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(fd, "wb") as out:
            out.write(data)
            out.flush()
            os.fsync(out.fileno())
        os.replace(name, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(name)
        raise
