"""A NATS JetStream cluster on 127.0.0.1 for fault-injection tests: nodes to kill and restart.

Each node is an EmbeddedNats with a store dir of its own. Every port (client, cluster, monitoring)
is chosen once, so a restarted node rejoins at the address its peers keep dialling and `url`
stays valid for clients. Like EmbeddedNats, start and restart nodes from a thread that lives as
long as they should (the main one): a node dies with the thread that started it.

Leaders are found on the monitoring ports (/jsz), not through a client: that also works while
the JetStream API has no leader to answer, which is the moment a test wants to observe.
"""

from __future__ import annotations

import contextlib
import json
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any, Self

from worker.devkit.embedded import EmbeddedNats, free_port
from worker.devkit.polling import until

START_TIMEOUT_S = 60.0
LEADER_TIMEOUT_S = 30.0
POLL_S = 0.1
CLUSTER_NAME = "chaos"

_opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # never via an HTTP proxy


def _get(url: str) -> tuple[int, Any]:
    """(HTTP status, decoded JSON body or None); status 0 when nothing answered."""
    try:
        with _opener.open(url, timeout=2) as resp:
            return int(resp.status), json.load(resp)
    except urllib.error.HTTPError as err:  # /healthz answers 503 with a JSON reason
        with contextlib.suppress(ValueError, OSError):
            return err.code, json.load(err)
        return err.code, None
    except (OSError, ValueError):
        return 0, None


def _unique_port(taken: set[int]) -> int:
    # free_port() may hand out the same port twice once its probe socket is closed.
    while (port := free_port()) in taken:
        pass
    taken.add(port)
    return port


class _Node(EmbeddedNats):
    """An EmbeddedNats whose start() returns once the server runs with JetStream enabled.

    EmbeddedNats.start() waits for a plain /healthz, which a clustered node only passes once it
    follows a meta leader; the first node of a new cluster would wait for peers that are started
    after it. NatsCluster waits for the full /healthz itself, on every node at once."""

    def _healthy(self) -> bool:
        return _get(f"{self.monitor_url}/healthz?js-server-only=true")[0] == 200


@dataclass(frozen=True)
class _Group:
    """A raft group (a stream's or a consumer's replicas) as one node reports it on /jsz."""

    stream: str
    consumer: str | None
    leader: str  # "" while the node knows of none
    replicas: dict[str, dict[str, Any]]  # the other members, by server name; only a leader's are current


