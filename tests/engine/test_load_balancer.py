"""LoadBalancer: least-loaded routing over data-parallel engines by their reported counts plus what was sent since,
and the owner of each request for its aborts (plain Python, milliseconds)."""

from __future__ import annotations

from brigade.engine.load_balancer import LoadBalancer, merge_utility_results
from brigade.interfaces import EngineCoreOutput, EngineCoreOutputs, FinishReason, SchedulerStats, UtilityMethod


def report(engine: int, running: int, waiting: int, received: int, finished: list[str] = ()) -> EngineCoreOutputs:
    return EngineCoreOutputs(
        outputs=[EngineCoreOutput(r, [], finish_reason=FinishReason.STOP) for r in finished],
        scheduler_stats=SchedulerStats(num_running_reqs=running, num_waiting_reqs=waiting, engine_index=engine),
        engine_index=engine, num_requests_received=received)


def test_a_burst_spreads_before_any_report():
    balancer = LoadBalancer(3)
    for i in range(6):
        balancer.add(balancer.choose(), [f"r{i}"])
    assert balancer.num_sent == [2, 2, 2]
    assert [balancer.owner[f"r{i}"] for i in range(6)] == [0, 1, 2, 0, 1, 2]


def test_reported_counts_steer_new_requests_and_sends_in_flight_count():
    balancer = LoadBalancer(2)
    balancer.add(0, ["a", "b", "c"])
    balancer.add(1, ["d"])
    # engine 0 has taken all three and runs them; engine 1 has not taken "d" yet (its report says 0 received).
    balancer.report(report(0, running=3, waiting=0, received=3))
    balancer.report(report(1, running=0, waiting=0, received=0))
    assert (balancer.load(0), balancer.load(1)) == (3, 1)
    assert balancer.choose() == 1
    # engine 0 finishes two: it is now the less loaded one.
    balancer.report(report(0, running=1, waiting=0, received=3, finished=["a", "b"]))
    balancer.report(report(1, running=1, waiting=1, received=1))
    assert (balancer.load(0), balancer.load(1)) == (1, 2)
    assert balancer.choose() == 0
    assert set(balancer.owner) == {"c", "d"}  # finished requests are forgotten


def test_ties_rotate_so_sequential_requests_alternate():
    balancer = LoadBalancer(2)
    chosen = []
    for i in range(4):  # each request finishes before the next arrives
        engine = balancer.choose()
        chosen.append(engine)
        balancer.add(engine, [f"r{i}"])
        balancer.report(report(engine, 0, 0, received=balancer.num_sent[engine], finished=[f"r{i}"]))
    assert chosen == [0, 1, 0, 1]


def test_aborts_go_to_the_owner_once():
    balancer = LoadBalancer(2)
    balancer.add(0, ["p_0", "p_1"])  # the two children of one n=2 request share an engine
    balancer.add(1, ["q"])
    assert balancer.take_owners(["q", "p_1", "p_0", "unknown"]) == {1: ["q"], 0: ["p_1", "p_0"]}
    assert balancer.take_owners(["q"]) == {} and balancer.owner == {}


def test_control_call_answers_merge():
    kv = [{"num_free_blocks": 3, "num_total_blocks": 10}, {"num_free_blocks": 7, "num_total_blocks": 10}]
    assert merge_utility_results(UtilityMethod.GET_KV_CACHE_STATS, kv) == {"num_free_blocks": 10,
                                                                            "num_total_blocks": 20}
    assert merge_utility_results(UtilityMethod.RESET_PREFIX_CACHE, [True, False]) is False
    assert merge_utility_results(UtilityMethod.ADD_LORA, [True, True]) is True
