"""DNS-01 through Route 53 without AWS: botocore's own Stubber answers a real
boto3 client, and checks every request the provider makes against the
Route 53 API model (names, types, required parameters) and against the
exact parameters expected here: which zone, which record set, which values,
UPSERT or DELETE, and the wait for INSYNC."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import boto3
import pytest
from botocore.stub import Stubber

from origin.acme import route53
from origin.acme.config import DnsConfig
from origin.acme.dns import DnsError, challenge_name
from origin.acme.route53 import Route53Provider
from tests.conftest import run_async

NAME = challenge_name("*.example.com")  # _acme-challenge.example.com
ZONES = {
    "HostedZones": [
        {"Id": "/hostedzone/ZCOM", "Name": "com.", "CallerReference": "a"},
        {"Id": "/hostedzone/ZEXAMPLE", "Name": "example.com.", "CallerReference": "b"},
        {
            "Id": "/hostedzone/ZPRIVATE",
            "Name": "example.com.",
            "CallerReference": "c",
            "Config": {"PrivateZone": True},
        },
        {"Id": "/hostedzone/ZOTHER", "Name": "example.org.", "CallerReference": "d"},
    ],
    "Marker": "",
    "IsTruncated": False,
    "MaxItems": "100",
}


def route53_client() -> Any:
    return boto3.client(
        "route53",
        region_name="us-east-1",
        aws_access_key_id="AKIDEXAMPLE",
        aws_secret_access_key="not-a-secret",
    )


@pytest.fixture
def client() -> Iterator[tuple[Any, Stubber]]:
    client = route53_client()
    with Stubber(client) as stubber:
        yield client, stubber
        stubber.assert_no_pending_responses()


@pytest.fixture(autouse=True)
def quick_polls(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(route53, "POLL_INTERVAL_S", 0.01)


def change(
    stubber: Stubber, zone: str, action: str, values: list[str], statuses: tuple[str, ...]
) -> None:
    """The change of ``values`` at NAME, then one GetChange per status."""
    batch = {
        "Comment": "geoedge ACME dns-01",
        "Changes": [
            {
                "Action": action,
                "ResourceRecordSet": {
                    "Name": NAME + ".",
                    "Type": "TXT",
                    "TTL": 60,
                    "ResourceRecords": [{"Value": f'"{v}"'} for v in values],
                },
            }
        ],
    }
    info = {"Id": "/change/C1", "Status": "PENDING", "SubmittedAt": "2026-01-01T00:00:00Z"}
    stubber.add_response(
        "change_resource_record_sets",
        {"ChangeInfo": info},
        {"HostedZoneId": zone, "ChangeBatch": batch},
    )
    for status in statuses:
        stubber.add_response(
            "get_change", {"ChangeInfo": {**info, "Status": status}}, {"Id": "/change/C1"}
        )


def test_the_apex_and_the_wildcard_share_one_record_set_in_the_longest_public_zone(
    client: tuple[Any, Stubber],
) -> None:
    boto, stubber = client
    provider = Route53Provider(DnsConfig(), client=boto)
    # The wildcard's value: the zone found (example.com., not com., not the
    # private one), an UPSERT, polled until INSYNC.
    stubber.add_response("list_hosted_zones", ZONES, {})
    change(stubber, "ZEXAMPLE", "UPSERT", ["wild"], ("PENDING", "INSYNC"))
    # The apex's value beside it: the set holds both.
    stubber.add_response("list_hosted_zones", ZONES, {})
    change(stubber, "ZEXAMPLE", "UPSERT", ["wild", "apex"], ("INSYNC",))
    # One removed: the other stays; the last removed: the set deleted.
    stubber.add_response("list_hosted_zones", ZONES, {})
    change(stubber, "ZEXAMPLE", "UPSERT", ["apex"], ("INSYNC",))
    stubber.add_response("list_hosted_zones", ZONES, {})
    change(stubber, "ZEXAMPLE", "DELETE", ["apex"], ("INSYNC",))

    async def scenario() -> None:
        await provider.add_txt(NAME, "wild")
        await provider.add_txt(NAME, "apex")
        await provider.remove_txt(NAME, "wild")
        await provider.remove_txt(NAME, "never-added")  # not ours: nothing asked
        await provider.remove_txt(NAME, "apex")

    run_async(scenario(), 10)


def test_the_iam_policy_in_the_docs_allows_exactly_the_calls_made(
    client: tuple[Any, Stubber],
) -> None:
    """docs/acme.md's policy: every Route 53 action the provider calls, no other."""
    boto, stubber = client
    called: set[str] = set()
    boto.meta.events.register(
        "before-parameter-build.route53", lambda model, **_: called.add(f"route53:{model.name}")
    )
    provider = Route53Provider(DnsConfig(), client=boto)
    stubber.add_response("list_hosted_zones", ZONES, {})
    change(stubber, "ZEXAMPLE", "UPSERT", ["v"], ("PENDING", "INSYNC"))
    stubber.add_response("list_hosted_zones", ZONES, {})
    change(stubber, "ZEXAMPLE", "DELETE", ["v"], ("INSYNC",))

    async def scenario() -> None:
        await provider.add_txt(NAME, "v")
        await provider.remove_txt(NAME, "v")

    run_async(scenario(), 10)
    docs = (Path(__file__).resolve().parents[2] / "docs" / "acme.md").read_text()
    [policy] = [json.loads(b) for b in re.findall(r"```json\n(.*?)```", docs, re.S)]
    allowed = {s["Action"] for s in policy["Statement"]}
    assert (
        called
        == allowed
        == {
            "route53:ChangeResourceRecordSets",
            "route53:GetChange",
            "route53:ListHostedZones",
        }
    )


