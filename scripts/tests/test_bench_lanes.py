"""scripts/lib/bench_lanes.py: the wire port's readings, the RESULT line and the table."""

import bench_lanes as bl


def test_snap_reads_the_total_and_each_lane():
    status = {
        "ports": [
            {"name": "g", "counters": {"tx_packets": 1}},
            {"name": "w", "counters": {"tx_packets": 30}, "queues": [{"tx_packets": 10}, {"tx_packets": 20}]},
        ]
    }
    assert bl.snap("w", status) == "30 10 20"
    assert bl.snap("g", status) == "1 1"


def test_result_rate_and_cpu_per_packet_over_the_window():
    line = bl.result("auto", "2", "40/50", 10.0, 12.0, 0, 4e6, 0, 2e9)
    assert line == "RESULT cfg=auto round=2 c2c_ns=40/50 wire_mpps=2.000 cpu_ns_per_pkt=500"


def test_summary_pairs_runs_by_round_within_one_state():
    lines = [
        "RESULT cfg=one round=1 c2c_ns=40/50 wire_mpps=1.0 cpu_ns_per_pkt=1000",
        "RESULT cfg=auto round=1 c2c_ns=40/60 wire_mpps=1.5 cpu_ns_per_pkt=900",
        "RESULT cfg=one round=2 c2c_ns=160/170 wire_mpps=0.5 cpu_ns_per_pkt=2000",
        "RESULT cfg=auto round=2 c2c_ns=160/160 wire_mpps=1.0 cpu_ns_per_pkt=1000",
        # A round whose runs were in different states: shown, not compared.
        "RESULT cfg=one round=3 c2c_ns=40/40 wire_mpps=1.0 cpu_ns_per_pkt=1000",
        "RESULT cfg=auto round=3 c2c_ns=160/160 wire_mpps=9.0 cpu_ns_per_pkt=1",
    ]
    out = bl.summary(lines)
    assert "| 1 | fast | 1.000 | 1.500 | 1.50x | 1000 | 900 | 0.90x |" in out
    assert "| 2 | slow | 0.500 | 1.000 | 2.00x | 2000 | 1000 | 0.50x |" in out
    assert "| 3 | mixed | 1.000 | 9.000 | (9.00x) | 1000 | 1 | (0.00x) |" in out
    assert "1 round(s) with c2c probes in more than one state: not in the medians." in out
    assert any(x.startswith("Median in the fast state (1 rounds): lanes=auto 1.50x") for x in out)
    assert any(x.startswith("Median in the slow state (1 rounds): lanes=auto 2.00x") for x in out)
