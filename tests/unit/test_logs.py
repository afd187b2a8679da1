"""Structured logs and the access log: lines parse, carry their fields, survive rotation."""

import io
import json
import logging
import os
import re
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import pytest

from geoedge.logs import (
    AccessLog,
    LogThrottle,
    configure_logging,
    debug_enabled,
    log_event,
    parse_level,
    rfc3339,
)

RFC3339_MS = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z$")


@pytest.fixture
def restore_root_logger() -> Iterator[None]:
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    yield
    for handler in list(root.handlers):
        if handler not in handlers:
            root.removeHandler(handler)
    root.setLevel(level)
    logging.captureWarnings(False)


def json_lines(stream: io.StringIO) -> list[dict]:
    return [json.loads(line) for line in stream.getvalue().splitlines()]


# ------------------------------------------------------------------ application log


@pytest.mark.usefixtures("restore_root_logger")
def test_json_lines_carry_core_and_extra_fields() -> None:
    stream = io.StringIO()
    configure_logging("info", stream=stream)
    log = logging.getLogger("geoedge.test")
    log.info("tunnel %s up", "tokyo-1", extra={"fields": {"peer": "10.0.0.1", "rtt_ms": 231.5}})
    log_event(log, "warning", "slow peer\nsecond line", peer="10.0.0.2", stalled=True)
    log.debug("hidden")

    first, second = json_lines(stream)
    assert first["level"] == "info"
    assert first["logger"] == "geoedge.test"
    assert first["msg"] == "tunnel tokyo-1 up"
    assert first["peer"] == "10.0.0.1"
    assert first["rtt_ms"] == 231.5
    assert RFC3339_MS.match(first["ts"])
    assert second == {
        "ts": second["ts"],
        "level": "warning",
        "logger": "geoedge.test",
        "msg": "slow peer\nsecond line",
        "peer": "10.0.0.2",
        "stalled": True,
    }


@pytest.mark.usefixtures("restore_root_logger")
def test_extra_fields_do_not_overwrite_core_keys_and_odd_values_serialise() -> None:
    stream = io.StringIO()
    configure_logging("debug", stream=stream)
    log_event(logging.getLogger("x"), logging.DEBUG, "m", msg="mine", path=Path("/a"))
    (line,) = json_lines(stream)
    assert line["msg"] == "m"
    assert line["field_msg"] == "mine"
    assert line["path"] == "/a"


@pytest.mark.usefixtures("restore_root_logger")
def test_exceptions_are_inside_the_one_json_line() -> None:
    stream = io.StringIO()
    configure_logging(stream=stream)
    try:
        raise RuntimeError("boom")
    except RuntimeError:
        logging.getLogger("x").exception("failed")
    (line,) = json_lines(stream)
    assert line["level"] == "error"
    assert "RuntimeError: boom" in line["exc"]


@pytest.mark.usefixtures("restore_root_logger")
def test_plain_format_for_people() -> None:
    stream = io.StringIO()
    configure_logging("info", json=False, stream=stream)
    log_event(logging.getLogger("edge"), "info", "listening", address="[::]:443")
    line = stream.getvalue().rstrip("\n")
    assert re.fullmatch(
        r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z INFO    edge: listening address='\[::\]:443'",
        line,
    )


@pytest.mark.usefixtures("restore_root_logger")
def test_configure_twice_replaces_its_own_handler_only() -> None:
    root = logging.getLogger()
    before = len(root.handlers)
    first, second = io.StringIO(), io.StringIO()
    configure_logging(stream=first)
    configure_logging(stream=second)
    assert len(root.handlers) == before + 1
    logging.getLogger("x").warning("once")
    assert first.getvalue() == ""
    assert json_lines(second)[0]["msg"] == "once"


@pytest.mark.usefixtures("restore_root_logger")
def test_debug_enabled_follows_the_configured_level() -> None:
    log = logging.getLogger("geoedge.hot")
    configure_logging("info", stream=io.StringIO())
    assert debug_enabled(log) is False
    configure_logging("DEBUG", stream=io.StringIO())
    assert debug_enabled(log) is True


def test_levels_parse_and_bad_level_is_named() -> None:
    assert parse_level("Warning") == logging.WARNING
    assert parse_level(15) == 15
    with pytest.raises(ValueError, match=r"unknown log level 'loud'; expected one of 'debug'"):
        parse_level("loud")


@pytest.mark.parametrize(
    ("timestamp", "expected"),
    [
        (0.0, "1970-01-01T00:00:00.000Z"),
        (1714564800.1239, "2024-05-01T12:00:00.123Z"),
        (1714564800.9999, "2024-05-01T12:00:00.999Z"),
        (1714564801.0, "2024-05-01T12:00:01.000Z"),
    ],
)
def test_rfc3339_milliseconds(timestamp: float, expected: str) -> None:
    assert rfc3339(timestamp) == expected
    parsed = datetime.fromisoformat(expected.replace("Z", "+00:00"))
    assert parsed.tzinfo == UTC


# ------------------------------------------------------------------ access log

REQUEST = {
    "client_ip": "203.0.113.7",
    "method": "GET",
    "host": "example.com",
    "path": "/api/items?id=1",
    "status": 200,
    "bytes_in": 312,
    "bytes_out": 4096,
    "duration_ms": 12.34567,
    "upstream_ms": 10.1,
}


def test_access_log_writes_one_line_per_request_with_fixed_keys() -> None:
    stream = io.StringIO()
    access = AccessLog(stream, edge_id="tokyo-1", buffer_bytes=0)
    for i in range(5):
        access.log(**REQUEST, origin="dublin", request_id=f"r{i}")
        assert len(stream.getvalue().splitlines()) == i + 1
    lines = json_lines(stream)
    assert [line["request_id"] for line in lines] == ["r0", "r1", "r2", "r3", "r4"]
    assert list(lines[0]) == list(AccessLog.FIELDS)
    assert lines[0]["edge_id"] == "tokyo-1"
    assert lines[0]["duration_ms"] == 12.346
    assert lines[0]["status"] == 200
    assert RFC3339_MS.match(lines[0]["ts"])


