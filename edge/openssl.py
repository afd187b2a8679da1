"""The few OpenSSL calls Python's ``ssl`` module lacks, made through ctypes on
the very ``libssl`` that ``_ssl`` is linked with.

What for (each is a one-call feature of OpenSSL that Python 3.11 does not expose):

- :func:`set_groups`: the key-exchange groups a server offers
  (``SSL_CTX_set1_groups_list``). ``SSLContext.set_ecdh_curve`` sets exactly
  one curve and cannot name X25519, while Mozilla's "intermediate" profile
  wants X25519, P-256 and P-384 and nothing else (OpenSSL's default list adds
  X448 and P-521).
- :class:`StatusCallback`: OCSP stapling (``SSL_CTX_set_tlsext_status_cb``,
  ``SSL_set_tlsext_status_ocsp_resp``): Python has no status callback.
- :class:`ClientHelloAlpn`: whether a client offered one ALPN protocol,
  known before the SNI callback runs (``SSL_CTX_set_client_hello_cb``,
  ``SSL_client_hello_get0_ext``): TLS-ALPN-01 (RFC 8737) must answer a
  client offering ``acme-tls/1`` with another certificate, and Python's SNI
  callback does not see the client's ALPN list.
- :func:`mark_shut_down`: what nginx does before freeing a connection that
  ends without a close_notify exchange (``SSL_set_quiet_shutdown``,
  ``SSL_set_shutdown``). OpenSSL evicts the session of a connection freed
  without one from its session-ID cache, so a client that resets its
  connections (or that the edge aborts) could never resume TLS 1.2.

Why ctypes and not something else: the alternatives are an ``OPENSSL_CONF``
file (process-wide, so the tunnel's own contexts would change too, and it
must be in the environment before ``ssl`` is imported), pyOpenSSL (a second
TLS stack: the edge's transport drives Python's ``ssl`` objects) or a C
extension (a compiler on every host). ctypes adds no dependency and touches
only the contexts and connections it is handed.

How the pointers are found, and why that is safe: CPython's ``_ssl`` objects
(``Modules/_ssl.c``, 3.11 to 3.13) start with the object header followed by
``SSL_CTX *ctx`` (``PySSLContext``) or by ``PyObject *Socket; SSL *ssl``
(``PySSLSocket``). Before the first use, :func:`bindings` checks that layout
against OpenSSL itself on scratch objects: ``SSL_CTX_get_options`` of the
pointer read from a context must equal ``context.options`` (twice, with
different options), and ``SSL_get_SSL_CTX`` of the pointer read from a
connection must be its context's pointer. On another interpreter or layout,
:class:`OpenSslUnavailable` says why, and the features above fail with that
reason at start-up (or, for :func:`mark_shut_down`, quietly do nothing).
"""

from __future__ import annotations

import ctypes
import functools
import logging
import ssl
import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

log = logging.getLogger("geoedge.edge.tls")

__all__ = [
    "ClientHelloAlpn",
    "OpenSslUnavailable",
    "StatusCallback",
    "bindings",
    "context_pointer",
    "mark_shut_down",
    "set_groups",
]

# OpenSSL 3 ABI constants (include/openssl/ssl.h, tls1.h).
_SSL_CTRL_SET_TLSEXT_STATUS_REQ_CB = 63
_SSL_CTRL_SET_TLSEXT_STATUS_REQ_OCSP_RESP = 71
_SSL_CTRL_SET_GROUPS_LIST = 92
_SSL_SENT_SHUTDOWN = 1
_SSL_RECEIVED_SHUTDOWN = 2
SSL_TLSEXT_ERR_OK = 0
SSL_TLSEXT_ERR_NOACK = 3

#: CPython versions whose ``_ssl`` object layout is the one described above.
_KNOWN_PYTHONS = ((3, 11), (3, 12), (3, 13))
_HEADER_BYTES = object.__basicsize__  # PyObject_HEAD (more under Py_TRACE_REFS)
_POINTER_BYTES = ctypes.sizeof(ctypes.c_void_p)

