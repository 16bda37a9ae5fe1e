"""docker/: the compose file's structure, and its hqueue command lines.

No Docker engine runs on the machines hqueue is developed on, so the stack
itself is not started here; this checks what can be checked without one.
"""

from pathlib import Path

import click
import yaml

from hqueue.cli import main

DOCKER = Path(__file__).resolve().parents[2] / "docker"


def compose() -> dict:
    return yaml.safe_load((DOCKER / "docker-compose.yml").read_text())


def test_the_stack_has_zookeeper_hbase_and_two_hqueue_servers():
    services = compose()["services"]
    assert {"zookeeper", "hbase", "hqueue-1", "hqueue-2"} <= set(services)
    assert "2181:2181" in services["zookeeper"]["ports"]
    assert "9090:9090" in services["hbase"]["ports"]  # the HBase Thrift gateway
    assert {services[s]["ports"][0] for s in ("hqueue-1", "hqueue-2")} == {"9700:9700", "9701:9700"}
    for name in ("hqueue-1", "hqueue-2"):
        service = services[name]
        assert service["build"]["dockerfile"] == "docker/Dockerfile"
        assert set(service["depends_on"]) == {"zookeeper", "hbase"}
        assert (DOCKER / service["env_file"]).exists()


def test_the_hqueue_command_lines_are_valid_server_invocations():
    for name in ("hqueue-1", "hqueue-2"):
        command = compose()["services"][name]["command"]
        assert command[0] == "server"
        server = main.commands["server"]
        with click.Context(main, info_name="hqueue", obj={"url": None}) as parent:
            ctx = server.make_context("server", list(command[1:]), parent=parent)
        assert ctx.params["storage"].startswith("hbase://hbase:9090")
        assert ctx.params["zk"] == "zookeeper:2181/hqueue"
        assert ctx.params["host"] == "0.0.0.0" and ctx.params["port"] == 9700
        assert ctx.params["advertise"] and ctx.params["server_id"] == name


def test_the_image_installs_hqueue_and_runs_the_server():
    dockerfile = (DOCKER / "Dockerfile").read_text()
    assert "FROM python:3.11" in dockerfile
    assert "COPY thrift ./thrift" in dockerfile  # the IDL files are loaded at run time
    assert 'ENTRYPOINT ["hqueue"]' in dockerfile and "EXPOSE 9700" in dockerfile