def test_access_log_extra_keys_follow_the_fixed_ones() -> None:
    stream = io.StringIO()
    access = AccessLog(stream, buffer_bytes=0)
    access.log(**REQUEST, edge_id="osaka-2", websocket=True, path_bytes="\udcff")
    (line,) = json_lines(stream)
    assert list(line)[-2:] == ["websocket", "path_bytes"]
    assert line["edge_id"] == "osaka-2"
    assert line["origin"] is None
    assert line["path_bytes"] == "\udcff"  # undecodable input cannot break the line


def test_access_log_buffers_whole_lines_until_flush(tmp_path: Path) -> None:
    now = [1000.0]
    path = tmp_path / "access.log"
    access = AccessLog(path, buffer_bytes=1 << 20, flush_interval_s=60.0, clock=lambda: now[0])
    for _ in range(3):
        access.log(**REQUEST)
    assert path.read_text() == ""
    now[0] += 61.0  # the interval elapsed: the next request writes everything
    access.log(**REQUEST)
    assert len(path.read_text().splitlines()) == 4
    access.log(**REQUEST)
    access.flush()
    lines = path.read_text().splitlines()
    assert len(lines) == 5
    assert all(json.loads(line)["path"] == REQUEST["path"] for line in lines)
    assert access.lines_written == 5
    access.close()


def test_access_log_flushes_when_the_buffer_fills(tmp_path: Path) -> None:
    path = tmp_path / "access.log"
    access = AccessLog(path, buffer_bytes=1000, flush_interval_s=3600.0)
    for _ in range(10):
        access.log(**REQUEST)
    written = path.read_text()
    assert written.endswith("\n")  # only whole lines reach the file
    assert 0 < len(written.splitlines()) < 10
    access.close()
    assert len(path.read_text().splitlines()) == 10


def test_access_log_reopen_after_rename(tmp_path: Path) -> None:
    path = tmp_path / "access.log"
    rotated = tmp_path / "access.log.1"
    with AccessLog(path, buffer_bytes=1 << 20) as access:
        access.log(**REQUEST, request_id="before")
        os.rename(path, rotated)  # what logrotate does before sending SIGHUP
        access.log(**REQUEST, request_id="pending")
        access.reopen()
        access.log(**REQUEST, request_id="after")
    assert [json.loads(x)["request_id"] for x in rotated.read_text().splitlines()] == [
        "before",
        "pending",
    ]
    assert [json.loads(x)["request_id"] for x in path.read_text().splitlines()] == ["after"]


def test_access_log_appends_to_an_existing_file(tmp_path: Path) -> None:
    path = tmp_path / "access.log"
    path.write_text('{"old":1}\n')
    with AccessLog(path) as access:
        access.log(**REQUEST)
    lines = path.read_text().splitlines()
    assert lines[0] == '{"old":1}'
    assert json.loads(lines[1])["client_ip"] == "203.0.113.7"


def test_access_log_refuses_use_after_close(tmp_path: Path) -> None:
    access = AccessLog(tmp_path / "access.log")
    access.close()
    access.close()  # idempotent
    access.reopen()  # a SIGHUP racing shutdown is harmless
    with pytest.raises(ValueError, match="closed"):
        access.log(**REQUEST)


def test_log_throttle_lets_a_burst_through_then_counts_what_it_suppressed(
    caplog: pytest.LogCaptureFixture,
) -> None:
    now = [100.0]
    logger = logging.getLogger("geoedge.test.throttle")
    throttle = LogThrottle(logger, window_s=10.0, burst=3, clock=lambda: now[0])
    with caplog.at_level(logging.WARNING, logger="geoedge.test.throttle"):
        logged = [throttle.warning("upstream failure for %s", f"10.0.0.{i}") for i in range(50)]
        assert logged == [True] * 3 + [False] * 47
        throttle.warning("another template %s", 1)  # keyed by template: its own budget
        now[0] += 10.0
        assert throttle.warning("upstream failure for %s", "10.0.0.99")
    messages = [r.getMessage() for r in caplog.records]
    assert messages[:3] == [f"upstream failure for 10.0.0.{i}" for i in range(3)]
    assert messages[3] == "another template 1"
    assert messages[4] == "upstream failure for 10.0.0.99 (47 similar suppressed)"
    assert len(messages) == 5


@pytest.mark.parametrize("daemon", ["edge", "origin"])
def test_both_daemons_take_log_options_the_same_way(daemon: str) -> None:
    """The config's log_level/log_json, overridden by --log-level/--log-format."""
    import argparse

    from geoedge.logs import add_logging_options, logging_choice

    if daemon == "edge":
        from edge.config import EdgeSection

        section: object = EdgeSection(id="e", log_level="warning", log_json=False)
    else:
        from origin.config import OriginSection

        section = OriginSection(id="o", log_level="warning", log_json=False)
    parser = argparse.ArgumentParser()
    add_logging_options(parser)
    level, json_lines = section.log_level, section.log_json  # type: ignore[attr-defined]
    assert logging_choice(parser.parse_args([]), level, json_lines) == ("warning", False)
    args = parser.parse_args(["--log-level", "debug", "--log-format", "json"])
    assert logging_choice(args, level, json_lines) == ("debug", True)
    with pytest.raises(ValueError, match="unknown log level"):
        type(section)(id="x", log_level="loud")  # type: ignore[call-arg]