_StatusCb = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p)
_ClientHelloCb = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p)
_TLSEXT_TYPE_ALPN = 16
_SSL_CLIENT_HELLO_SUCCESS = 1


class OpenSslUnavailable(Exception):
    """This interpreter's ``ssl`` cannot be reached through ctypes; the message says why."""


@dataclass(frozen=True, slots=True)
class _Bindings:
    lib: ctypes.CDLL


def _declare(lib: ctypes.CDLL) -> None:
    vp, c_int, c_long = ctypes.c_void_p, ctypes.c_int, ctypes.c_long
    signatures: dict[str, tuple[Any, list[Any]]] = {
        "SSL_CTX_get_options": (ctypes.c_uint64, [vp]),
        "SSL_CTX_ctrl": (c_long, [vp, c_int, c_long, vp]),
        "SSL_CTX_callback_ctrl": (c_long, [vp, c_int, vp]),
        "SSL_get_SSL_CTX": (vp, [vp]),
        "SSL_ctrl": (c_long, [vp, c_int, c_long, vp]),
        "SSL_set_quiet_shutdown": (None, [vp, c_int]),
        "SSL_set_shutdown": (None, [vp, c_int]),
        "SSL_get_certificate": (vp, [vp]),
        "i2d_X509": (c_int, [vp, vp]),
        "CRYPTO_malloc": (vp, [ctypes.c_size_t, ctypes.c_char_p, c_int]),
        "SSL_CTX_set_client_hello_cb": (None, [vp, vp, vp]),
        "SSL_client_hello_get0_ext": (
            c_int,
            [vp, ctypes.c_uint, ctypes.POINTER(vp), ctypes.POINTER(ctypes.c_size_t)],
        ),
        "SSL_get_ex_data": (vp, [vp, c_int]),
    }
    for name, (restype, argtypes) in signatures.items():
        function = getattr(lib, name)  # AttributeError: not this OpenSSL
        function.restype = restype
        function.argtypes = argtypes


@functools.cache
def bindings() -> _Bindings:
    """The checked bindings (once per process); :class:`OpenSslUnavailable` if
    the layout or the library is not the expected one."""
    if sys.implementation.name != "cpython" or sys.version_info[:2] not in _KNOWN_PYTHONS:
        raise OpenSslUnavailable(
            f"{sys.implementation.name} {sys.version_info[0]}.{sys.version_info[1]}: "
            "the ssl module's object layout is known for CPython 3.11-3.13 only"
        )
    if ssl.OPENSSL_VERSION_INFO[0] < 3:
        raise OpenSslUnavailable(f"{ssl.OPENSSL_VERSION}: OpenSSL 3 is needed")
    import _ssl

    try:
        # The extension's own handle: symbols resolve in the libssl it was linked with.
        lib = ctypes.CDLL(getattr(_ssl, "__file__", None))
        _declare(lib)
    except (OSError, AttributeError) as exc:
        raise OpenSslUnavailable(f"cannot reach libssl through _ssl: {exc}") from exc
    probe = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    pointer = _read_pointer(probe, 0)
    for extra in (0, ssl.OP_NO_TICKET):
        probe.options |= extra
        if lib.SSL_CTX_get_options(pointer) != int(probe.options):
            raise OpenSslUnavailable("the ssl module's SSLContext layout is not the expected one")
    connection = probe._wrap_bio(ssl.MemoryBIO(), ssl.MemoryBIO(), True, None)  # type: ignore[attr-defined]
    if lib.SSL_get_SSL_CTX(_read_pointer(connection, 1)) != pointer:
        raise OpenSslUnavailable("the ssl module's SSL object layout is not the expected one")
    return _Bindings(lib)


@functools.cache
def _bindings_if_available() -> ctypes.CDLL | None:
    """The library, or None (once: a failed check is not repeated per call)."""
    try:
        return bindings().lib
    except OpenSslUnavailable as exc:
        log.warning("TLS sessions of aborted connections are not kept: %s", exc)
        return None


def _read_pointer(obj: object, index: int) -> int:
    """The ``index``-th pointer after the object header of a C-level ``_ssl`` object."""
    address = id(obj) + _HEADER_BYTES + index * _POINTER_BYTES
    return ctypes.c_void_p.from_address(address).value or 0


