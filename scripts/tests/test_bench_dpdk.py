"""scripts/lib/bench_dpdk.py: a run's figures from testpmd's samples, and the table that pairs
pvnet's and DPDK's runs only within one c2c state."""

import bench_dpdk as b


def test_c2c_state_needs_both_samples_in_one_bucket():
    assert b.state("50/74") == "fast"
    assert b.state("75/149") == "mid"
    assert b.state("150/400") == "slow"
    assert b.state("60/80") == "mixed"


def block(port, cum, pps):
    return f"  ######## NIC statistics for port {port} ########\n  TX-packets: {cum}  TX-bytes: 0\n  Tx-pps: {pps}  Tx-bps: 0\n"


def test_result_takes_the_window_after_the_warm_up(tmp_path):
    cum = [1_000_000, 2_000_000, 3_000_000, 4_000_000, 5_000_000]
    pps = [900_000, 1_000_000, 1_100_000, 1_300_000, 1_000_000]
    log = tmp_path / "fe.log"
    log.write_text("testpmd> show port stats all\n" + "".join(block(0, c, p) for c, p in zip(cum, pps, strict=True)))
    ticks = tmp_path / "ticks"
    # k, backend ticks, frontend ticks, the machine's busy ticks: 50 ticks a second of others'
    ticks.write_text("".join(f"{k + 1} {100 * k} {100 * k} {250 * k}\n" for k in range(5)))
    line = b.result(str(log), str(ticks), "TX", 2, 2, 100, 1, 2, 1, "dir=v2h size=64")
    # samples 3 and 4 are the window; 2 M packets over it; 200 backend ticks of 10 ms
    assert line == "RESULT dir=v2h size=64 other_pct=25 mpps=1.20 min=1.10 max=1.30 cpu_ns_per_pkt=1000.0 pkts=2000000"


def test_two_ports_samples_are_summed():
    text = block(0, 10, 1) + block(1, 20, 2) + block(0, 30, 3) + block(1, 40, 4)
    assert b.samples(text, "TX", 2) == [(30, 3), (70, 7)]


def test_queue_share_and_burst_stats():
    assert b.queue_share("tx_q0_good_packets: 300\ntx_q1_good_packets: 100\n", "TX", 2) == 0.25
    assert b.queue_share("tx_q0_good_packets: 300\n", "TX", 2) == 0
    text = "  RX-bursts : 1000 [60% of 0 pkts + 30% of 32 pkts + 10% of 5 pkts]\n"
    assert b.burst_stats(text) == " fe_bursts=1000 fe_empty_pct=60 fe_full_pct=30"


def test_pkts_per_batch_of_the_frontends_port():
    rep = {"ports": [{"kind": "sink", "counters": {}},
                     {"kind": "vhost-user", "counters": {"rx_packets": 100, "rx_batches": 4}}]}  # fmt: skip
    assert b.pkts_per_batch(rep, "v2h") == 25.0
    assert b.pkts_per_batch(rep, "h2v") is None


ROWS = [
    "RESULT dir=v2h size=64 impl=switch round=1 queues=1 c2c_ns=50/60 mpps=10.00 cpu_ns_per_pkt=50.0",
    "RESULT dir=v2h size=64 impl=dpdk round=1 queues=1 c2c_ns=55/65 mpps=8.00 cpu_ns_per_pkt=40.0",
    "RESULT dir=v2h size=64 impl=switch round=2 queues=1 c2c_ns=200/300 mpps=5.00 cpu_ns_per_pkt=100.0",
    "RESULT dir=v2h size=64 impl=dpdk round=2 queues=1 c2c_ns=60/70 mpps=9.00 cpu_ns_per_pkt=42.0",
]
NAME = "v2h: virtio-user txonly -> backend"


def test_summary_pairs_runs_of_one_round_in_one_state():
    out = b.summary(b.parse(ROWS))
    assert out[2:] == [
        # fast: switch round 1 against both DPDK runs (medians), paired only with round 1's
        f"| {NAME} | 64 | switch | fast | 1/2 | 10.00 | 8.50 | **1.18** | 50.0 | 41.0 | 1.22 | 1.25 |",
        # slow: no DPDK run in that state, no ratio
        f"| {NAME} | 64 | switch | slow | 1/0 | 5.00 | - | **-** | 100.0 | - | - | - |",
    ]


def test_sizes_in_numeric_order_chains_by_their_first_segment():
    rows = [r.replace("size=64", "size=" + s) for s in ("1500", "64+594+1514", "64") for r in ROWS[:2]]
    out = b.summary(b.parse(rows))
    assert [line.split(" | ")[1] for line in out[2:]] == ["64", "64+594+1514", "1500"]
