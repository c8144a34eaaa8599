"""`monitoring`: Managed Prometheus, the dashboard and the alert policies (infra/monitoring.py builds them)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from infra.settings.constants import DEFAULT_RUNG, MAX_MOVES_PER_HOUR
from infra.settings.formats import NOTIFICATION_CHANNEL, duration_seconds
from infra.settings.keys import DEFAULTS
from infra.settings.reader import ConfigReader, read_bounded_duration, read_per_rung_durations

_ALERTS: Mapping = DEFAULTS["monitoring"]["alerts"]


@dataclass(frozen=True)
class AlertSettings:
    """Cloud Monitoring alert policies over the scraped metrics (infra/monitoring.py): how long a job may wait on
    a rung, how many moves down the ladder per hour are too many, how little of their time a namespace's jobs may
    run over a window (scheduling goodput), and where notifications go (none: the policies
    open incidents in the console only). The defaults are the table's (infra/settings/keys.py)."""

    enabled: bool = _ALERTS["enabled"]
    # (rung config key or DEFAULT_RUNG, seconds): the longest a rung's jobs may wait before an alert
    pending_too_long: tuple[tuple[str, int], ...] = tuple(
        (rung, duration_seconds(wait)) for rung, wait in _ALERTS["pendingTooLong"].items())
    moves_per_hour: int = _ALERTS["movesPerHour"]
    # projects/<project>/notificationChannels/<id>
    notification_channels: tuple[str, ...] = tuple(_ALERTS["notificationChannels"])
    # The jobs of a namespace ran less than this share of their time (percent; 0: no alert) over the window
    goodput_below_percent: int = _ALERTS["goodputBelow"]["percent"]
    goodput_window_seconds: int = duration_seconds(_ALERTS["goodputBelow"]["window"])

    def pending_seconds(self, rung: str) -> int:
        """The wait that alerts on this rung (its config key): its own, or the default."""
        waits = dict(self.pending_too_long)
        return waits.get(rung, waits[DEFAULT_RUNG])


@dataclass(frozen=True)
class MonitoringSettings:
    """Managed Prometheus on the cluster, PodMonitorings for Kueue and the failover controller, a Cloud
    Monitoring dashboard and alert policies (infra/monitoring.py); a team that has its own can turn them off."""

    enabled: bool = DEFAULTS["monitoring"]["enabled"]
    alerts: AlertSettings = AlertSettings()


def read_monitoring_settings(reader: ConfigReader) -> MonitoringSettings:
    """`monitoring`, with its `alerts` object merged field by field over the defaults."""
    raw = reader.obj("monitoring", DEFAULTS["monitoring"])
    alerts = reader.fields("monitoring.alerts", raw["alerts"], _ALERTS)
    goodput = reader.fields("monitoring.alerts.goodputBelow", alerts["goodputBelow"], _ALERTS["goodputBelow"])
    return MonitoringSettings(raw["enabled"], AlertSettings(
        alerts["enabled"], _read_pending_too_long(reader, alerts["pendingTooLong"]),
        _read_moves_per_hour(reader, alerts["movesPerHour"]),
        _read_notification_channels(reader, alerts["notificationChannels"]),
        _read_goodput_percent(reader, goodput["percent"]), _read_goodput_window(reader, goodput["window"])))


def _read_pending_too_long(reader: ConfigReader, given: dict) -> tuple[tuple[str, int], ...]:
    return read_per_rung_durations(reader, "monitoring.alerts.pendingTooLong", given, _ALERTS["pendingTooLong"])


def _read_moves_per_hour(reader: ConfigReader, value: int) -> int:
    reader.check("monitoring.alerts.movesPerHour", 0 <= value <= MAX_MOVES_PER_HOUR,
                 f"{value} is out of range; moves per hour from one rung above which the alert fires, 0 (any "
                 f"move) to {MAX_MOVES_PER_HOUR}")
    return value


def _read_goodput_percent(reader: ConfigReader, value: int) -> int:
    reader.check("monitoring.alerts.goodputBelow.percent", 0 <= value <= 100,
                 f"{value} is out of range; the share of their time a namespace's jobs must run, 0 (no alert) to 100")
    return value


def _read_goodput_window(reader: ConfigReader, value: str) -> int:
    seconds = read_bounded_duration(reader, "monitoring.alerts.goodputBelow.window", value)
    return AlertSettings.goodput_window_seconds if seconds is None else seconds


def _read_notification_channels(reader: ConfigReader, channels: list) -> tuple[str, ...]:
    name = "monitoring.alerts.notificationChannels"
    for index, channel in enumerate(channels):
        reader.check(f"{name}[{index}]", isinstance(channel, str) and bool(NOTIFICATION_CHANNEL.match(channel)),
                     f"{channel!r} is not a notification channel's name, "
                     "projects/<project>/notificationChannels/<id> (gcloud beta monitoring channels list)")
    reader.check(name, len(set(map(str, channels))) == len(channels), "a channel is listed twice")
    return tuple(channels)
