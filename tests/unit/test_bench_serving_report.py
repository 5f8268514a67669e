"""`fedfraud bench serving`'s report: where a `POST /score` round trip goes, by subtraction."""

from fedfraud.bench.serving import ServingBenchResult


def test_score_round_trip_is_split_into_the_hot_path_and_the_rest():
    sections = {"anomaly.prepare": {"cpu_s": 0.1, "wall_s": 0.2, "calls": 100},
                "kafka.flush": {"cpu_s": 0.0, "wall_s": 0.3, "calls": 100},
                "http.score": {"cpu_s": 0.0, "wall_s": 0.7, "calls": 100},
                "consumer.poll": {"cpu_s": 0.0, "wall_s": 9.0, "calls": 90}}  # the idle loop beside the requests
    http = {"n": 100.0, "p50_ms": 9.0, "p99_ms": 12.0, "mean_ms": 10.0}
    md = ServingBenchResult(1000.0, 500.0, 10, http=http, http_profile={"replica": sections}).to_markdown()
    assert ("| POST /score through the Serve proxy, one transaction, 100 sequential requests: p50 / p99 | "
            "9.0 / 12.0 ms |") in md
    assert "direct ingress" not in md  # no replica port published: no such row
    # 2 ms + 3 ms per request in the hot path, 7 ms in the handler, so 3 ms of the 10 ms mean are outside it
    assert ("round trip 10.0; the replica's handler 7.0, of which the hot path's sections 5.0 (kafka.flush 3.00, "
            "anomaly.prepare 2.00) and 2.0 body checks, decode, validation and the thread hop; outside the handler "
            "(HTTP client and server, the Serve proxy and its hop to the replica) 3.0.") in md
    assert "POST /score`" not in ServingBenchResult(1000.0, 500.0, 10).to_markdown()
    # the same requests straight to the replica: a second row and a second split, in the same report
    direct = {"n": 100.0, "p50_ms": 6.0, "p99_ms": 8.0, "mean_ms": 8.0}
    md = ServingBenchResult(1000.0, 500.0, 10, http=http, http_profile={"replica": sections}, http_direct=direct,
                            http_direct_profile={"replica": sections}).to_markdown()
    assert ("| POST /score straight to the replica (direct ingress), one transaction, 100 sequential requests: "
            "p50 / p99 | 6.0 / 8.0 ms |") in md
    assert "(HTTP client and server, direct ingress: no proxy) 1.0." in md


def test_each_load_splits_its_latency_where_the_replica_picks_the_batch_up():
    split = {"latency.produced_to_picked": {"n": 10.0, "p50_ms": 4.0, "p99_ms": 30.0},
             "latency.picked_to_decided": {"n": 10.0, "p50_ms": 9.0, "p99_ms": 20.0}}
    row = {"offered": 1000.0, "achieved": 990.0, "n": 10, "p50_ms": 14.0, "p99_ms": 45.0, "p999_ms": 50.0,
           "split": split, "profile": {"replica": {"consumer.decode": {"cpu_s": 0.1, "wall_s": 0.1, "calls": 2}}}}
    md = ServingBenchResult(1000.0, 500.0, 10, loads=[row]).to_markdown()
    assert "| 1,000 | 14.0 / 45.0 | 4.0 / 30.0 | 9.0 / 20.0 |" in md


def test_stage_clock_keeps_per_transaction_samples_for_percentiles():
    from fedfraud.serving.metrics import StageClock

    clock = StageClock()
    clock.observe("latency.x", [i / 1000 for i in range(1, 101)])  # 1 … 100 ms
    got = clock.percentiles(reset=True)["latency.x"]
    assert got["n"] == 100 and abs(got["p50_ms"] - 50.5) < 1e-9 and 99.0 < got["p99_ms"] <= 100.0
    assert clock.percentiles() == {}  # reset


def test_each_load_reports_the_cores_of_each_kind_of_process_and_the_ceiling_runs():
    row = {"offered": 1000.0, "achieved": 990.0, "n": 10, "p50_ms": 14.0, "p99_ms": 45.0, "p999_ms": 50.0,
           "cpu": {"scoring replicas": 0.8, "embedded broker": 0.55, "redis": 0.04,
                   "bench (load generator)": 0.15}}
    md = ServingBenchResult(30_000.0, 3_000.0, 10, loads=[row], cpus=2,
                            ceiling_runs=[29_000.0, 30_000.0, 90_000.0]).to_markdown()
    assert "| 1,000 | 0.80 | 0.55 | 0.04 | 0.00 | 0.15 | 1.54 |" in md
    assert "this machine has 2" in md
    assert "median of 3: 29,000, 30,000, 90,000) | 30,000 msg/s |" in md
    assert "| ratio to ceiling | 10.0% |" in md


def test_the_documented_port_is_printed_next_to_direct_ingress_with_its_target():
    from fedfraud.bench.serving import HttpDoorsResult

    front = {"n": 100.0, "p50_ms": 6.2, "p99_ms": 9.5, "mean_ms": 7.0}
    direct = {"n": 100.0, "p50_ms": 6.0, "p99_ms": 8.0, "mean_ms": 8.0}
    proxy = {"n": 100.0, "p50_ms": 9.0, "p99_ms": 12.0, "mean_ms": 10.0}
    md = ServingBenchResult(1000.0, 500.0, 10, http=proxy, http_direct=direct, http_front=front).to_markdown()
    assert ("| POST /score on the documented port (the front → the replica's own port), one transaction, 100 "
            "sequential requests: p50 / p99 | 6.2 / 9.5 ms |") in md
    assert "| POST /score through the Serve proxy (on its internal port), one transaction" in md
    assert "| documented port within 2 ms of direct ingress (p99) | +1.5 ms (met) | ≤ +2 ms |" in md
    doors = {"front": {**front, "p99_ms": 10.5}, "direct": direct, "proxy": proxy}
    md = HttpDoorsResult(doors, [doors, doors], 50, 2, (1.0, 2.0), 1).to_markdown()
    assert "| documented port within 2 ms of direct ingress (p99) | +2.5 ms (**missed**) | ≤ +2 ms |" in md
    assert "load average 1.0 at start and 2.0 at end; 1 replica port(s)" in md
    assert "p99 of each round (ms): front 10.5, direct 8.0, proxy 12.0; front 10.5" in md
