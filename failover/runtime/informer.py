"""List, then watch, one kind of object across the cluster: the controller's eyes instead of a list every pass.

What client-go's reflector does, on the official client's raw transport: a paginated list gives the starting
resourceVersion; a watch from there (with bookmarks, so a quiet kind keeps a fresh resourceVersion) streams every
change; a watch that ends is resumed from the last resourceVersion; 410 Gone (the server compacted past it) means
list again. Objects reach the handler as plain dicts and are not kept here: the handler keeps what it needs.
Ref: https://kubernetes.io/docs/reference/using-api/api-concepts/#efficient-detection-of-changes
"""

from __future__ import annotations

import json
import logging
import random
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from kubernetes import dynamic
from kubernetes.client import ApiException
from kubernetes.watch.watch import iter_resp_lines

log = logging.getLogger("tpu-fallback.failover")

# Metadata only (labels, annotations, owners): for kinds whose spec and status the controller never reads.
# Ref: https://kubernetes.io/docs/reference/using-api/api-concepts/#receiving-resources-as-tables (PartialObjectMetadata)
METADATA_ONLY_LIST = "application/json;as=PartialObjectMetadataList;g=meta.k8s.io;v=v1"
METADATA_ONLY = "application/json;as=PartialObjectMetadata;g=meta.k8s.io;v=v1"
PAGE_SIZE = 500
WATCH_SECONDS = 300  # the server ends each watch after about this long; it is resumed at once


@dataclass(frozen=True)
class Watched:
    """One kind to watch: its collection path across namespaces and how much of each object to fetch."""

    resource: str  # a name for logs and metrics, e.g. "workloads"
    path: str  # e.g. /apis/kueue.x-k8s.io/v1beta2/workloads
    field_selector: str | None = None
    metadata_only: bool = False
    label_selector: str | None = None


class RawClient:
    """The one call an Informer makes (`DynamicClient.request`), on a plain ApiClient: without the dynamic client's
    discovery, which a cluster that does not answer (a fleet member cut off) would block at construction."""

    request = dynamic.DynamicClient.request

    def __init__(self, api_client):
        self.client = api_client


def release(response) -> None:
    """Hand a raw response's connection back to the pool with nothing of it left unread: an unread body would be read
    as the next request's status line on that connection (http.client.BadStatusLine, seen on the fleet watch's
    manager client after a status apply whose answer it did not read)."""
    response.drain_conn()
    response.release_conn()


class Informer(threading.Thread):
    """Calls `on_list(items)` after each (re)list and `on_event(type, object)` for each change, in order."""

    def __init__(self, api: dynamic.DynamicClient | RawClient, watched: Watched, on_list: Callable[[list[dict]], None],
                 on_event: Callable[[str, dict], None], on_error: Callable[[Exception], None] = lambda _: None):
        super().__init__(name=f"informer-{watched.resource}", daemon=True)
        self.api, self.watched = api, watched
        self.on_list, self.on_event, self.on_error = on_list, on_event, on_error
        self.synced = threading.Event()  # the first list was handled
        self.stopping = threading.Event()

    def run(self) -> None:
        backoff = 0.5
        resource_version = None
        while not self.stopping.is_set():
            try:
                if resource_version is None:
                    resource_version = self._list()
                    self.synced.set()
                resource_version = self._watch(resource_version)
                backoff = 0.5
            except ApiException as error:
                if error.status == 410:  # too old: the server no longer has the changes since then
                    resource_version = None
                    continue
                self._failed(error, backoff)
                backoff = min(backoff * 2, 30.0)
            except Exception as error:  # noqa: BLE001 - a dropped connection must not end the thread
                self._failed(error, backoff)
                backoff = min(backoff * 2, 30.0)

    def _failed(self, error: Exception, backoff: float) -> None:
        if self.stopping.is_set():
            return  # the connection was closed because we are stopping
        log.warning("%s: watch failed (%s); retrying in %.1f s", self.watched.resource, error, backoff)
        self.on_error(error)
        self.stopping.wait(backoff * (1 + random.random() / 2))

    def _request(self, query: list[tuple[str, object]], accept: str, read_timeout: float):
        return self.api.request("GET", self.watched.path, query_params=query, header_params={"Accept": accept},
                                serialize=False, _request_timeout=(10, read_timeout))

    def _selectors(self) -> list[tuple[str, object]]:
        return ([("fieldSelector", self.watched.field_selector)] if self.watched.field_selector else []) + (
            [("labelSelector", self.watched.label_selector)] if self.watched.label_selector else [])

    def _list(self) -> str:
        items: list[dict] = []
        query_base = self._selectors()
        continue_token = None
        while True:
            query = [*query_base, ("limit", PAGE_SIZE)] + ([("continue", continue_token)] if continue_token else [])
            response = self._request(query, METADATA_ONLY_LIST if self.watched.metadata_only else "application/json",
                                     60)
            page = json.loads(response.data)
            items.extend(page.get("items") or [])
            continue_token = (page.get("metadata") or {}).get("continue")
            if not continue_token:
                self.on_list(items)
                return page["metadata"]["resourceVersion"]

    def _watch(self, resource_version: str) -> str:
        query = [("watch", "true"), ("resourceVersion", resource_version), ("allowWatchBookmarks", "true"),
                 ("timeoutSeconds", WATCH_SECONDS + random.randint(0, 60)), *self._selectors()]
        response = self._request(query, METADATA_ONLY if self.watched.metadata_only else "application/json",
                                 WATCH_SECONDS + 120)
        ended = False
        try:
            for event_type, obj in _decoded(iter_resp_lines(response)):
                if self.stopping.is_set():
                    break
                if event_type == "ERROR":
                    raise ApiException(status=obj.get("code", 500), reason=obj.get("message"))
                resource_version = obj["metadata"]["resourceVersion"]
                if event_type != "BOOKMARK":
                    self.on_event(event_type, obj)
            else:
                ended = True  # the server ended the watch: nothing is left unread
        finally:
            if not ended:
                response.close()  # events left unread: the connection must not serve another request
            response.release_conn()
        return resource_version

    def stop(self) -> None:
        self.stopping.set()


def _decoded(lines: Iterable[str]):
    for line in lines:
        if line:
            event = json.loads(line)
            yield event["type"], event["object"]