def context_pointer(context: ssl.SSLContext) -> int:
    """The ``SSL_CTX *`` behind ``context``."""
    bindings()
    return _read_pointer(context, 0)


def _connection_pointer(connection: object) -> int:
    """The ``SSL *`` behind a C-level ``_ssl._SSLSocket`` (``SSLContext._wrap_socket``)."""
    return _read_pointer(connection, 1)


# -- key-exchange groups -------------------------------------------------------------


def set_groups(context: ssl.SSLContext, groups: tuple[str, ...]) -> None:
    """Offer exactly ``groups`` (OpenSSL names: ``X25519``, ``P-256``...), in
    that order of preference. ``ValueError`` names a group OpenSSL does not know."""
    lib = bindings().lib
    pointer = context_pointer(context)
    if lib.SSL_CTX_ctrl(pointer, _SSL_CTRL_SET_GROUPS_LIST, 0, ":".join(groups).encode()) == 1:
        return
    scratch = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)  # referenced: its SSL_CTX must live
    scratch_pointer = context_pointer(scratch)
    unknown = [
        g
        for g in groups
        if lib.SSL_CTX_ctrl(scratch_pointer, _SSL_CTRL_SET_GROUPS_LIST, 0, g.encode()) != 1
    ]
    raise ValueError(
        f"OpenSSL ({ssl.OPENSSL_VERSION}) does not offer the group(s) "
        f"{', '.join(map(repr, unknown or groups))}"
    )


# -- closing without close_notify ---------------------------------------------------------


def mark_shut_down(connection: object) -> None:
    """Mark a handshaken connection as shut down without sending anything, so
    that freeing it keeps its session resumable (nginx's ``ngx_ssl_shutdown``
    on an error). No-op when the bindings are unavailable."""
    lib = _bindings_if_available()
    if lib is None:
        return
    pointer = _connection_pointer(connection)
    if pointer:
        lib.SSL_set_quiet_shutdown(pointer, 1)
        lib.SSL_set_shutdown(pointer, _SSL_SENT_SHUTDOWN | _SSL_RECEIVED_SHUTDOWN)


# -- OCSP stapling ---------------------------------------------------------------------


class StatusCallback:
    """The OCSP status callback of server contexts: for a client that asks
    (``status_request``), staples ``lookup(certificate_der)`` for the
    certificate OpenSSL chose for this handshake, if it returns one.

    Runs inside ``SSL_do_handshake`` (ctypes takes the GIL); it never raises
    into OpenSSL: a failure is logged and the handshake goes on without a
    staple. Certificate DER is cached per ``X509 *``; :meth:`forget_certificates`
    must be called whenever certificates are reloaded (a freed ``X509``'s
    address may be reused)."""

    def __init__(self, lookup: Callable[[bytes], bytes | None]) -> None:
        self._lib = bindings().lib
        self._lookup = lookup
        self._der_by_x509: dict[int, bytes] = {}
        self._c_callback = _StatusCb(self._on_status_request)  # kept alive by self

    def install(self, context: ssl.SSLContext) -> None:
        pointer = context_pointer(context)
        callback = ctypes.cast(self._c_callback, ctypes.c_void_p)
        if (
            self._lib.SSL_CTX_callback_ctrl(pointer, _SSL_CTRL_SET_TLSEXT_STATUS_REQ_CB, callback)
            != 1
        ):
            raise OpenSslUnavailable("SSL_CTX_set_tlsext_status_cb failed")

    def forget_certificates(self) -> None:
        self._der_by_x509.clear()

    def _certificate_der(self, x509: int) -> bytes:
        der = self._der_by_x509.get(x509)
        if der is None:
            lib = self._lib
            size = lib.i2d_X509(x509, None)
            if size <= 0:
                return b""
            buffer = ctypes.create_string_buffer(size)
            cursor = ctypes.c_void_p(ctypes.addressof(buffer))
            lib.i2d_X509(x509, ctypes.byref(cursor))
            der = self._der_by_x509[x509] = buffer.raw
        return der

    def _on_status_request(self, ssl_pointer: int, _arg: int) -> int:
        try:
            lib = self._lib
            x509 = lib.SSL_get_certificate(ssl_pointer)
            if not x509:
                return SSL_TLSEXT_ERR_NOACK
            response = self._lookup(self._certificate_der(x509))
            if not response:
                return SSL_TLSEXT_ERR_NOACK
            # OpenSSL takes ownership of the buffer and frees it with the connection.
            buffer = lib.CRYPTO_malloc(len(response), b"geoedge-ocsp", 0)
            if not buffer:
                return SSL_TLSEXT_ERR_NOACK
            ctypes.memmove(buffer, response, len(response))
            lib.SSL_ctrl(
                ssl_pointer, _SSL_CTRL_SET_TLSEXT_STATUS_REQ_OCSP_RESP, len(response), buffer
            )
            return SSL_TLSEXT_ERR_OK
        except Exception:
            log.exception("OCSP stapling failed; handshake continues without a staple")
            return SSL_TLSEXT_ERR_NOACK


