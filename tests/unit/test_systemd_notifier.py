"""geoedge.systemd.ServiceNotifier's arithmetic and hand-over, without systemd:
the watchdog interval the daemons pet at, and who may speak for the service."""

from __future__ import annotations

import os

from geoedge.systemd import ServiceNotifier


def test_the_watchdog_is_petted_at_half_its_period() -> None:
    notifier = ServiceNotifier({"NOTIFY_SOCKET": "/run/x", "WATCHDOG_USEC": "2000000"})
    assert notifier.watchdog_s == 1.0  # WatchdogSec=2: a pet every second


def test_no_watchdog_when_it_is_off_or_meant_for_another_process() -> None:
    assert ServiceNotifier({"NOTIFY_SOCKET": "/run/x"}).watchdog_s is None
    assert ServiceNotifier({"NOTIFY_SOCKET": "/run/x", "WATCHDOG_USEC": "0"}).watchdog_s is None
    other = {"NOTIFY_SOCKET": "/run/x", "WATCHDOG_USEC": "2000000", "WATCHDOG_PID": "1"}
    assert os.getpid() != 1 and ServiceNotifier(other).watchdog_s is None
    mine = {**other, "WATCHDOG_PID": str(os.getpid())}
    assert ServiceNotifier(mine).watchdog_s == 1.0


def test_the_variables_are_taken_so_that_workers_cannot_speak_for_the_service() -> None:
    env = {"NOTIFY_SOCKET": "/run/x", "WATCHDOG_USEC": "2000000", "WATCHDOG_PID": "7", "X": "y"}
    assert ServiceNotifier(env).enabled
    assert env == {"X": "y"}
