"""A backend removed from its pool (a reload) disappears from the origin's
/metrics: its series are not left behind at their last values."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import pytest

from tests.conftest import PkiFiles, scaled
from tests.edge_env import edge_stack, node_available

pytestmark = pytest.mark.skipif(not node_available(), reason="run `make node` first")


def test_a_removed_backend_has_no_series_left(test_pki: PkiFiles, tmp_path: Path) -> None:
    with edge_stack(test_pki, tmp_path, nodes=2) as stack:
        for _ in range(10):
            assert stack.get("/")[0] == 200
        config = tmp_path / "origin.toml"
        text = config.read_text()
        removed = stack.node_port  # the first of the two backends
        assert f'[[pools.backends]]\naddress = "127.0.0.1:{removed}"\n' in text
        deadline = time.monotonic() + scaled(5)
        while f'backend="127.0.0.1:{removed}"' not in stack.origin_metrics():
            assert time.monotonic() < deadline, "the backend never had series"
            time.sleep(0.2)
        config.write_text(
            text.replace(f'[[pools.backends]]\naddress = "127.0.0.1:{removed}"\n', "", 1)
        )
        assert stack.origin is not None
        os.kill(stack.origin.pid, signal.SIGHUP)
        deadline = time.monotonic() + scaled(10)
        while f'backend="127.0.0.1:{removed}"' in (metrics := stack.origin_metrics()):
            assert time.monotonic() < deadline, "the removed backend's series are still there"
            time.sleep(0.2)
        assert 'backend="127.0.0.1:' in metrics  # the remaining backend's are
        assert stack.get("/")[0] == 200
