"""The members of a fleet, as a manager's programs reach them (the fleet watch, the ladder's early path): a client
per member from the kubeconfig Secrets MultiKueue reads, and per member a cache of what the program watches there."""

from __future__ import annotations

import base64
import logging
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

import yaml
from kubernetes import client, config
from kubernetes.client.rest import ApiException

from failover.runtime.cache import Cache, Change, Indexer, Store, Transform
from failover.runtime.informer import Watched

log = logging.getLogger("tpu-fallback.fleet")


def member_clients(core: client.CoreV1Api, secrets: Mapping[str, str],
                   namespace: str) -> Callable[[], dict[str, client.ApiClient | None]]:
    """A client per member from the kubeconfig Secrets MultiKueue reads (key `kubeconfig`), re-read each pass
    so a rotated token is picked up; None for a member whose Secret cannot be read."""
    built: dict[str, tuple[str, client.ApiClient]] = {}  # member -> (kubeconfig text, its client)

    def load() -> dict[str, client.ApiClient | None]:
        clients: dict[str, client.ApiClient | None] = {}
        for member, secret in secrets.items():
            try:
                data = core.read_namespaced_secret(secret, namespace).data or {}
                text = base64.b64decode(data["kubeconfig"]).decode()
                if member not in built or built[member][0] != text:  # a client per kubeconfig, not per pass
                    configuration = client.Configuration()
                    config.load_kube_config_from_dict(yaml.safe_load(text), client_configuration=configuration)
                    configuration.retries = 0  # a member that does not answer is unreachable for this pass
                    built[member] = (text, client.ApiClient(configuration))
                clients[member] = built[member][1]
            except (ApiException, KeyError, ValueError, config.ConfigException) as error:
                log.warning("member %s: no usable kubeconfig in %s/%s: %s", member, namespace, secret, error)
                clients[member] = None
        return clients
    return load


class Member:
    """One member of a fleet as a program sees it: its client (None: no usable kubeconfig), one cache of what the
    program watches there (a new one for a new client; a stopped one tells nothing more), and, for the fleet watch
    that asks (failover/watch/), whether it answers."""

    def __init__(self, name: str):
        self.name = name
        self.api: client.ApiClient | None = None
        self.cache: Cache | None = None
        self.answers = False  # it answers (the fleet watch's probe: `still_answers`)
        self.missed = 0  # probes missed in a row
        self.probe_failed_at: float | None = None  # when it stopped answering
        self.primed = False  # its informers listed since it last did not answer (a new kubeconfig keeps this)

    def store(self, watched: Watched) -> Store | None:
        cache = self.cache
        return cache.stores().get(watched) if cache is not None else None

    def synced(self) -> bool:
        return self.cache is not None and self.cache.synced()

    def stop(self) -> None:
        if self.cache is not None:
            self.cache.stop()


@dataclass(frozen=True)
class MemberWatch:
    """A kind watched in every member: how it is kept (as Cache.store) and who is told of its changes."""

    watched: Watched
    changed: Callable[[Member, list[Change], bool], None]  # (the member, its changes, whether a (re)list)
    transform: Transform | None = None
    indexers: Mapping[str, Indexer] = field(default_factory=dict)


class MemberCaches:
    """The members of a fleet and what a program watches in each, owned by the runtime and shared by the programs
    that read members (the fleet watch, the ladder's early path). `clients` gives a client per member (re-read by
    `refresh`, every FLEET_WATCH_SECONDS: a rotated token is picked up); a member whose client changed gets a new
    cache. `keep(member)` says whether what its old cache held stays until the new one has listed (a renewed token)
    or is dropped at once."""

    def __init__(self, clients: Callable[[], Mapping[str, client.ApiClient | None]],
                 watches: Sequence[MemberWatch] = (), keep: Callable[[Member], bool] = lambda _member: True):
        self.clients, self.watches, self.keep = clients, list(watches), keep
        self._lock = threading.Lock()
        self._members: dict[str, Member] = {}

    @classmethod
    def from_secrets(cls, api_client: client.ApiClient, secrets: Mapping[str, str], namespace: str) -> MemberCaches:
        """The members whose kubeconfigs are the Secrets `secrets` names (member -> Secret) in `namespace`."""
        return cls(member_clients(client.CoreV1Api(api_client), secrets, namespace))

    def get(self, name: str) -> Member | None:
        with self._lock:
            return self._members.get(name)

    def all(self) -> dict[str, Member]:
        with self._lock:
            return dict(self._members)

    def add(self, member: Member) -> Member:
        """A member as it is (a test's, or one `refresh` found)."""
        with self._lock:
            return self._members.setdefault(member.name, member)

    def refresh(self) -> list[Member]:
        """Read the clients again: a member with a new client watches anew (`restart`), a member no longer in the
        fleet stops; the members now."""
        clients = self.clients()
        for name, api in clients.items():
            member = self.add(Member(name))
            if api is not member.api:
                member.api = api
                self.restart(member, stale=api is None or not self.keep(member))
        with self._lock:
            gone = [self._members.pop(name) for name in set(self._members) - set(clients)]
            members = list(self._members.values())
        for member in gone:
            member.stop()
        return members

    def restart(self, member: Member, stale: bool = True) -> None:
        """A new cache for the member, on its client: a fresh list of every watched kind. `stale` drops what the old
        cache held (and the member is no longer primed); else it stays until the new lists replace it."""
        old = member.cache
        member.stop()
        carried = {} if stale or old is None else old.stores()
        if stale:
            for store in (old.stores().values() if old is not None else ()):
                store.clear()
            member.primed = False
        member.cache = None
        if member.api is None:
            return
        cache = Cache(member.api, member.name, stores=carried)
        for watch in self.watches:
            cache.store(watch.watched, watch.transform, watch.indexers)
            cache.subscribe(watch.watched, lambda changes, listed, told=watch.changed: told(member, changes, listed))
        member.cache = cache
        cache.start()

    def stop(self) -> None:
        for member in self.all().values():
            member.stop()

    def synced(self) -> bool:
        return all(member.cache is None or member.cache.synced() for member in self.all().values())
