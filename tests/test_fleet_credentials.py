"""The credentials renewer (failover/credentials.py), unit by unit: what it writes, when it asks for a new token and
checks again, and what it does when the token source fails. The real renewals against real API servers are in
tests/test_fleet_controlplane.py (a fleet's manager and Kueue's MultiKueue) and tests/test_monitoring.py (the
scrape token, TokenRequest)."""

from __future__ import annotations

import base64
import datetime
import http.server
import json
import threading
from types import SimpleNamespace

import pytest
import yaml

from failover import credentials
from failover.config import FleetRenewerConfig, MemberAccess
from failover.credentials import MetadataTokenSource, Renewer, Token

NOW = datetime.datetime(2026, 12, 1, 12, 0, tzinfo=datetime.timezone.utc)
MEMBERS = {"w1": MemberAccess("w1-kubeconfig", "https://203.0.113.1", "Q0Ex"),
           "w2": MemberAccess("w2-kubeconfig", "https://203.0.113.2", "Q0Ey")}


class FakeCore:
    """The two calls the renewer makes on the manager's Secrets, with resourceVersion kept as the server does."""

    def __init__(self, texts: dict[str, str], key: str = "kubeconfig"):
        self.key = key
        self.data = {name: base64.b64encode(text.encode()).decode() for name, text in texts.items()}
        self.versions = dict.fromkeys(texts, 1)
        self.patches: list[tuple[str, dict]] = []

    def read_namespaced_secret(self, name, namespace):
        assert namespace == "kueue-system"
        return SimpleNamespace(data={self.key: self.data[name]},
                               metadata=SimpleNamespace(resource_version=str(self.versions[name])))

    def patch_namespaced_secret(self, name, namespace, body):
        assert body["metadata"]["resourceVersion"] == str(self.versions[name])
        self.patches.append((name, body))
        self.data[name] = body["data"][self.key]
        self.versions[name] += 1

    def kubeconfig(self, name: str) -> dict:
        return yaml.safe_load(base64.b64decode(self.data[name]))


class Source:
    def __init__(self, *tokens: Token):
        self.tokens = list(tokens)

    def token(self) -> Token:
        if isinstance(self.tokens[0], Exception):
            raise self.tokens.pop(0)
        return self.tokens.pop(0) if len(self.tokens) > 1 else self.tokens[0]


def tokenless(member: str) -> str:
    access = MEMBERS[member]
    return credentials.inline_kubeconfig(member, access.server, access.certificate_authority_data, None)


class Clock:
    def __init__(self):
        self.now = NOW

    def __call__(self) -> datetime.datetime:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += datetime.timedelta(seconds=seconds)


def renewer(source: Source, clock=None) -> tuple[Renewer, FakeCore]:
    core = FakeCore({access.secret: tokenless(member) for member, access in MEMBERS.items()})
    return Renewer(core, credentials.member_targets(MEMBERS), "kueue-system", source, clock=clock or Clock()), core


def test_each_members_secret_gets_the_token_and_keeps_its_server_and_ca():
    job, core = renewer(Source(Token("t1", NOW + datetime.timedelta(hours=1))))
    job.renew()
    for member, access in MEMBERS.items():
        config = core.kubeconfig(access.secret)
        assert config["users"][0]["user"] == {"token": "t1"}
        assert config["clusters"][0]["cluster"] == {"server": access.server,
                                                     "certificate-authority-data": access.certificate_authority_data}
    assert [name for name, _ in core.patches] == ["w1-kubeconfig", "w2-kubeconfig"]


def test_a_new_token_is_asked_for_past_half_its_life_and_written_only_when_it_changed():
    """Every write makes Kueue rebuild that member's client (its Secret watch): no write without a new token. The
    metadata server hands out the same token until it renews it: asked again, sooner each time."""
    hour = datetime.timedelta(hours=1)
    clock = Clock()
    source = Source(Token("t1", NOW + hour), Token("t1", NOW + hour), Token("t2", NOW + 2 * hour))
    job, core = renewer(source, clock)
    assert job.renew() == credentials.CHECK_SECONDS and len(core.patches) == 2
    clock.advance(20 * 60)
    job.renew()  # 40 min left of 60: not asked
    assert len(source.tokens) == 2 and len(core.patches) == 2
    clock.advance(15 * 60)
    assert job.renew() == credentials.CHECK_SECONDS  # 25 min left: asked, the same token (checked again in 5 min)
    assert len(source.tokens) == 1 and len(core.patches) == 2
    clock.advance(5 * 60)
    job.renew()  # asked again: a new token, written to both
    assert len(core.patches) == 4 and core.kubeconfig("w2-kubeconfig")["users"][0]["user"] == {"token": "t2"}


