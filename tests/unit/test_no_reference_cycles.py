"""Sans-I/O objects that used to form reference cycles, freed by reference
counting alone (the collector is off: see :mod:`tests.leaks`)."""

from __future__ import annotations

from edge.http1 import HttpLimits
from edge.http1.errors import MessageRejected
from edge.http1.head import HeadParser
from tests.leaks import collector_off, live
from tests.mux_pair import SessionPair
from tunnel.mux import Session, StreamMetadata

LIMITS = HttpLimits()


def test_heads_cut_short_or_rejected_leave_no_parser_behind() -> None:
    # llhttp holds its callbacks for life; a HeadParser that was those callbacks
    # and held the parser made a cycle with every head not parsed to its end.
    heads = [
        (False, b"GET / HTTP/1.1\r\nHost: a\r\nX-Cut: sho"),  # the connection ends here
        (False, b"GET / HTTP/1.1\r\nHost: a\r\nBad Header\r\n\r\n"),  # rejected
        (False, b"GET / HTTP/1.1\r\nHost: a\r\n\r\n"),  # whole
        (True, b"HTTP/1.1 200 OK\r\nContent-Le"),
        (True, b"HTTP/1.1 200 OK\r\nContent-Length: x\r\n\r\n"),
    ]
    with collector_off():
        before = live(HeadParser)
        outcomes: list[int | str] = []
        for response, data in heads:
            parser = HeadParser(LIMITS, response=response)
            try:
                outcomes.append(parser.feed(data, 0))
            except MessageRejected:
                outcomes.append("rejected")
            del parser
        assert outcomes == [-1, "rejected", len(heads[2][1]), -1, "rejected"]
        assert live(HeadParser) == before


def test_a_finished_session_is_freed_with_its_connection() -> None:
    # One session per tunnel connection: a session that kept its frame handlers
    # as bound methods was a cycle, left behind by every reconnect.
    with collector_off():
        before = live(Session)
        pair = SessionPair().establish()
        stream_id = pair.client.session.open_stream(StreamMetadata(host="a"))
        pair.client.session.send_data(stream_id, b"x" * 1000)
        pair.client.session.end_stream(stream_id)
        pair.pump()
        pair.client.take(pair.client.session.connection_lost("gone"), pair.now)
        pair.server.take(pair.server.session.connection_lost("gone"), pair.now)
        assert live(Session) == before + 2
        del pair
        assert live(Session) == before