class NatsCluster:
    """`size` JetStream nodes named n1, n2, ... routed to one another on 127.0.0.1."""

    def __init__(self, base_dir: Path, size: int = 3, sync_always: bool = False) -> None:
        if size < 2:  # nats-server refuses a JetStream cluster without routes
            raise ValueError("a cluster needs at least two nodes")
        self.base_dir = Path(base_dir).absolute()
        self.names = [f"n{i + 1}" for i in range(size)]
        taken: set[int] = set()
        client_ports = [_unique_port(taken) for _ in range(size)]
        route_ports = [_unique_port(taken) for _ in range(size)]
        self.nodes: list[EmbeddedNats] = []
        for i, name in enumerate(self.names):
            routes = ", ".join(f"nats-route://127.0.0.1:{p}" for j, p in enumerate(route_ports) if j != i)
            extra = "\n".join(
                [
                    f"server_name: {name}",  # raft peer ids derive from it: a restarted node is the same peer
                    "cluster {",
                    f"  name: {CLUSTER_NAME}",
                    f"  listen: 127.0.0.1:{route_ports[i]}",
                    f"  routes: [{routes}]",
                    "}",
                ]
            )
            node = _Node(
                self.base_dir / name, port=client_ports[i], sync_always=sync_always, extra_config=extra
            )
            if node.monitor_port in taken:
                node.monitor_port = _unique_port(taken)
            taken.add(node.monitor_port)
            self.nodes.append(node)

    @property
    def url(self) -> str:
        """Every node's client URL, comma-separated (what TIMER_NATS_URL takes)."""
        return ",".join(node.url for node in self.nodes)

    def start(self) -> None:
        """Start every node; wait until they all follow one meta leader and report healthy."""
        try:
            for node in self.nodes:
                node.start()
            until(self._formed, START_TIMEOUT_S, self._waiting_for("the cluster to form"), POLL_S)
        except BaseException:
            self._kill_all()  # a failed __enter__ gets no __exit__
            raise

    def stop(self) -> None:
        """SIGTERM every running node (a clean shutdown), one after another."""
        for node in self.nodes:
            node.stop()

    def kill(self, i: int) -> None:
        """SIGKILL node i (a crash); its data stays for restart()."""
        self.nodes[i].kill()

    def restart(self, i: int) -> None:
        """Start node i again on its ports and data; wait until it is healthy and has caught up
        with the leader of every stream and consumer it hosts."""
        since = time.monotonic()
        self.nodes[i].start()
        until(
            lambda: self._healthy(i) and self._caught_up(i, since),
            START_TIMEOUT_S,
            self._waiting_for(f"{self.names[i]} to catch up after restart"),
            POLL_S,
        )

    def stream_leader(self, stream: str, timeout: float = LEADER_TIMEOUT_S) -> int:
        """Index in `nodes` of the current leader of `stream`, waiting for one to be elected."""
        return self.wait_stream_leader_elected(stream, timeout=timeout)

    def wait_stream_leader_elected(
        self, stream: str, not_on: int | None = None, timeout: float = LEADER_TIMEOUT_S
    ) -> int:
        """Poll until `stream` has a leader (on a node other than `not_on`, when given); its index."""

        def elected() -> int | None:
            leader = self._stream_leader_now(stream)
            return None if leader == not_on else leader

        where = "" if not_on is None else f" off {self.names[not_on]}"
        try:
            return until(elected, timeout, self._waiting_for(f"a leader of stream {stream!r}{where}"), POLL_S)
        except TimeoutError as err:
            raise TimeoutError(f"{err}; leader each node names: {self._named(stream)}") from None

    def __enter__(self) -> Self:
        self.start()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        try:
            self.stop()
        finally:
            self._kill_all()

    def __repr__(self) -> str:
        return f"<NatsCluster {self.url} dir={self.base_dir}>"

    def _kill_all(self) -> None:
        for node in self.nodes:
            with contextlib.suppress(Exception):
                node.kill()

    def _healthy(self, i: int) -> bool:
        # A clustered node's /healthz asks that it follows a meta leader and that the streams and
        # consumers assigned to it run; not that they have caught up (see _caught_up).
        return self.nodes[i].running and _get(f"{self.nodes[i].monitor_url}/healthz")[0] == 200

    def _formed(self) -> bool | None:
        for i, node in enumerate(self.nodes):
            if not node.running:
                raise RuntimeError(f"{self.names[i]} exited during start-up; see {node.log_path}")
        if not all(self._healthy(i) for i in range(len(self.nodes))):
            return None
        leaders = {self._jsz(i, "").get("meta_cluster", {}).get("leader") for i in range(len(self.nodes))}
        return True if len(leaders) == 1 and None not in leaders and "" not in leaders else None

    def _jsz(self, i: int, query: str) -> dict[str, Any]:
        status, body = _get(f"{self.nodes[i].monitor_url}/jsz{query}")
        return body if status == 200 and isinstance(body, dict) else {}

    def _groups(self, i: int) -> dict[str, _Group]:
        """The raft groups (of streams and consumers) node i hosts, as it sees them, by group name."""
        jsz = self._jsz(i, "?accounts=true&streams=true&consumers=true")
        groups = {}
        for account in jsz.get("account_details") or []:
            for stream in account.get("stream_detail") or []:
                consumers = [(c.get("name"), c) for c in stream.get("consumer_detail") or []]
                for consumer, detail in [(None, stream), *consumers]:
                    cluster = detail.get("cluster") or {}
                    if not cluster.get("raft_group"):
                        continue
                    replicas = {r.get("name"): r for r in cluster.get("replicas") or []}
                    leader = cluster.get("leader") or ""
                    groups[cluster["raft_group"]] = _Group(stream["name"], consumer, leader, replicas)
        return groups

    def _views(self) -> dict[int, dict[str, _Group]]:
        return {i: self._groups(i) for i, node in enumerate(self.nodes) if node.running}

    def _leader_of(self, views: dict[int, dict[str, _Group]], group: str) -> int | None:
        """The node that says it leads `group`, if a majority of the group's members agree.

        A node's own word is not enough: a leader cut off from its peers can still believe it
        leads. The others' word is not either: followers of a killed leader name it for seconds."""
        naming = {i: groups[group].leader for i, groups in views.items() if group in groups}
        claimants = [i for i, leader in naming.items() if leader == self.names[i]]
        if len(claimants) != 1:
            return None
        leader = claimants[0]
        members = 1 + len(views[leader][group].replicas)  # each lists the others, running or not
        agreeing = sum(1 for name in naming.values() if name == self.names[leader])
        return leader if agreeing > members // 2 else None

    def _stream_leader_now(self, stream: str) -> int | None:
        views = self._views()
        found = {
            g
            for groups in views.values()
            for g, seen in groups.items()
            if seen.stream == stream and seen.consumer is None
        }
        if len(found) != 1:  # not created yet, or one of that name in each of several accounts
            return None
        return self._leader_of(views, found.pop())

    def _named(self, stream: str) -> str:
        named = []
        for i, groups in self._views().items():
            leaders = [
                g.leader or "none" for g in groups.values() if g.stream == stream and g.consumer is None
            ]
            named.append(f"{self.names[i]}: {', '.join(leaders) or 'no such stream'}")
        return "; ".join(named)

    def _caught_up(self, i: int, since: float) -> bool:
        """Whether, for every group node i is a member of, the group's leader heard from it after
        `since` (time.monotonic()) and counts it current: it holds every entry the leader applied.

        /healthz passes before that, while the node has yet to learn it is behind. And a leader
        keeps what it knew of a member before a kill; a node killed with writes in its buffers
        comes back with fewer entries than it acknowledged."""
        views = self._views()
        # Its own view and its peers': a node that has not loaded its groups yet lists none.
        member_of = {
            g
            for j, groups in views.items()
            for g, seen in groups.items()
            if j == i or self.names[i] in seen.replicas
        }
        for group in member_of:
            leader = self._leader_of(views, group)
            if leader is None:
                return False
            if leader == i:
                continue
            seen = views[leader][group].replicas.get(self.names[i]) or {}
            heard_s = seen.get("active", 0) / 1e9  # since the leader last heard from it; 0: never
            if not (seen.get("current") and not seen.get("lag") and 0 < heard_s < time.monotonic() - since):
                return False
        return True

    def _waiting_for(self, what: str) -> Callable[[], str]:
        """A timeout's message: what was awaited, and each node's state at the deadline."""
        return lambda: f"{what}; {self._states()}"

    def _states(self) -> str:
        """Each node's /healthz answer and log, for a timeout's message."""
        lines = []
        for name, node in zip(self.names, self.nodes, strict=True):
            status, body = _get(f"{node.monitor_url}/healthz") if node.running else (0, "not running")
            lines.append(f"{name}: {status} {body} (log {node.log_path})")
        return "; ".join(lines)
