"""Wire constants, named as in PROTOCOL.md.

Every number that appears on the wire is defined here and nowhere else.
"""

from __future__ import annotations

import enum
import struct

#: PROTOCOL.md §2: every connection starts with these 8 octets from each side,
#: so a peer speaking something else (HTTP, TLS by mistake) fails fast and clearly.
PREFACE = b"GEOEDGE\n"

#: Versions this implementation speaks (PROTOCOL.md §3.1, version table).
VERSION_1 = 1
MIN_VERSION = VERSION_1
MAX_VERSION = VERSION_1

#: PROTOCOL.md §2: Type(8) Flags(8) Stream ID(32) Length(32), network byte order.
HEADER = struct.Struct(">BBII")
HEADER_SIZE = HEADER.size  # 10

U32 = struct.Struct(">I")
U32_PAIR = struct.Struct(">II")
SETTING = struct.Struct(">HI")

MAX_STREAM_ID = 2**32 - 1
MAX_WINDOW = 2**31 - 1

#: The smallest and largest MAX_FRAME_BYTES a peer may announce (PROTOCOL.md §4).
MIN_FRAME_BYTES = 1024
MAX_FRAME_BYTES_LIMIT = 16 * 1024 * 1024

#: GOAWAY reason text is for logs; it is capped so a peer cannot make us store much.
MAX_GOAWAY_REASON_BYTES = 256

#: PROTOCOL.md §5.14: CONTROL's payload starts with Kind(16) Message Id(32).
CONTROL_HEADER = struct.Struct(">HI")
CONTROL_HEADER_SIZE = CONTROL_HEADER.size  # 6
#: An ACK's body: Status(8), then a reason of at most this many octets (§5.14).
MAX_CONTROL_REASON_BYTES = 256
MAX_CONTROL_MESSAGE_ID = 2**32 - 1


class FrameType(enum.IntEnum):
    """PROTOCOL.md §5."""

    HELLO = 0x0
    SETTINGS = 0x1
    OPEN = 0x2
    DATA = 0x3
    WINDOW_UPDATE = 0x4
    RESET = 0x5
    PING = 0x6
    PONG = 0x7
    GOAWAY = 0x8
    PADDING = 0x9
    CONTROL = 0xA


class Flag(enum.IntFlag):
    """PROTOCOL.md §2.1. Undefined flags must be zero and are ignored."""

    NONE = 0x0
    END_STREAM = 0x1


class ErrorCode(enum.IntEnum):
    """PROTOCOL.md §9: every code, its scope and what a receiver should do."""

    NO_ERROR = 0x0
    PROTOCOL_ERROR = 0x1
    INTERNAL_ERROR = 0x2
    FLOW_CONTROL_ERROR = 0x3
    STREAM_CLOSED = 0x4
    FRAME_SIZE_ERROR = 0x5
    REFUSED_STREAM = 0x6
    CANCEL = 0x7
    VERSION_MISMATCH = 0x8
    ENHANCE_YOUR_CALM = 0x9
    METADATA_ERROR = 0xA
    STALLED = 0xB
    TIMEOUT = 0xC
    CONNECT_FAILED = 0xD
    NO_BACKEND = 0xE
    UPSTREAM_RESET = 0xF
    IDLE = 0x10

    @classmethod
    def name_of(cls, code: int) -> str:
        """The code's name, or ``UNKNOWN_0x..`` for codes from a newer peer.
        A dict lookup: every stream's end names its code (``cls(code).name``
        costs ~1.5 us, on each request)."""
        name = _ERROR_NAMES.get(code)
        return name if name is not None else f"UNKNOWN_{code:#x}"


_ERROR_NAMES: dict[int, str] = {code.value: code.name for code in ErrorCode}


class ControlKind(enum.IntEnum):
    """PROTOCOL.md §5.14, the kind registry. Each range is owned by one
    feature, which adds its kinds below its own comment."""

    ACK = 0x0000
    ECHO = 0x0001
    # 0x0002-0x00FF: the tunnel's own kinds; unassigned.
    # 0x0100-0x01FF: ACME (challenges, certificates), origin -> edge.
    ACME_CHALLENGE_SET = 0x0100
    ACME_CHALLENGE_CLEAR = 0x0101
    ACME_CERTIFICATE_SET = 0x0102
    # 0x0200-0x02FF: CACHE (purges), origin -> edge.
    CACHE_PURGE = 0x0200
    """A purge (JSON: url, prefix, tag or all; geoedge/cache_purge.py)."""
    # 0x0300-0xEFFF: unassigned. 0xF000-0xFFFF: private or experimental use.


class ControlStatus(enum.IntEnum):
    """PROTOCOL.md §5.14: the Status of an ACK."""

    APPLIED = 0
    REFUSED = 1
    UNKNOWN_KIND = 2


class SettingId(enum.IntEnum):
    """PROTOCOL.md §5.1."""

    MAX_FRAME_BYTES = 0x1
    MAX_CONCURRENT_STREAMS = 0x2
    INITIAL_STREAM_WINDOW = 0x3
    INITIAL_CONNECTION_WINDOW = 0x4
    MAX_METADATA_BYTES = 0x5


#: Values assumed for a setting the peer does not announce (PROTOCOL.md §5.1).
SETTING_DEFAULTS: dict[int, int] = {
    SettingId.MAX_FRAME_BYTES: 65536,
    SettingId.MAX_CONCURRENT_STREAMS: 16384,
    SettingId.INITIAL_STREAM_WINDOW: 256 * 1024,
    SettingId.INITIAL_CONNECTION_WINDOW: 16 * 1024 * 1024,
    SettingId.MAX_METADATA_BYTES: 4096,
}