def test_a_secret_changed_by_someone_else_is_put_back_at_the_next_new_token():
    clock = Clock()
    job, core = renewer(Source(Token("t1", NOW + datetime.timedelta(hours=1)),
                               Token("t2", NOW + datetime.timedelta(hours=2))), clock)
    job.renew()
    core.data["w1-kubeconfig"] = base64.b64encode(tokenless("w1").encode()).decode()  # e.g. `pulumi up --refresh`
    clock.advance(45 * 60)
    job.renew()
    assert core.kubeconfig("w1-kubeconfig")["users"][0]["user"] == {"token": "t2"}


@pytest.mark.parametrize("lifetime, wait", [(3600, credentials.CHECK_SECONDS), (120, 60), (1, 1.0)])
def test_the_next_check_comes_before_half_the_tokens_life(lifetime, wait):
    job, _ = renewer(Source(Token("t", NOW + datetime.timedelta(seconds=lifetime))))
    assert job.renew() == wait


def test_an_expired_token_is_never_written():
    job, core = renewer(Source(Token("old", NOW - datetime.timedelta(seconds=1))))
    with pytest.raises(ValueError, match="expired"):
        job.renew()
    assert core.patches == []


def test_a_failing_source_is_retried_with_backoff_and_the_last_token_stays():
    hour = datetime.timedelta(hours=1)
    clock = Clock()
    job, core = renewer(Source(Token("t1", NOW + hour), OSError("metadata server down"), OSError("still down"),
                               Token("t2", NOW + 2 * hour)), clock)
    waits = []

    def sleep(seconds):
        waits.append(seconds)
        clock.advance(35 * 60 if len(waits) == 1 else seconds)
        if len(waits) == 4:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        credentials.run(job, sleep=sleep)
    assert waits[:3] == [credentials.CHECK_SECONDS, *credentials.RETRY_SECONDS[:2]]
    assert core.kubeconfig("w1-kubeconfig")["users"][0]["user"] == {"token": "t2"}
    assert len(core.patches) == 4


def test_the_metadata_server_is_asked_as_google_auth_asks_it():
    seen = []

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802 - http.server's name
            seen.append((self.path, self.headers.get("Metadata-Flavor")))
            body = json.dumps({"access_token": "ya29.x", "expires_in": 3599, "token_type": "Bearer"}).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        token = MetadataTokenSource(f"127.0.0.1:{server.server_port}", clock=lambda: NOW).token()
    finally:
        server.shutdown()
    assert token == Token("ya29.x", NOW + datetime.timedelta(seconds=3599))
    assert seen == [(credentials.TOKEN_PATH, "Google")]


def test_the_access_list_is_read_as_the_stack_writes_it():
    from infra import fleet as fleet_objects

    handles = [fleet_objects.MemberHandle(m, {"server": a.server, "certificateAuthorityData":
                                              a.certificate_authority_data}, {}, "p", None) for m, a in MEMBERS.items()]
    assert fleet_objects.member_access(handles) == MEMBERS
    written = FleetRenewerConfig(fleet_objects.member_access(handles), "kueue-system").to_env()
    assert FleetRenewerConfig.from_env({e["name"]: e["value"] for e in written}).members == MEMBERS


def test_a_scrape_token_is_a_one_hour_token_request_of_its_service_account():
    """The TokenRequest the renewer makes for Kueue's scrape identity, and the bare token it writes."""
    made = []

    class Core(FakeCore):
        def create_namespaced_service_account_token(self, name, namespace, body):
            made.append((namespace, name, body.spec.expiration_seconds, body.spec.audiences))
            return SimpleNamespace(status=SimpleNamespace(token=f"jwt-{len(made)}",
                                                          expiration_timestamp=NOW + datetime.timedelta(hours=1)))

    core = Core({"scrape-token": ""}, key=credentials.TOKEN_KEY)
    source = credentials.ServiceAccountTokenSource(core, "kueue-system", "reader")
    job = Renewer(core, [credentials.Target("scrape-token", credentials.TOKEN_KEY, lambda token: token)],
                  "kueue-system", source, clock=Clock())
    job.renew()
    job.renew()  # the token in hand is fresh: no second TokenRequest
    assert made == [("kueue-system", "reader", 3600, [])]
    assert base64.b64decode(core.data["scrape-token"]).decode() == "jwt-1"
