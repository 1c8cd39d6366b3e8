"""scripts/lib/pvnet_report.py: pvnet's JSON reports read the one way every script reads them."""

import io
import json

import pytest

import pvnet_report as r

SWITCH = [
    {"ready": {"features": 123}},
    {"final": {"ports": [
        {"name": "fe", "kind": "vhost-user", "counters": {"rx_packets": 10, "tx_packets": 7, "drops_no_buffer": 2,
                                                          "drops_queue_limit": 1, "queue_errors": 0}},
        {"name": "sink", "kind": "sink", "counters": {"tx_packets": 8}},
    ]}},
]  # fmt: skip


def write(tmp_path, lines, name="r.json"):
    p = tmp_path / name
    p.write_text("".join((json.dumps(x) if not isinstance(x, str) else x) + "\n" for x in lines))
    return str(p)


def test_final_is_the_last_final_line_and_none_without_one(tmp_path):
    two = write(tmp_path, [{"final": {"n": 1}}, "log noise", {"final": {"n": 2}}])
    assert r.final(two) == {"n": 2}
    assert [f["n"] for f in r.finals(two)] == [1, 2]
    assert r.final(write(tmp_path, ["no report"], "x.json")) is None


def test_a_named_ports_counter_or_missing_or_none(tmp_path):
    f = write(tmp_path, SWITCH)
    assert r.port_counter(f, "fe", "rx_packets") == "10"
    assert r.port_counter(f, "fe", "nosuch") == "none"
    assert r.port_counter(f, "gen", "rx_packets") == "missing"
    assert r.port_counter(write(tmp_path, [SWITCH[0]], "e.json"), "fe", "rx_packets") == "missing"


def test_port0_digs_a_dotted_path(tmp_path):
    f = write(tmp_path, [{"final": {"ports": [{"rx_packets": 5, "drops": {"no_buffer": 3}}]}}])
    assert r.port0(f, "rx_packets") == "5"
    assert r.port0(f, "drops.no_buffer") == "3"
    assert r.port0(f, "drops.other") == "none"
    assert r.port0(write(tmp_path, [{"final": {"ports": []}}], "e.json"), "rx_packets") == "missing"


def test_drops_add_up_every_reason():
    assert r.drops(SWITCH[1]["final"]["ports"][0]["counters"]) == 3


def run(args, stdin="", monkeypatch=None, capsys=None):
    monkeypatch.setattr("sys.stdin", io.StringIO(stdin))
    r.main(args)
    return capsys.readouterr().out


def test_commands(tmp_path, monkeypatch, capsys):
    f = write(tmp_path, SWITCH)
    assert run(["drops", f, "fe"], monkeypatch=monkeypatch, capsys=capsys) == "3\n"
    assert run(["final", f, "ports.1.counters.tx_packets"], monkeypatch=monkeypatch, capsys=capsys) == "8\n"
    assert run(["ready", f, "features"], monkeypatch=monkeypatch, capsys=capsys) == "123\n"
    with pytest.raises(SystemExit):
        run(["final", f, "nosuch"], monkeypatch=monkeypatch, capsys=capsys)
    assert run(["c2c"], '{"c2c_ns": 61.6, "ring_mpps": 9}', monkeypatch, capsys) == "62\n"


def test_ctl_answers(monkeypatch, capsys):
    ctl = json.dumps({
        "ports": [{"name": "a", "state": "up", "counters": {"rx_packets": 4}}, {"name": "b", "state": "down", "counters": {}}],
        "workers": [{"worker": 0, "ports": ["a"]}, {"worker": 1, "ports": ["b"]}],
    })
    assert run(["ctl-port", "a", "rx_packets"], ctl, monkeypatch, capsys) == "4\n"
    assert run(["ctl-port", "b", "rx_packets"], ctl, monkeypatch, capsys) == "none\n"
    assert run(["ctl-port", "b", "rx_packets", "0"], ctl, monkeypatch, capsys) == "0\n"
    assert run(["ctl-port", "c", "rx_packets"], ctl, monkeypatch, capsys) == "missing\n"
    assert run(["ctl-state", "b"], ctl, monkeypatch, capsys) == "down\n"
    assert run(["ctl-worker", "b"], ctl, monkeypatch, capsys) == "1\n"
    assert run(["ctl-worker", "c"], ctl, monkeypatch, capsys) == "none\n"
    assert run(["ctl-up"], ctl, monkeypatch, capsys) == "1\n"
    # an answer that is a bare list of ports, with the counters beside the name
    assert run(["ctl-port", "host", "rx_direct", "0"], '[{"name": "host", "rx_direct": 9}]', monkeypatch, capsys) == "9\n"