# -- the ALPN protocols a client offers, before the SNI callback --------------------------


def offers_protocol(extension: bytes, protocol: bytes) -> bool:
    """Whether an ALPN extension's body (RFC 7301 §3.1: a 2-octet length, then
    1-octet-length protocol names) lists ``protocol``. Malformed: False."""
    if len(extension) < 2 or int.from_bytes(extension[:2], "big") != len(extension) - 2:
        return False
    at = 2
    while at < len(extension):
        size = extension[at]
        name = extension[at + 1 : at + 1 + size]
        if size == 0 or len(name) != size:
            return False
        if name == protocol:
            return True
        at += 1 + size
    return False


class ClientHelloAlpn:
    """A client-hello callback that marks connections whose client offers
    ``protocol`` by ALPN: ``geoedge_acme_tls = True`` on the connection's
    owner (the :class:`edge.tls_transport.TlsServerTransport`, or the
    ``SSLObject``), which is also what Python's SNI callback is handed.

    The owner is found through the ``SSL``'s app data, where ``_ssl`` keeps
    its ``_SSLSocket`` (``SSL_set_app_data``, ``Modules/_ssl.c``), whose
    ``owner`` is the Python object. The callback runs inside
    ``SSL_do_handshake`` (ctypes takes the GIL) and never fails a handshake:
    an error is logged and the connection is simply not marked."""

    def __init__(self, protocol: str) -> None:
        self._lib = bindings().lib
        self._protocol = protocol.encode()
        self._c_callback = _ClientHelloCb(self._on_client_hello)  # kept alive by self

    def install(self, context: ssl.SSLContext) -> None:
        callback = ctypes.cast(self._c_callback, ctypes.c_void_p)
        self._lib.SSL_CTX_set_client_hello_cb(context_pointer(context), callback, None)

    def uninstall(self, context: ssl.SSLContext) -> None:
        self._lib.SSL_CTX_set_client_hello_cb(context_pointer(context), None, None)

    def _on_client_hello(self, ssl_pointer: int, _alert: int, _arg: int) -> int:
        try:
            lib = self._lib
            data, size = ctypes.c_void_p(), ctypes.c_size_t()
            found = lib.SSL_client_hello_get0_ext(
                ssl_pointer, _TLSEXT_TYPE_ALPN, ctypes.byref(data), ctypes.byref(size)
            )
            if found != 1 or not data.value:
                return _SSL_CLIENT_HELLO_SUCCESS
            extension = ctypes.string_at(data.value, size.value)
            if not offers_protocol(extension, self._protocol):
                return _SSL_CLIENT_HELLO_SUCCESS
            app_data = lib.SSL_get_ex_data(ssl_pointer, 0)
            if app_data:
                connection = ctypes.cast(app_data, ctypes.py_object).value
                connection.owner.geoedge_acme_tls = True
        except Exception:
            log.exception("client hello inspection failed; the handshake goes on unmarked")
        return _SSL_CLIENT_HELLO_SUCCESS