def test_a_configured_zone_is_used_as_given(client: tuple[Any, Stubber]) -> None:
    boto, stubber = client
    provider = Route53Provider(DnsConfig(route53_hosted_zone_id="ZGIVEN", ttl_s=60), client=boto)
    change(stubber, "ZGIVEN", "UPSERT", ["v"], ("INSYNC",))
    run_async(provider.add_txt(NAME, "v"), 10)


def test_a_refusal_by_route53_is_a_dns_error(client: tuple[Any, Stubber]) -> None:
    boto, stubber = client
    provider = Route53Provider(
        DnsConfig(route53_hosted_zone_id="ZGIVEN", propagation_timeout_s=0.05), client=boto
    )
    stubber.add_client_error(
        "change_resource_record_sets",
        service_error_code="AccessDenied",
        service_message="not authorized to perform: route53:ChangeResourceRecordSets",
        http_status_code=403,
    )
    with pytest.raises(DnsError, match=r"Route 53 UPSERT .*AccessDenied"):
        run_async(provider.add_txt(NAME, "denied"), 10)


def test_a_change_that_does_not_get_in_sync_in_time_is_a_dns_error() -> None:
    boto = route53_client()
    provider = Route53Provider(
        DnsConfig(route53_hosted_zone_id="ZGIVEN", propagation_timeout_s=0.05), client=boto
    )
    with Stubber(boto) as stubber:  # more PENDING answers than polls: the rest stay unused
        change(stubber, "ZGIVEN", "UPSERT", ["slow"], ("PENDING",) * 1000)
        with pytest.raises(DnsError, match="not in sync in time"):
            run_async(provider.add_txt(NAME, "slow"), 10)


def test_a_name_no_public_zone_holds_is_refused(client: tuple[Any, Stubber]) -> None:
    boto, stubber = client
    provider = Route53Provider(DnsConfig(), client=boto)
    stubber.add_response("list_hosted_zones", ZONES, {})
    with pytest.raises(DnsError, match="no public Route 53 hosted zone holds _acme-challenge"):
        run_async(provider.add_txt("_acme-challenge.example.net", "v"), 10)
