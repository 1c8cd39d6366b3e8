"""scripts/lib/bench_afxdp.py: a switch's readings, the RESULT line and the table."""

import bench_afxdp as ax


def test_snap_reads_the_port_and_sums_the_workers():
    status = {
        "ports": [
            {"name": "s", "counters": {"tx_packets": 9}},
            {"name": "t", "counters": {"tx_packets": 5, "rx_packets": 7, "syscalls": 2}},
        ],
        "workers": [{"busy_secs": 0.5}, {"busy_secs": 0.25}],
    }
    assert ax.snap("t", status) == "5 7 2 750000000"


def test_result_per_packet_figures_over_the_window():
    line = ax.result("xdp-native", "64", "1", 10.0, 12.0, 0, 3e6, 0, 2e6, 0, 0, 0, 2e9, 0, 3e9, 0, 1e9)
    assert line == (
        "RESULT cfg=xdp-native size=64 round=1 rx_mpps=1.000 cpu_ns_per_pkt=1000 busy_ns_per_pkt=500"
        " syscalls_per_pkt=0.000 src_mpps=1.500 src_cpu_ns_per_pkt=1000"
    )


def test_summary_medians_and_ratios_against_af_packet():
    lines = [
        "RESULT cfg=%s size=64 round=%d rx_mpps=%s cpu_ns_per_pkt=%s busy_ns_per_pkt=100 syscalls_per_pkt=0"
        " src_mpps=1 src_cpu_ns_per_pkt=1" % (cfg, r, mpps, cpu)
        for r in (1, 2, 3)
        for cfg, mpps, cpu in (("xdp-native", 2.0 + r / 10, 500), ("af-packet", 1.0, 1000))
    ]
    table = ax.summary(lines + ["noise"]).splitlines()
    assert table[2] == "| xdp-native | 64 B | 2.200 | 500 | 100 | 0.000 | 1.000 | 1 | 2.20x | 0.50x | 1.00x | 3 |"
    assert table[3] == "| af-packet | 64 B | 1.000 | 1000 | 100 | 0.000 | 1.000 | 1 | 1.00x | 1.00x | 1.00x | 3 |"
