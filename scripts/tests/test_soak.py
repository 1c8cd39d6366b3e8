"""scripts/lib/soak.py: a round adds up only when every frame is accounted for."""

import soak

TX = {"data_sent": 100, "tx_packets": 101, "secs": 2.0}
RX = {"data_received": 98, "rx_packets": 99, "missing": 2, "backward": 0, "seq_errors": 1, "rx_errors": 0,
      "end_count": 100}  # fmt: skip
BEFORE = {"a": {"rx_packets": 0}, "b": {"tx_packets": 0, "backlog": 0, "drops_queue_limit": 0}}
NOW = {"a": {"rx_packets": 101}, "b": {"tx_packets": 99, "backlog": 0, "drops_queue_limit": 2}}


def test_a_round_with_counted_drops_adds_up():
    rec, bad = soak.round_record(TX, RX, NOW, BEFORE)
    assert bad == []
    assert rec["drops"] == {"queue_limit": 2}
    line = soak.round_line(1, 3, rec, bad, 5)
    assert line == "round 1/3: 100 sent, 98 received, 2 dropped (queue_limit 2), 0.00 Mpps, 2.0 s, elapsed 5 s"


def test_an_uncounted_loss_does_not_add_up():
    now = {"a": {"rx_packets": 101}, "b": {"tx_packets": 99, "backlog": 0, "drops_queue_limit": 1}}
    rec, bad = soak.round_record(TX, RX, now, BEFORE)
    assert bad and bad[0].startswith("switch took 101, delivered 99 + dropped 1")
    assert "DOES NOT ADD UP" in soak.round_line(1, 3, rec, bad, 5)


def test_totals_against_the_switch_over_the_whole_run():
    rec, _ = soak.round_record(TX, RX, NOW, BEFORE)
    bad, drops = soak.totals([rec], BEFORE, NOW, 100)
    assert bad == [] and drops == {"queue_limit": 2}
    bad, _ = soak.totals([rec], BEFORE, NOW, 200)
    assert bad == ["sent 100, asked for 200"]
    lines = soak.total_lines([rec], 1, 4.0, [], drops)
    assert lines[-1] == "soak: 100 sent, 98 received, 2 dropped (reasons: queue_limit 2), counts add up"
