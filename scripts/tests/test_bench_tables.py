"""The other benchmarks' figures (scripts/lib/bench_*.py) on small inputs."""

import bench_egress_paced as ep
import bench_grants as gr
import bench_guest_tap as gt
import bench_nocopy as nc
import bench_tap as tap


def test_grants_pick_the_state_that_has_every_combination():
    rows = gr.parse([
        "RESULT dir=tx impl=pvnet mode=off round=1 c2c_ns=50/60 mpps=2.0 be_ns=10 iotlb_per_pkt=0",
        "RESULT dir=tx impl=pvnet mode=off round=2 c2c_ns=200/210 mpps=1.0 be_ns=20 iotlb_per_pkt=0",
        "RESULT dir=tx impl=pvnet mode=off round=3 c2c_ns=220/230 mpps=1.2 be_ns=22 iotlb_per_pkt=0",
    ])
    picked, used, states = gr.pick(rows)
    assert used == "the 2 runs in the slow state" and len(picked) == 2
    assert states == {"slow": 2, "fast": 1}
    assert gr.state("nan/60") == "mixed"


def test_grants_ratios_of_pool_over_off_and_per_packet():
    rows = gr.parse([
        f"RESULT dir={d} impl={i} mode={m} round=1 c2c_ns=50/60 mpps={v} be_ns=10 iotlb_per_pkt=0.5"
        for d in ("tx", "rx") for i in ("pvnet", "dpdk") for m, v in (("off", 4.0), ("per-packet", 1.0), ("pool", 3.0))
    ])
    table = gr.summary(rows, "4").splitlines()
    assert table[2] == "| off | 4.000 | 4.000 | 4.000 | 4.000 | 1.00x | 1.00x | 10 / 10 | 0.50 |"
    assert "| pvnet | TX | 0.75x | 3.0x |" in table


def test_grants_result_line(tmp_path):
    fe = tmp_path / "fe.json"
    fe.write_text('{"ready": {}}\n{"final": {"secs": 2, "data_sent": 4000000, "cpu_ns": 8e8, '
                  '"iotlb": {"updates": 10, "invalidates": 10, "misses_answered": 1}}}\n')  # fmt: skip
    line = gr.result(str(fe), 0, 200, 100, "tx", "dir=tx")
    assert line == "RESULT dir=tx mpps=2.0000 be_ns=500.0 fe_ns=200.0 iotlb_per_pkt=0.00 misses_answered=1 pkts=4000000"


def test_egress_paced_bulk_result_accounts_for_the_backlog():
    def snap(t, a_rx, b, busy):
        return {"uptime_secs": t, "workers": [{"busy_secs": busy, "cpu_secs": busy}],
                "ports": [{"name": "a", "counters": {"rx_packets": a_rx}}, {"name": "b", "counters": b}]}  # fmt: skip

    b0 = {"tx_packets": 0, "dequeued": 0, "dequeues": 0, "tx_batches": 0, "calls": 0, "backlog": 100,
          "drops_queue_limit": 0, "dql_limit": 64}  # fmt: skip
    b1 = dict(b0, tx_packets=900, dequeued=900, dequeues=30, tx_batches=30, calls=3, backlog=150, drops_queue_limit=50)
    line = ep.bulk_result("c", "1", "50/60", snap(0, 0, b0, 0), snap(1, 1000, b1, 0.0009))
    assert "mpps=0.001 busy_ns_per_pkt=1000.0" in line
    assert "per_dequeue=30.0" in line and line.endswith("dql_limit=64 unaccounted=0")


def test_egress_paced_state():
    assert ep.state("50/60") == "fast" and ep.state("50/160") == "mixed"


def test_tap_result_and_ratios():
    line = tap.result("dev=tap io=uring round=1", 0, 2, 100, (0, 2e6), (0, 1e6), (0, 100), (0, 1e6), (0, 2e6), (0, 50))
    assert line == ("RESULT dev=tap io=uring round=1 write_mpps=1.000 write_syscalls_per_pkt=0.500 write_cpu_ns_per_pkt=500"
                    " read_mpps=0.500 read_syscalls_per_pkt=2.000 read_cpu_ns_per_pkt=500")  # fmt: skip
    other = line.replace("io=uring", "io=syscall").replace("write_mpps=1.000", "write_mpps=0.500")
    out = tap.table([line, other])
    assert out[-1].startswith("tap, uring / syscall (medians): writes 2.00x Mpps, 1.00x CPU ns/pkt")


def test_guest_tap_console_figures():
    lines = [
        "BENCH tcp_g2h [  5]   0.00-4.00   sec  1.00 GBytes  2150 Mbits/sec                  receiver",
        "BENCH udp_g2h [  5]   0.00-4.00   sec  1.0 MBytes  2.1 Mbits/sec  0.01 ms  100/50100 (0.2%)  receiver",
        "BENCH rr sockperf: ---> <MAX> observation =  1.0",
        "BENCH rr sockperf: ---> percentile 99.000 =   80.5",
        "BENCH rr sockperf: ---> percentile 50.000 =   40.25",
        "BENCH rr sockperf: [Total Run] RunTime=4.000 sec; Warm up time=400 msec; SentMessages=100; ReceivedMessages=100",
        "BENCH_RC tcp_g2h 0", "BENCH_RC udp_g2h 0", "BENCH_RC rr 0",
    ]  # fmt: skip
    g = gt.Console("\n".join(lines))
    assert g.gbit("tcp_g2h") == 2.15
    assert g.pps("udp_g2h") == 50000 / 4
    assert g.rr("rr") == (40.25, 80.5, 25.0)
    assert gt.describe("tcp_g2h_x10_gbit") == "TCP guest->host Gbit/s, 10 flows"
    assert gt.name("pvnet:notify:50") == "pvnet switch --policy notify, tx-call-delay 50 (INTx)"


def test_nocopy_in_place_against_copy():
    rows = nc.parse([
        "drop pvnet 64 copy ewma 60 2.0000 100.0 120.0 1.000 2.000",
        "drop pvnet 64 inplace ewma 60 3.0000 50.0 60.0 1.000 2.000",
    ])
    out = nc.report(rows, "1", "3")
    assert "| pvnet backend gen | in place | 3.00 | 50.0 | 60.0 | **1.500x** | **2.000x** |" in out
