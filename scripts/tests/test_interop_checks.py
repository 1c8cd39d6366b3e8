"""tests/interop/checks.py: feature names, and the multiqueue checkers' counts."""

import checks


def test_feature_names():
    assert checks.decode("0xb00000000", checks.FEATURES) == "0xb00000000 = VERSION_1 ACCESS_PLATFORM IN_ORDER"
    assert checks.decode("0x40000", checks.PROTOCOL) == "0x40000 = bit18"


def test_bits_are_read_bit_zero_first(capsys):
    checks.main(["bits", "0100000000000000000000000000000010"])
    assert capsys.readouterr().out == "0x100000002\n"


TESTPMD = """
  ###### NIC extended statistics for port 0
  rx_q0_good_packets: 5
  rx_q1_good_packets: 6
  tx_q0_good_packets: 7
  tx_q1_good_packets: 8
  ###### NIC extended statistics for port 1
  rx_q0_good_packets: 7
  rx_q1_good_packets: 8
  tx_q0_good_packets: 5
  tx_q1_good_packets: 6
""".splitlines()


def port(name, took, gave):
    q = [{"rx_packets": t, "tx_packets": g} for t, g in zip(took, gave, strict=True)]
    return {"name": name, "queues": q, "counters": {"rx_packets": sum(took), "tx_packets": sum(gave)}}


def test_mq_counts_agree_queue_by_queue():
    fin = {"ports": [port("a", [7, 8], [5, 6]), port("b", [5, 6], [7, 8])]}
    out, bad = checks.mq(checks.testpmd_queues(TESTPMD), fin, 0, 0)
    assert bad == []
    assert out[0] == "a q0: testpmd sent 7, pvnet took 7 | pvnet delivered 5, testpmd read 5"
    assert out[-1] == "a + b took 26 = delivered 26 + dropped 0 + waiting 0"


def test_mq_finds_a_queue_that_differs_and_uncounted_loss():
    fin = {"ports": [port("a", [7, 8], [5, 6]), port("b", [5, 6], [7, 7])]}
    _, bad = checks.mq(checks.testpmd_queues(TESTPMD), fin, 0, 0)
    assert bad == ["b q1: pvnet tx 7 != testpmd rx 8", "took 26 != delivered 25 + dropped 0 + waiting 0"]


def test_mq_moves_must_all_be_made_and_answered():
    fin = {"ports": [port("a", [7, 8], [5, 6]), port("b", [5, 6], [7, 8])],
           "workers": [{"worker": 0, "ports": ["a"], "handoff_out": 3, "handoff_in": 4, "moved_in": 2},
                       {"worker": 1, "ports": ["b"], "handoff_out": 4, "handoff_in": 3, "moved_in": 3}]}  # fmt: skip
    _, bad = checks.mq(checks.testpmd_queues(TESTPMD), fin, 6, 6)
    assert bad == ["5 moves made, 6 answered, of 6 asked"]


def test_guest_mq():
    console = ["GUEST_QUEUES rx_queue_0_packets=3 tx_queue_0_packets=4 rx_queue_1_packets=5 tx_queue_1_packets=6",
               "GUEST_STATS tx_packets=10 rx_packets=8"]  # fmt: skip
    fin = {"ports": [{"name": "vm", "queues": [{"rx_packets": 4, "tx_packets": 3}, {"rx_packets": 6, "tx_packets": 5}],
                      "counters": {"rx_packets": 10, "tx_packets": 8}}]}  # fmt: skip
    out, bad = checks.guest_mq(console, fin)
    assert bad == []
    assert out[-1] == "total: guest tx 10 rx 8 | pvnet vm rx 10 tx 8"
    _, bad = checks.guest_mq(console, None)
    assert bad[0] == "pvnet has 0 queue pairs' counters for vm, not 2"
