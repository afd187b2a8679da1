"""Stickiness per request: consistent_hash on a cookie (``hash_key``) sends each
user's requests to one backend whatever connection they come on, and spreads
users; one keep-alive connection carrying several users is hashed request by
request. Real edge, origin and four Node.js backends."""

from __future__ import annotations

import collections
import json
from pathlib import Path

import pytest

from tests.conftest import PkiFiles
from tests.edge_env import Stack, edge_stack, node_available

pytestmark = pytest.mark.skipif(not node_available(), reason="run `make node` first")

POOL = 'algorithm = "consistent_hash"\nhash_key = "cookie:session"\n'


def backend_for(stack: Stack, conn: object, session: str | None) -> int:
    headers = {"Cookie": f"theme=dark; session={session}"} if session else {}
    conn.request("GET", "/ip", headers=headers)  # type: ignore[attr-defined]
    response = conn.getresponse()  # type: ignore[attr-defined]
    assert response.status == 200
    return int(json.loads(response.read())["backend"])


def test_each_session_sticks_to_one_backend_and_sessions_spread(
    test_pki: PkiFiles, tmp_path: Path
) -> None:
    users = [f"user-{n}" for n in range(16)]
    with edge_stack(test_pki, tmp_path, nodes=4, origin_pool_extra=POOL) as stack:
        first: dict[str, int] = {}
        for user in users:  # a new connection per request: the cookie, not the connection
            conn = stack.https()
            first[user] = backend_for(stack, conn, user)
            conn.close()
        again = {}
        shared = stack.https()  # one keep-alive connection carrying every user, twice
        for user in users + users:
            again.setdefault(user, set()).add(backend_for(stack, shared, user))
        shared.close()
    assert all(again[user] == {first[user]} for user in users), (first, again)
    spread = collections.Counter(first.values())
    assert len(spread) >= 3, spread  # 16 users over 4 backends
