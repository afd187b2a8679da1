"""DNS-01 through AWS Route 53, with boto3 (the AWS SDK; credentials from the
instance's IAM role, as the SDK finds them).

The requests are built by pure functions (:func:`change_batch`,
:func:`zone_for`), tested without AWS against botocore's model of the
Route 53 API; the calls run in a thread (boto3 blocks). A TXT record set
holds every value this provider added at that name (UPSERT of the whole
set), so the apex and wildcard challenges of one name can be pending at
once; the last value removed deletes the set.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterable, Mapping
from typing import Any

from origin.acme.config import DnsConfig
from origin.acme.dns import DnsError

__all__ = ["Route53Provider", "change_batch", "zone_for"]

#: How often a change's status is asked for while it propagates.
POLL_INTERVAL_S = 2.0


def change_batch(action: str, name: str, values: Iterable[str], ttl_s: int) -> dict[str, Any]:
    """The ``ChangeBatch`` of ``ChangeResourceRecordSets`` for TXT ``values`` at ``name``
    (each value quoted, as TXT record data is)."""
    return {
        "Comment": "geoedge ACME dns-01",
        "Changes": [
            {
                "Action": action,
                "ResourceRecordSet": {
                    "Name": name.rstrip(".") + ".",
                    "Type": "TXT",
                    "TTL": ttl_s,
                    "ResourceRecords": [{"Value": f'"{value}"'} for value in values],
                },
            }
        ],
    }


def zone_for(name: str, zones: Iterable[Mapping[str, Any]]) -> str:
    """The id of the public hosted zone that holds ``name``: the longest
    matching zone name (``ListHostedZonesByName``' ``HostedZones``)."""
    fqdn = name.rstrip(".") + "."
    best: tuple[int, str] | None = None
    for zone in zones:
        zone_name = str(zone["Name"])
        private = bool(zone.get("Config", {}).get("PrivateZone", False))
        if private or not (fqdn == zone_name or fqdn.endswith("." + zone_name)):
            continue
        if best is None or len(zone_name) > best[0]:
            best = (len(zone_name), str(zone["Id"]).rsplit("/", 1)[-1])
    if best is None:
        raise DnsError(f"no public Route 53 hosted zone holds {name}")
    return best[1]


class Route53Provider:
    def __init__(self, config: DnsConfig, client: Any = None) -> None:
        self._config = config
        self._client = client
        self._values: dict[str, list[str]] = {}

    def _route53(self) -> Any:
        if self._client is None:
            try:
                import boto3
            except ImportError:
                raise DnsError(
                    "[acme.dns] provider route53 needs boto3: pip install 'geoedge[aws]'"
                ) from None
            self._client = boto3.client("route53")
        return self._client

    def _zone(self, name: str) -> str:
        if self._config.route53_hosted_zone_id:
            return self._config.route53_hosted_zone_id
        client = self._route53()
        zones = []
        for page in client.get_paginator("list_hosted_zones").paginate():
            zones.extend(page["HostedZones"])
        return zone_for(name, zones)

    def _change(self, name: str, values: list[str], action: str) -> None:
        client = self._route53()
        try:
            change = client.change_resource_record_sets(
                HostedZoneId=self._zone(name),
                ChangeBatch=change_batch(action, name, values, self._config.ttl_s),
            )
            change_id = change["ChangeInfo"]["Id"]
            deadline = time.monotonic() + self._config.propagation_timeout_s
            while client.get_change(Id=change_id)["ChangeInfo"]["Status"] != "INSYNC":
                if time.monotonic() > deadline:
                    raise DnsError(f"Route 53 change for {name} not in sync in time")
                time.sleep(POLL_INTERVAL_S)
        except DnsError:
            raise
        except Exception as exc:  # botocore's errors: one type at this boundary
            raise DnsError(f"Route 53 {action} {name}: {exc}") from exc

    async def add_txt(self, name: str, value: str) -> None:
        values = self._values.setdefault(name, [])
        values.append(value)
        await asyncio.to_thread(self._change, name, list(values), "UPSERT")

    async def remove_txt(self, name: str, value: str) -> None:
        values = self._values.get(name, [])
        if value not in values:
            return
        remaining = [v for v in values if v != value]
        if remaining:
            await asyncio.to_thread(self._change, name, remaining, "UPSERT")
            self._values[name] = remaining
        else:
            await asyncio.to_thread(self._change, name, values, "DELETE")
            self._values.pop(name, None)
