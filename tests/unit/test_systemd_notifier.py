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

    def watchdog_for(pid: int) -> dict[str, str]:  # a fresh one each time: the notifier takes it
        return {"NOTIFY_SOCKET": "/run/x", "WATCHDOG_USEC": "2000000", "WATCHDOG_PID": str(pid)}

    assert os.getpid() != 1 and ServiceNotifier(watchdog_for(1)).watchdog_s is None
    assert ServiceNotifier(watchdog_for(os.getpid())).watchdog_s == 1.0


def test_the_variables_are_taken_so_that_workers_cannot_speak_for_the_service() -> None:
    env = {"NOTIFY_SOCKET": "/run/x", "WATCHDOG_USEC": "2000000", "WATCHDOG_PID": "7", "X": "y"}
    assert ServiceNotifier(env).enabled
    assert env == {"X": "y"}
