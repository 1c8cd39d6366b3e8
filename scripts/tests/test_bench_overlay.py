"""scripts/lib/bench_overlay.py: a switch's readings, the RESULT line and the table."""

import bench_overlay as ov


def test_snap_reads_the_port_and_sums_its_drops():
    status = {
        "ports": [
            {"name": "t", "counters": {"rx_packets": 1}},
            {"name": "s", "counters": {"rx_packets": 0, "tx_packets": 7, "drops_invalid": 2, "drops_too_big": 1}},
        ]
    }
    assert ov.snap("s", status) == "0 7 3"


def test_result_per_packet_figures_over_the_window():
    line = ov.result("decap", "pvnet", "64", "1", "60/61", 10.0, 12.0, 0, 3e6, 0, 2e6, 0, 4e9, 0, 1e9, 0, 2e9)
    assert line == (
        "RESULT dir=decap cfg=pvnet size=64 round=1 c2c=60/61 mpps=1.000 sys_ns_per_pkt=2000"
        " a_ns_per_pkt=500 b_ns_per_pkt=1000 src_mpps=1.500"
    )


def test_summary_medians_and_ratios_pvnet_over_kernel():
    lines = [
        "RESULT dir=decap cfg=%s size=64 round=%d c2c=60/60 mpps=%s sys_ns_per_pkt=%s a_ns_per_pkt=1"
        " b_ns_per_pkt=2 src_mpps=3" % (cfg, r, mpps, cpu)
        for r in (1, 2, 3)
        for cfg, mpps, cpu in (("pvnet", 2.0 + r / 10, 500), ("kernel", 1.0, 1000))
    ]
    table = ov.summary(lines + ["noise"]).splitlines()
    assert table[2].startswith("| decap | 64 B | kernel | 1.000 | 1000 | 1 | 2 | 3.000 | - | - |")
    assert table[3] == "| decap | 64 B | pvnet | 2.200 | 500 | 1 | 2 | 3.000 | 2.20x | 0.50x | 60/60 60/60 60/60 | 3 |"


def test_tag_cost_pairs_runs_of_one_round_within_one_state():
    def line(cfg, r, c2c, mpps, a):
        return (
            "RESULT dir=encap cfg=%s size=64 round=%d c2c=%s mpps=%s sys_ns_per_pkt=100"
            " a_ns_per_pkt=%s b_ns_per_pkt=50 src_mpps=9" % (cfg, r, c2c, mpps, a)
        )

    lines = [
        line("pvnet", 1, "50/50", 9.0, 50),
        line("pvnet-vlan", 1, "40/60", 7.2, 75),
        # Round 2: the untagged run fast, the tagged slow: not a pair.
        line("pvnet", 2, "50/50", 9.0, 50),
        line("pvnet-vlan", 2, "190/180", 5.0, 90),
        line("pvnet", 3, "180/200", 6.0, 60),
        line("pvnet-vlan", 3, "170/190", 5.4, 66),
    ]
    table = ov.summary(lines).splitlines()
    assert table[-2] == "| encap | 64 B | fast | 1 | 0.80x | 1.00x | 1.50x | 1.00x |"
    assert table[-1] == "| encap | 64 B | slow | 1 | 0.90x | 1.00x | 1.10x | 1.00x |"
