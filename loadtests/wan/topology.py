"""The emulated WAN's hosts, addresses and per-pair link parameters (pure data, no I/O).

Four hosts, each its own network namespace, hang off one ``router`` namespace by
a veth pair each: ``user`` (a distant region), ``edge`` (near the user),
``origin`` and ``app`` (Node.js backends near the origin). Every packet between
two hosts crosses the router exactly once, so one router can give every
*directed* pair its own one-way delay, loss and bandwidth (see
:mod:`loadtests.wan.shaper`).

Addresses come from 198.18.0.0/15, the range RFC 2544 reserves for network
benchmarks: it can never collide with a real network the machine is attached
to, and traffic to it is visibly "ours". Host ``h`` with link number ``n`` is
``198.18.n.2/24``; the router is ``198.18.n.1`` on that link.

Pairs are written the way a person would on a command line: ``"user-edge"``
means both directions, ``"user>edge"`` one direction only. Directed keys win
over undirected ones whatever their order, so ``{"user-origin": 132.5,
"origin>user": 140}`` is an asymmetric path.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, replace
from enum import Enum

__all__ = [
    "ADDRESSES",
    "APP_ADDRESS",
    "DEFAULT_DELAYS_MS",
    "EDGE_ADDRESS",
    "HOSTS",
    "KEEP",
    "ORIGIN_ADDRESS",
    "ROUTER",
    "ROUTER_ADDRESSES",
    "USER_ADDRESS",
    "WAN_PREFIX",
    "DirectedPair",
    "Keep",
    "LinkParams",
    "WanConfigError",
    "build_links",
    "directed_pairs",
    "pair_name",
    "parse_assignment",
    "parse_pair",
    "rtt_ms",
    "update_link",
]

HOSTS: tuple[str, ...] = ("user", "edge", "origin", "app")
ROUTER = "router"

#: Link number of each host: its /24 is 198.18.<n>.0.
LINK_NUMBERS: dict[str, int] = {"user": 1, "edge": 2, "origin": 3, "app": 4}

WAN_PREFIX = "198.18.0.0/15"
ADDRESSES: dict[str, str] = {h: f"198.18.{n}.2" for h, n in LINK_NUMBERS.items()}
ROUTER_ADDRESSES: dict[str, str] = {h: f"198.18.{n}.1" for h, n in LINK_NUMBERS.items()}
USER_ADDRESS = ADDRESSES["user"]
EDGE_ADDRESS = ADDRESSES["edge"]
ORIGIN_ADDRESS = ADDRESSES["origin"]
APP_ADDRESS = ADDRESSES["app"]

#: One-way delays. Tokyo to Dublin is ~265 ms RTT; the edge sits 10 ms RTT from
#: the user and everything far from the user is as far as the origin. Backends
#: share the origin's data centre (0.5 ms RTT).
DEFAULT_DELAYS_MS: dict[str, float] = {
    "user-edge": 5.0,
    "user-origin": 132.5,
    "user-app": 132.5,
    "edge-origin": 132.5,
    "edge-app": 132.5,
    "origin-app": 0.25,
}

DirectedPair = tuple[str, str]


class WanConfigError(ValueError):
    """A pair, delay, loss or bandwidth setting is wrong; ``key`` names the setting."""

    def __init__(self, key: str, message: str) -> None:
        super().__init__(f"{key}: {message}")
        self.key = key


@dataclass(frozen=True, slots=True)
class LinkParams:
    """What one direction of one host pair does to its packets."""

    delay_ms: float
    """One-way propagation delay added at the router."""
    loss: float = 0.0
    """Probability in [0, 1] that a packet is dropped (independently, no bursts)."""
    bandwidth_mbit: float | None = None
    """Serialisation rate in Mbit/s (10**6 bit/s); None means as fast as the CPU goes."""

    def __post_init__(self) -> None:
        if not (math.isfinite(self.delay_ms) and self.delay_ms >= 0):
            raise WanConfigError("delay_ms", f"must be a finite number >= 0, got {self.delay_ms!r}")
        if not (0.0 <= self.loss <= 1.0):
            raise WanConfigError("loss", f"must be a probability in [0, 1], got {self.loss!r}")
        bw = self.bandwidth_mbit
        if bw is not None and not (math.isfinite(bw) and bw > 0):
            raise WanConfigError("bandwidth_mbit", f"must be > 0 or None, got {bw!r}")

    def to_json(self) -> dict[str, float | None]:
        return {"delay_ms": self.delay_ms, "loss": self.loss, "bandwidth_mbit": self.bandwidth_mbit}

    @classmethod
    def from_json(cls, data: Mapping[str, object]) -> LinkParams:
        unknown = set(data) - {"delay_ms", "loss", "bandwidth_mbit"}
        if unknown:
            raise WanConfigError(sorted(unknown)[0], "unknown link parameter")
        bw = data.get("bandwidth_mbit")
        return cls(
            delay_ms=float(data["delay_ms"]),  # type: ignore[arg-type]
            loss=float(data.get("loss", 0.0)),  # type: ignore[arg-type]
            bandwidth_mbit=None if bw is None else float(bw),  # type: ignore[arg-type]
        )


def _check_host(key: str, host: str) -> str:
    if host not in LINK_NUMBERS:
        raise WanConfigError(key, f"unknown host {host!r}; hosts are {', '.join(HOSTS)}")
    return host


def pair_name(pair: DirectedPair) -> str:
    """The wire/display name of a directed pair: ``"user>edge"``."""
    return f"{pair[0]}>{pair[1]}"


def parse_pair(spec: str | tuple[str, str]) -> tuple[list[DirectedPair], bool]:
    """Directed pairs meant by ``spec`` and whether it named one direction only.

    ``"a-b"`` and ``("a", "b")`` mean both directions, ``"a>b"`` only a to b.
    """
    key = spec if isinstance(spec, str) else "-".join(spec)
    if isinstance(spec, tuple):
        if len(spec) != 2:
            raise WanConfigError(key, "a pair names exactly two hosts")
        a, b, directed = spec[0], spec[1], False
    elif ">" in spec:
        a, _, b = spec.partition(">")
        directed = True
    elif "-" in spec:
        a, _, b = spec.partition("-")
        directed = False
    else:
        raise WanConfigError(key, "write a pair as 'a-b' (both ways) or 'a>b' (one way)")
    a, b = _check_host(key, a.strip()), _check_host(key, b.strip())
    if a == b:
        raise WanConfigError(key, "a pair needs two different hosts")
    return ([(a, b)] if directed else [(a, b), (b, a)]), directed


def directed_pairs() -> list[DirectedPair]:
    """All twelve (source, destination) pairs, in a stable order."""
    return [(a, b) for a in HOSTS for b in HOSTS if a != b]


PairValues = Mapping[str, float] | Mapping[tuple[str, str], float] | None


def _expand(values: PairValues, what: str) -> dict[DirectedPair, float]:
    """Per-direction values from pair-keyed ones; directed keys applied last."""
    out: dict[DirectedPair, float] = {}
    later: dict[DirectedPair, float] = {}
    for spec, value in (values or {}).items():
        pairs, directed = parse_pair(spec)
        try:
            number = float(value)
        except (TypeError, ValueError):
            raise WanConfigError(f"{what}[{spec!r}]", f"not a number: {value!r}") from None
        for pair in pairs:
            (later if directed else out)[pair] = number
    out.update(later)
    return out


def build_links(
    delays_ms: PairValues = None,
    loss: PairValues = None,
    bandwidth_mbit: PairValues = None,
) -> dict[DirectedPair, LinkParams]:
    """Parameters for all twelve directed pairs: defaults overlaid with the given ones."""
    delays = _expand(DEFAULT_DELAYS_MS, "DEFAULT_DELAYS_MS")
    delays.update(_expand(delays_ms, "delays_ms"))
    losses = _expand(loss, "loss")
    rates = _expand(bandwidth_mbit, "bandwidth_mbit")
    links: dict[DirectedPair, LinkParams] = {}
    for pair in directed_pairs():
        name = pair_name(pair)
        try:
            links[pair] = LinkParams(
                delay_ms=delays[pair], loss=losses.get(pair, 0.0), bandwidth_mbit=rates.get(pair)
            )
        except WanConfigError as exc:
            raise WanConfigError(f"{name}.{exc.key}", str(exc).partition(": ")[2]) from None
    return links


class Keep(Enum):
    """Marker for "leave this link parameter as it is" (``None`` lifts a bandwidth limit)."""

    KEEP = "keep"


KEEP = Keep.KEEP


def update_link(
    current: LinkParams,
    *,
    delay_ms: float | Keep = KEEP,
    loss: float | Keep = KEEP,
    bandwidth_mbit: float | Keep | None = KEEP,
) -> LinkParams:
    """``current`` with the given fields changed; ``bandwidth_mbit=None`` lifts the limit."""
    changes: dict[str, float | None] = {}
    if delay_ms is not KEEP:
        changes["delay_ms"] = float(delay_ms)
    if loss is not KEEP:
        changes["loss"] = float(loss)
    if bandwidth_mbit is not KEEP:
        changes["bandwidth_mbit"] = None if bandwidth_mbit is None else float(bandwidth_mbit)
    return replace(current, **changes)  # type: ignore[arg-type]  # each value fits its field


def rtt_ms(links: Mapping[DirectedPair, LinkParams], a: str, b: str) -> float:
    """The configured round-trip floor between two hosts: both one-way delays added."""
    key = f"{a}-{b}"
    _check_host(key, a)
    _check_host(key, b)
    if a == b:
        return 0.0
    return links[(a, b)].delay_ms + links[(b, a)].delay_ms


def parse_assignment(text: str) -> tuple[str, float]:
    """``"user-edge=5"`` -> ``("user-edge", 5.0)``, for command lines."""
    spec, sep, value = text.partition("=")
    if not sep:
        raise WanConfigError(text, "expected PAIR=NUMBER, e.g. user-edge=5")
    parse_pair(spec.strip())
    try:
        return spec.strip(), float(value)
    except ValueError:
        raise WanConfigError(spec.strip(), f"not a number: {value!r}") from None
