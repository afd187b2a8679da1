"""The shared tier's files (edge/cache/shared.py) in a temporary directory."""

from __future__ import annotations

import time
from pathlib import Path

from edge.cache.entry import StoredResponse
from edge.cache.freshness import FreshnessRules, ResponseFacts
from edge.cache.shared import SharedTier, _name


def entry(
    url: str, key: str | None = None, *, size: int = 10, tags: frozenset[str] = frozenset()
) -> StoredResponse:
    headers = [(b"cache-control", b"max-age=60"), (b"x-a", b"\xe9")]
    return StoredResponse(
        key=key or url,
        url=url,
        status=200,
        reason=b"OK",
        headers=headers,
        body=b"b" * size,
        vary=((b"accept-language", b"fr"), (b"x-b", None)),
        request_time=1.0,
        response_time=2.0,
        initial_age=float("inf"),
        lifetime=60.0,
        facts=ResponseFacts.of(200, headers),
        tags=tags,
    )


def tier(path: Path, max_bytes: int = 10**9) -> SharedTier:
    return SharedTier(str(path), max_bytes, FreshnessRules())


def test_a_stored_response_comes_back_whole(tmp_path: Path) -> None:
    one = tier(tmp_path)
    original = entry("https://h/a", tags=frozenset({"t"}))
    one.write(original)
    [back] = tier(tmp_path).variants("https://h/a", "https://h/a")
    for name in ("key", "url", "status", "reason", "headers", "body", "vary", "request_time",
                 "response_time", "initial_age", "lifetime", "tags"):  # fmt: skip
        assert getattr(back, name) == getattr(original, name), name
    assert list(tier(tmp_path).variants("https://h/a", "other key")) == []


def test_purges_remove_what_they_name(tmp_path: Path) -> None:
    shared = tier(tmp_path)
    shared.write(entry("https://h/a", tags=frozenset({"t1"})))
    shared.write(entry("https://h/b/1"))
    shared.write(entry("https://h/b/2"))
    shared.write(entry("https://h/c"))
    shared.purge_tag("t1")
    assert not list(shared.variants("https://h/a", "https://h/a"))
    shared.purge_prefix("https://h/b/")
    assert not list(shared.variants("https://h/b/1", "https://h/b/1"))
    assert list(shared.variants("https://h/c", "https://h/c"))
    shared.purge_url("https://h/c")
    assert not list(shared.variants("https://h/c", "https://h/c"))


def test_trimming_keeps_the_directory_within_its_bound(tmp_path: Path) -> None:
    shared = tier(tmp_path, max_bytes=5000)
    for index in range(10):
        shared.write(entry(f"https://h/{index}", size=1000))  # trims at most every 5 s
        shared.trim(now=time.monotonic() + 100.0 * (index + 1))  # later: may trim now
    files = [p for d in tmp_path.iterdir() if d.is_dir() for p in d.iterdir()]
    assert sum(p.stat().st_size for p in files) <= 5000
    assert list(shared.variants("https://h/9", "https://h/9"))  # the newest stays


def test_an_unreadable_file_is_removed_not_served(tmp_path: Path) -> None:
    shared = tier(tmp_path)
    shared.write(entry("https://h/a"))
    [path] = [p for d in tmp_path.iterdir() if d.is_dir() for p in d.iterdir()]
    path.write_bytes(b"not json\nbody")
    assert list(shared.variants("https://h/a", "https://h/a")) == []
    assert not path.exists()


def test_invalidation_marks_are_read_by_the_others(tmp_path: Path) -> None:
    one, other = tier(tmp_path), tier(tmp_path)
    one.note_invalidation("https://h/a")
    assert other.invalidated_since(0.0) == ["https://h/a"]
    assert other.invalidated_since(2**40) == []


def test_a_pass_mark_one_worker_shares_the_others_read_until_it_ends(tmp_path: Path) -> None:
    now = time.time()
    tier(tmp_path).mark_pass("https://h/p", now + 120, now)
    other = tier(tmp_path)
    assert other.pass_until("https://h/p", now) == now + 120
    assert other.pass_until("https://h/other", now) is None
    assert other.pass_until("https://h/p", now + 121) is None  # ended: and gone
    assert list((tmp_path / ".passes").iterdir()) == []


def test_a_pass_mark_is_rewritten_only_once_half_of_it_has_passed(tmp_path: Path) -> None:
    shared, now = tier(tmp_path), time.time()
    shared.mark_pass("k", now + 120, now)
    shared.mark_pass("k", now + 130, now + 10)  # 110 s of 120 left: kept as it is
    assert tier(tmp_path).pass_until("k", now) == now + 120
    shared.mark_pass("k", now + 190, now + 70)  # 50 s left: renewed
    assert tier(tmp_path).pass_until("k", now) == now + 190


def test_pass_marks_survive_purges_and_ended_ones_go_at_a_trim(tmp_path: Path) -> None:
    shared, now = tier(tmp_path), time.time()
    shared.write(entry("https://h/a"))
    shared.mark_pass("held", now + 120, now)
    shared.mark_pass("ended", now - 1, now - 121)
    shared.purge_all()
    shared.purge_prefix("https://h/")
    assert shared.pass_until("held", now) == now + 120
    tier(tmp_path).trim()
    assert [p.name for p in (tmp_path / ".passes").iterdir()] == [_name("held")]
