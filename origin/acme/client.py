"""The ACME protocol itself, through certbot's ``acme`` package.

Why that library: it is the reference client's own protocol layer (JWS,
nonces and their retry, the resources of RFC 8555, ARI's renewal window),
kept by the EFF alongside certbot, with type hints; the alternatives on PyPI
are single-maintainer projects or wrap a shell script. It is synchronous
(``requests``): the manager runs each call in a thread
(``asyncio.to_thread``). ACME work happens a few times a month, never on a
request's path, so a thread per call costs nothing that matters.

Errors leave this module as two types: :class:`AcmeUnavailable` (the CA
could not be reached or failed: retry later) and :class:`AcmeRefused` (the
CA answered no: a problem document, a failed validation).
"""

from __future__ import annotations

import datetime
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, TypeVar

import requests
from acme import client, errors, messages
from josepy.jwa import ES256
from josepy.jwk import JWKEC

from geoedge.version import package_version

__all__ = ["AcmeClient", "AcmeError", "AcmeRefused", "AcmeUnavailable"]

T = TypeVar("T")


class AcmeError(Exception):
    """An ACME step failed; the message says which and why."""


class AcmeUnavailable(AcmeError):
    """The CA did not answer, or answered with a server error: try again later."""


class AcmeRefused(AcmeError):
    """The CA refused: a problem document, or a challenge it could not validate."""


@contextmanager
def _mapped(step: str) -> Iterator[None]:
    """One translation of the library's exceptions, at this boundary (STYLE.md §7)."""
    try:
        yield
    except requests.exceptions.RequestException as exc:
        raise AcmeUnavailable(f"{step}: the CA is unreachable ({type(exc).__name__})") from exc
    except messages.Error as exc:
        if exc.code in ("serverInternal", "rateLimited") or exc.typ.endswith(":serverInternal"):
            raise AcmeUnavailable(f"{step}: {exc}") from exc
        raise AcmeRefused(f"{step}: {exc}") from exc
    except errors.ValidationError as exc:
        raise AcmeRefused(f"{step}: {_validation_errors(exc)}") from exc
    except errors.TimeoutError as exc:
        raise AcmeUnavailable(f"{step}: the CA took too long") from exc
    except errors.Error as exc:
        raise AcmeRefused(f"{step}: {exc}") from exc


def _validation_errors(exc: errors.ValidationError) -> str:
    problems = []
    for authzr in exc.failed_authzrs:
        for challenge in authzr.body.challenges:
            if challenge.error is not None:
                problems.append(
                    f"{authzr.body.identifier.value} {challenge.chall.typ}: {challenge.error}"
                )
    return "; ".join(problems) or "validation failed"


class AcmeClient:
    """One account at one CA; every method blocks (run it in a thread)."""

    def __init__(
        self,
        directory_url: str,
        account_key: JWKEC,
        *,
        ca_bundle: str | None = None,
        timeout_s: float = 30.0,
    ) -> None:
        self.directory_url = directory_url
        self.account_key = account_key
        self._net = client.ClientNetwork(
            account_key,
            alg=ES256,
            # requests takes a CA bundle's path where a bool is typed.
            verify_ssl=ca_bundle if ca_bundle else True,  # type: ignore[arg-type]
            user_agent=f"geoedge/{package_version()} acme-python",
            timeout=int(timeout_s),
        )
        self._client: client.ClientV2 | None = None

    @property
    def acme(self) -> client.ClientV2:
        assert self._client is not None, "connect() first"
        return self._client

    def connect(self, contact: tuple[str, ...], agree_to_terms: bool) -> str:
        """Fetch the directory and find (or make) the account of this key; its URL."""
        with _mapped("directory"):
            directory = client.ClientV2.get_directory(self.directory_url, self._net)
            self._client = client.ClientV2(directory, self._net)
        registration = messages.NewRegistration.from_data(
            terms_of_service_agreed=agree_to_terms or None,
            contact=contact,
        )
        with _mapped("account"):
            try:
                account = self.acme.new_account(registration)
                url = account.uri
            except errors.ConflictError as exc:  # the key's account exists: that one
                url = exc.location
                self._net.account = messages.RegistrationResource(
                    body=messages.Registration(), uri=url
                )
        if not url:
            raise AcmeRefused("account: the CA gave no account URL")
        return url

    def call(self, step: str, function: Callable[..., T], *args: Any) -> T:
        """``function(*args)`` with the library's exceptions translated."""
        with _mapped(step):
            return function(*args)

    def new_order(self, csr_pem: bytes) -> messages.OrderResource:
        return self.call("new order", self.acme.new_order, csr_pem)

    def answer(self, challenge: messages.ChallengeBody, response: Any) -> None:
        self.call("answer challenge", self.acme.answer_challenge, challenge, response)

    def poll_authorizations(
        self, order: messages.OrderResource, deadline: datetime.datetime
    ) -> messages.OrderResource:
        return self.call("validation", self.acme.poll_authorizations, order, deadline)

    def finalize(
        self, order: messages.OrderResource, deadline: datetime.datetime
    ) -> messages.OrderResource:
        return self.call("finalize", self.acme.finalize_order, order, deadline)

    def renewal_window(self, chain_pem: str) -> tuple[datetime.datetime | None, datetime.datetime]:
        """ARI (RFC 9773): a time in the CA's suggested renewal window (None when
        the CA offers none) and when to ask again."""
        with _mapped("renewal info"):
            try:
                return self.acme.renewal_time(chain_pem.encode())
            except errors.ARIError as exc:
                raise AcmeUnavailable(f"renewal info: {exc}") from exc
