"""Compression at the edge: which coding a client gets, whether a response may
be compressed, and the encoders (zstd, brotli, gzip).

- :func:`negotiate` (RFC 9110 §12.5.3): the coding with the client's highest
  q-value among those configured, ties broken by the edge's order; ``*``
  stands for every coding the client did not name; none: identity.
- :func:`compressible`: a 200 whose type is listed, not encoded already
  (``Content-Encoding`` other than identity), without ``no-transform``
  (RFC 9111 §5.2.2.6), not shorter than ``min_bytes`` when its length is
  known, and neither ``private`` nor setting a cookie: compressing secrets
  beside attacker-chosen text in one response is what BREACH reads.
- :class:`Encoder`: one streaming compressor; :func:`compress_whole` for a
  stored body, compressed once and kept (:mod:`edge.cache.entry`).

The bindings are the well-kept ones (``zstandard``, ``brotli``, the stdlib's
``zlib``); the levels are configuration, chosen by CPU per MB measured with
``loadtests/compression_levels.py`` (docs/cache.md has the table).
"""

from __future__ import annotations

import zlib
from collections.abc import Callable, Sequence

import brotli
import zstandard

from edge.cache.config import CompressionConfig
from edge.cache.directives import field_values, parse_directives, split_list

__all__ = ["Encoder", "compress_whole", "compressible", "encoded_fields", "negotiate", "weak_etag"]

Fields = Sequence[tuple[bytes, bytes]]


def negotiate(fields: Fields, encodings: Sequence[str]) -> str | None:
    """The coding to send a client whose request has ``fields``, or None (identity)."""
    values = field_values(fields, b"accept-encoding")
    if not values or not encodings:
        return None
    weights: dict[str, float] = {}
    star: float | None = None
    for member in split_list(values):
        coding, _, params = member.partition(b";")
        q = 1.0
        for param in params.split(b";"):
            pname, _, value = param.strip().partition(b"=")
            if pname == b"q":
                try:
                    q = float(value)
                except ValueError:
                    q = 0.0
        token = coding.strip().decode("latin-1")
        if token == "*":
            star = q
        else:
            weights.setdefault(token, q)
    best, best_q = None, 0.0
    for offered in encodings:
        q = weights.get(offered, star if star is not None else 0.0)
        if q > best_q:
            best, best_q = offered, q
    return best


def _type_listed(content_type: bytes, types: Sequence[str]) -> bool:
    media = content_type.split(b";", 1)[0].strip().lower().decode("latin-1")
    if media.endswith(("+json", "+xml")):
        return True
    major = media.split("/", 1)[0]
    return any(media == t or (t.endswith("/*") and major == t[:-2]) for t in types)


def compressible(status: int, fields: Fields, config: CompressionConfig) -> bool:
    """May the edge compress this response (see the module docstring)?"""
    if status != 200:
        return False
    content_type = b""
    length = None
    control = []
    for name, value in fields:
        if name == b"content-encoding":
            if value.strip().lower() not in (b"", b"identity"):
                return False
        elif name == b"content-type":
            content_type = value
        elif name == b"content-length":
            length = value
        elif name == b"cache-control":
            control.append(value)
        elif name in (b"set-cookie", b"set-cookie2", b"content-range"):
            return False
    if not content_type or not _type_listed(content_type, config.types):
        return False
    directives = parse_directives(control)
    if b"no-transform" in directives or b"private" in directives:
        return False
    return not (length is not None and length.strip().isdigit() and int(length) < config.min_bytes)


def weak_etag(value: bytes) -> bytes:
    """A strong entity tag made weak (a compressed body is not the same octets)."""
    value = value.strip()
    return value if value[:2] == b"W/" else b"W/" + value


def encoded_fields(fields: Fields, coding: str) -> list[tuple[bytes, bytes]]:
    """A response's fields once its body is compressed with ``coding``: its
    length and digest dropped (they were the identity body's), its ``ETag``
    weak, ``Content-Encoding`` added."""
    out = [
        (name, weak_etag(value) if name == b"etag" else value)
        for name, value in fields
        if name not in (b"content-length", b"content-md5")
    ]
    out.append((b"content-encoding", coding.encode("ascii")))
    return out


class Encoder:
    """One streaming compressor of a coding."""

    __slots__ = ("_finish", "_write", "coding")

    _write: Callable[[bytes], bytes]
    _finish: Callable[[], bytes]

    def __init__(self, coding: str, config: CompressionConfig) -> None:
        self.coding = coding
        if coding == "zstd":
            zobj = zstandard.ZstdCompressor(level=config.zstd_level).compressobj()
            self._write, self._finish = zobj.compress, zobj.flush
        elif coding == "br":
            bobj = brotli.Compressor(quality=config.brotli_level)
            self._write, self._finish = bobj.process, bobj.finish
        elif coding == "gzip":
            gobj = zlib.compressobj(config.gzip_level, zlib.DEFLATED, 31)
            self._write, self._finish = gobj.compress, gobj.flush
        else:
            raise ValueError(f"unknown coding {coding!r}")

    def write(self, data: bytes) -> bytes:
        return self._write(data)

    def finish(self) -> bytes:
        return self._finish()


def compress_whole(coding: str, data: bytes, config: CompressionConfig) -> bytes:
    encoder = Encoder(coding, config)
    return encoder.write(data) + encoder.finish()
