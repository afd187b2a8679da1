"""An emulated WAN in network namespaces: a distant user, a nearby edge, an origin and its backends.

See :mod:`loadtests.wan.emulator` for the API and the command line,
:mod:`loadtests.wan.delay` for how packets are delayed (NFQUEUE, no netem)
and what it costs, :mod:`loadtests.wan.topology` for hosts, addresses and
default delays, :mod:`loadtests.wan.shaper` for the link model.

``WanEmulator`` and ``unsupported_reason`` are imported lazily, so that
``python -m loadtests.wan.emulator`` does not import its own module twice.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from loadtests.wan.topology import (
    ADDRESSES,
    APP_ADDRESS,
    DEFAULT_DELAYS_MS,
    EDGE_ADDRESS,
    HOSTS,
    ORIGIN_ADDRESS,
    USER_ADDRESS,
    WAN_PREFIX,
    LinkParams,
    WanConfigError,
)

if TYPE_CHECKING:
    from loadtests.wan.emulator import WanEmulator, unsupported_reason

__all__ = [
    "ADDRESSES",
    "APP_ADDRESS",
    "DEFAULT_DELAYS_MS",
    "EDGE_ADDRESS",
    "HOSTS",
    "ORIGIN_ADDRESS",
    "USER_ADDRESS",
    "WAN_PREFIX",
    "LinkParams",
    "WanConfigError",
    "WanEmulator",
    "unsupported_reason",
]


def __getattr__(name: str) -> Any:
    if name in ("WanEmulator", "unsupported_reason"):
        from loadtests.wan import emulator

        return getattr(emulator, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
