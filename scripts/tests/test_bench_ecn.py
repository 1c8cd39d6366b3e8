"""scripts/lib/bench_ecn.py: the RESULT line of one run, its counts checked to add up."""

import json

import bench_ecn


def run(tmp_path, counters, capsys):
    sw = tmp_path / "sw.json"
    sw.write_text(json.dumps({"final": {"ports": [{"name": "pa", "counters": {}}, {"name": "pb", "counters": counters}]}}))
    ip = tmp_path / "iperf.json"
    ip.write_text(json.dumps({"end": {"sum": {"packets": 100, "lost_percent": 12.5}}}))
    ce = tmp_path / "ce.txt"
    ce.write_text("88 5\n")
    bench_ecn.report("2", str(sw), str(ip), str(ce))
    return capsys.readouterr().out.strip()


def test_report_reads_port_pb_and_checks_the_queue_adds_up(tmp_path, capsys):
    c = {"queued": 60, "dequeued": 40, "drops_aqm": 3, "drops_queue_limit": 15, "backlog": 2, "ecn_marked": 5}
    assert run(tmp_path, c, capsys) == (
        "RESULT tos=2 sent=100 lost_pct=12.5 ecn_marked=5 aqm=3 queue_limit=15 queued=60"
        " dequeued=40 adds_up=True far_end_udp=88 far_end_ce=5"
    )
    c["dequeued"] = 39
    assert "adds_up=False" in run(tmp_path, c, capsys)
