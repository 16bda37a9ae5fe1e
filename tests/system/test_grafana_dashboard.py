"""docker/grafana/hqueue-dashboard.json: a Grafana dashboard over what a real server exports.

No Grafana or Prometheus runs here; what can be checked without them is:
the JSON is a dashboard Grafana imports (unique panel IDs, a grid with no
overlap, every query on the dashboard's data source variable), and every
series a panel or variable asks for is one a real ``hqueue server`` serves
at ``/metrics``, after a put, a consumer group's receive, ack and nack.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from urllib.request import urlopen

import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from hqueue import HQueue, HQueueAdmin, Message
from hqueue.server import HQueueServer

DOCKER = Path(__file__).resolve().parents[2] / "docker"
DASHBOARD = DOCKER / "grafana" / "hqueue-dashboard.json"
#: What a sample name may add to its family's name, by the family's type.
SUFFIXES = {"counter": ("_total", "_created"), "histogram": ("_bucket", "_count", "_sum", "_created"), "gauge": ("",)}
#: PromQL's words and functions, which are not series.
PROMQL = {"sum", "max", "min", "avg", "by", "rate", "histogram_quantile", "label_values", "le"}


def dashboard() -> dict:
    return json.loads(DASHBOARD.read_text())


def panels() -> list[dict]:
    return [p for p in dashboard()["panels"] if p["type"] != "row"]


def queries() -> list[str]:
    out = [t["expr"] for p in panels() for t in p["targets"]]
    out += [v["definition"] for v in dashboard()["templating"]["list"] if v["type"] == "query"]
    return out


def series_names(query: str) -> set[str]:
    """The series a PromQL query reads: its identifiers, less labels, functions and variables."""
    query = re.sub(r'\{[^}]*\}|"[^"]*"|\[[^]]*\]|\$\w+', " ", query)  # selectors, strings, ranges, variables
    query = re.sub(r"\bby\s*\([^)]*\)", " ", query)
    words = set(re.findall(r"[a-zA-Z_][a-zA-Z0-9_]*", query))
    return {w for w in words if w not in PROMQL and "_" in w}


@pytest.fixture(scope="module")
def served(tmp_path_factory) -> set[str]:
    """Every sample name a real server's scrape may carry, once something happened."""
    server = HQueueServer(f"local://{tmp_path_factory.mktemp('grafana')}/data", port=0, metrics_port=0).start()
    try:
        url = f"hqueue://{server.address}"
        with HQueueAdmin(url) as admin:
            admin.create_queue("q", 2)
        with HQueue("q", url) as queue, queue.consumer("g") as consumer:
            queue.put([Message("t", b"v%d" % i) for i in range(4)])
            got = consumer.receive(4, wait=10)
            consumer.ack(got[:2])
            consumer.nack(got[2:])
        text = urlopen(f"http://127.0.0.1:{server.metrics_port}/metrics", timeout=30).read().decode()
    finally:
        server.stop()
    names = set()
    for family in text_string_to_metric_families(text):
        names |= {family.name + suffix for suffix in SUFFIXES.get(family.type, ("",))}
        names |= {sample.name for sample in family.samples}
    return names


def test_the_dashboard_is_one_grafana_imports():
    board = dashboard()
    assert board["uid"] and board["title"] == "hqueue" and board["schemaVersion"] >= 36
    ids = [p["id"] for p in board["panels"]]
    assert len(ids) == len(set(ids))
    cells: set[tuple[int, int]] = set()
    for p in board["panels"]:
        g = p["gridPos"]
        assert 0 <= g["x"] and g["x"] + g["w"] <= 24
        mine = {(x, y) for x in range(g["x"], g["x"] + g["w"]) for y in range(g["y"], g["y"] + g["h"])}
        assert not mine & cells, f"panel {p['title']!r} overlaps another"
        cells |= mine
    for p in panels():
        assert p["targets"], p["title"]
        assert p["datasource"]["uid"] == "${datasource}"
        assert all(t["datasource"]["uid"] == "${datasource}" for t in p["targets"])


def test_the_dashboard_has_the_consoles_panels():
    titles = " | ".join(p["title"].lower() for p in panels())
    for what in ("put rate", "delivery rate", "partitions owned", "connections", "resident memory", "lag (messages)",
                 "lag (age", "in flight", "members", "dead letters"):  # fmt: skip
        assert what in titles, what


def test_every_series_the_dashboard_reads_is_one_a_real_server_serves(served):
    asked = set().union(*map(series_names, queries()))
    assert "hqueue_put_messages_total" in asked and "hqueue_group_lag_messages" in asked
    missing = sorted(asked - served)
    assert not missing, f"the dashboard reads series no server serves: {missing}"


def test_the_compose_stack_provisions_prometheus_and_the_dashboard():
    services = yaml.safe_load((DOCKER / "docker-compose.yml").read_text())["services"]
    mounted = " ".join(services["grafana"]["volumes"])
    assert "hqueue-dashboard.json" in mounted and "provisioning" in mounted
    scrape = yaml.safe_load((DOCKER / "prometheus.yml").read_text())["scrape_configs"][0]
    targets = scrape["static_configs"][0]["targets"]
    for name in ("hqueue-1", "hqueue-2"):
        command = services[name]["command"]
        port = command[command.index("--metrics-port") + 1]
        assert f"{name}:{port}" in targets
        assert not any(p.endswith(f":{port}") for p in services[name]["ports"])  # metrics stay off the host
    token = re.search(r"^HQUEUE_METRICS_TOKEN=(.+)$", (DOCKER / "hqueue.env").read_text(), re.M)
    assert token and scrape["authorization"]["credentials"] == token.group(1)
