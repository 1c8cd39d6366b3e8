"""scripts/lib/bench_afxdp.py: a switch's readings, the RESULT line and the table."""

import bench_afxdp as ax


def test_snap_reads_the_port_and_sums_the_workers():
    status = {
        "ports": [
            {"name": "s", "counters": {"tx_packets": 9}},
            {"name": "t", "counters": {"tx_packets": 5, "rx_packets": 7, "syscalls": 2, "kernel_drops": 4, "rx_direct": 6}},
        ],
        "workers": [{"busy_secs": 0.5}, {"busy_secs": 0.25}],
    }
    assert ax.snap("t", status) == "5 7 2 750000000 4 6 9"


def test_result_per_packet_figures_over_the_window():
    line = ax.result(
        "xdp-native", "64", "1", "50/60", 10.0, 12.0, 0, 3e6, 0, 2e6, 0, 0, 0, 2e9, 0, 3e9, 0, 1e9, 100, 30100, 0, 1.5e6
    )
    assert line == (
        "RESULT cfg=xdp-native size=64 round=1 c2c_ns=50/60 rx_mpps=1.000 cpu_ns_per_pkt=1000 busy_ns_per_pkt=500"
        " syscalls_per_pkt=0.000 src_mpps=1.500 src_cpu_ns_per_pkt=1000 kernel_drops_pct=1.00 direct_pct=75.0"
        " delivered_mpps=0.000"
    )


def test_summary_medians_and_ratios_against_af_packet():
    lines = [
        "RESULT cfg=%s size=64 round=%d c2c_ns=%s rx_mpps=%s cpu_ns_per_pkt=%s busy_ns_per_pkt=100"
        " syscalls_per_pkt=0 src_mpps=1 src_cpu_ns_per_pkt=1" % (cfg, r, c2c, mpps, cpu)
        for r in (1, 2, 3)
        for cfg, mpps, cpu in (("xdp-native", 2.0 + r / 10, 500), ("af-packet", 1.0, 1000))
        for c2c in ("40/50",)
    ]
    # A slow-state run of each, and one that flipped: compared only within their state.
    rest = " busy_ns_per_pkt=100 syscalls_per_pkt=0 src_mpps=1 src_cpu_ns_per_pkt=1"
    lines += [
        "RESULT cfg=xdp-native size=64 round=4 c2c_ns=180/190 rx_mpps=0.9 cpu_ns_per_pkt=900" + rest,
        "RESULT cfg=af-packet size=64 round=4 c2c_ns=170/160 rx_mpps=0.3 cpu_ns_per_pkt=1800" + rest,
        "RESULT cfg=xdp-native size=64 round=5 c2c_ns=40/190 rx_mpps=5 cpu_ns_per_pkt=1" + rest,
    ]
    table = ax.summary(lines + ["noise"]).splitlines()
    assert table[2] == "| af-packet | 64 B | fast | 1.000 | - | 1000 | 100 | 0.000 | 1.000 | 1 | - | - | 1.00x | 1.00x | 1.00x | 3 |"
    assert table[3] == "| xdp-native | 64 B | fast | 2.200 | - | 500 | 100 | 0.000 | 1.000 | 1 | - | - | 2.20x | 0.50x | 1.00x | 3 |"
    assert table[4] == "| xdp-native | 64 B | mixed | 5.000 | - | 1 | 100 | 0.000 | 1.000 | 1 | - | - | - | - | - | 1 |"
    assert table[5] == "| af-packet | 64 B | slow | 0.300 | - | 1800 | 100 | 0.000 | 1.000 | 1 | - | - | 1.00x | 1.00x | 1.00x | 1 |"
    assert table[6] == "| xdp-native | 64 B | slow | 0.900 | - | 900 | 100 | 0.000 | 1.000 | 1 | - | - | 3.00x | 0.50x | 1.00x | 1 |"


def test_summary_compares_direct_receive_with_the_copy_into_the_same_frontend():
    rest = " busy_ns_per_pkt=100 syscalls_per_pkt=0 src_mpps=1 src_cpu_ns_per_pkt=1 kernel_drops_pct=0.00"
    lines = [
        "RESULT cfg=xdp-vm size=1500 round=1 c2c_ns=40/50 rx_mpps=1.0 cpu_ns_per_pkt=400 direct_pct=0.0 delivered_mpps=1.0" + rest,
        "RESULT cfg=xdp-vm-direct size=1500 round=1 c2c_ns=40/50 rx_mpps=1.1 cpu_ns_per_pkt=300 direct_pct=99.5 delivered_mpps=1.1" + rest,
    ]
    table = ax.summary(lines).splitlines()
    assert table[3] == "| xdp-vm-direct | 1500 B | fast | 1.100 | 1.100 | 300 | 100 | 0.000 | 1.000 | 1 | 0.00 | 99.5 | 1.10x | 0.75x | 1.00x | 1 |"
