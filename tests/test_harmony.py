"""Harmony's performance model (Eq. 1-4), its grouping algorithm and its regrouping thresholds (pure)."""

from __future__ import annotations

import random

import pytest

from datamgr.scheduler import harmony
from datamgr.scheduler.colocation import (
    Group,
    JobProfile,
    Utilisation,
    assign_machines,
    cluster_utilisation,
    group_iteration_seconds,
    group_utilisation,
)
from datamgr.scheduler.policies.isolated import isolated_dop
from datamgr.scheduler.policies.naive import contended_iterations


def job(name: str, cpu: float, net: float, load: float = 0.0) -> JobProfile:
    return JobProfile(name, cpu, net, load)


# --- Eq. 1-4 -------------------------------------------------------------------------------------------------


def test_comp_time_is_inversely_proportional_to_the_groups_machines_eq2() -> None:
    a = job("a", cpu=12.0, net=5.0)
    assert a.cpu_seconds(1) == 12.0
    assert a.cpu_seconds(4) == 3.0
    assert a.iteration_seconds(4) == 3.0 + 5.0  # COMP then COMM


def test_group_iteration_is_the_cpu_bound_sum_when_comp_dominates_eq1() -> None:
    # on 2 machines: COMP 4 + 3 = 7, COMM 1 + 2 = 3, own iterations 5 and 5
    jobs = [job("a", 8, 1), job("b", 6, 2)]
    assert group_iteration_seconds(jobs, 2) == 7.0


def test_group_iteration_is_the_network_bound_sum_when_comm_dominates_eq1() -> None:
    # on 4 machines: COMP 1 + 0.5 = 1.5, COMM 3 + 2 = 5, own iterations 4 and 2.5
    jobs = [job("a", 4, 3), job("b", 2, 2)]
    assert group_iteration_seconds(jobs, 4) == 5.0


def test_group_iteration_is_the_slowest_jobs_own_iteration_when_one_job_dominates_eq1() -> None:
    # Figure 8b: COMP 10 + 0.5 = 10.5, COMM 10 + 0.5 = 10.5, but job b alone needs 10 + 10 = 20
    jobs = [job("a", 0.5, 0.5), job("b", 10, 10)]
    assert group_iteration_seconds(jobs, 1) == 20.0


def test_utilisation_is_each_resources_busy_share_of_the_group_iteration_eq3() -> None:
    jobs = [job("a", 8, 1), job("b", 6, 2)]  # T_g = 7 on 2 machines (above)
    assert group_utilisation(jobs, 2) == Utilisation(1.0, 3 / 7)
    job_bound = group_utilisation([job("a", 0.5, 0.5), job("b", 10, 10)], 1)
    assert job_bound.cpu == pytest.approx(10.5 / 20) and job_bound.net == pytest.approx(10.5 / 20)


def test_cluster_utilisation_weights_each_group_by_its_machines_eq4() -> None:
    cpu_bound = Group((job("a", 8, 1), job("b", 6, 2)), 2)  # U = (1, 3/7)
    alone = Group((job("c", 3, 1),), 3)  # COMP 1, COMM 1, own 2: U = (1/2, 1/2)
    u = cluster_utilisation([cpu_bound, alone])
    assert u.cpu == pytest.approx((2 * 1 + 3 * 0.5) / 5)
    assert u.net == pytest.approx((2 * 3 / 7 + 3 * 0.5) / 5)
    assert cluster_utilisation([]) == Utilisation(0.0, 0.0)


def test_remote_loading_is_prefetched_within_a_job_and_a_slow_loader_holds_up_its_group() -> None:
    # a job's own iteration is max(COMP + COMM, load): "c" computes and communicates for 2 s, loads for 5 s
    assert job("c", 1, 1, load=5).iteration_seconds(1) == 5.0
    assert job("d", 1, 1, load=1.5).iteration_seconds(1) == 2.0
    # each job loads at its own rate: loads add up to no group term; "a" loading 4 s sets the pace (COMP 3, COMM 2)
    jobs = [job("a", 2, 1, load=4), job("b", 1, 1, load=3)]
    assert group_iteration_seconds(jobs, 1) == 4.0
    assert group_utilisation(jobs, 1) == Utilisation(3 / 4, 2 / 4)


@pytest.mark.parametrize("bad", [{"cpu": 0.0, "net": 1.0}, {"cpu": 1.0, "net": -1.0}])
def test_a_profile_with_impossible_times_is_refused(bad: dict[str, float]) -> None:
    with pytest.raises(ValueError, match="job x"):
        JobProfile("x", bad["cpu"], bad["net"])


def test_a_group_needs_a_job_and_a_machine() -> None:
    with pytest.raises(ValueError, match="at least one job"):
        Group((), 1)
    with pytest.raises(ValueError, match="at least one machine"):
        Group((job("a", 1, 1),), 0)


# --- machine distribution (Algorithm 1, L8) ---------------------------------------------------------------------


def test_every_group_gets_a_machine_and_every_machine_is_given_out() -> None:
    rng = random.Random(4)
    for _ in range(50):
        groups = [[job(f"{g}-{j}", rng.uniform(1, 100), rng.uniform(0, 10)) for j in range(rng.randint(1, 4))]
                  for g in range(rng.randint(1, 8))]  # fmt: skip
        machines = rng.randint(len(groups), 60)
        counts = assign_machines(groups, machines)
        assert all(count >= 1 for count in counts)
        assert sum(counts) == machines


def test_machines_go_to_the_most_computation_intensive_group() -> None:
    heavy = [job("heavy", 40, 2)]  # COMP / COMM = 20 on one machine
    light = [job("light", 4, 2)]  # 2 on one machine
    # heavy takes machines while its COMP/COMM exceeds light's 2: 40/m / 2 > 2 for m < 10, so 9 of the 10 spare
    # go to heavy before light's turn, and the last goes to whichever is ahead (heavy at 10: ratio 2 = light's: tie
    # to the earlier group)
    assert assign_machines([heavy, light], 12) == [11, 1]
    with pytest.raises(ValueError, match="3 job groups need at least as many machines"):
        assign_machines([heavy, light, light], 2)


# --- grouping (Algorithm 1, L6-7) --------------------------------------------------------------------------------


def test_the_number_of_groups_balances_comp_and_comm_at_an_equal_dop() -> None:
    # sum C = 400, sum T_net = 20: n = 100 * 20 / 400 = 5
    jobs = [job(str(i), 100, 5) for i in range(4)]
    assert harmony.group_count(jobs, 100) == pytest.approx(5.0)
    assert harmony.candidate_counts(jobs, 100) == [4]  # 5 groups cannot be filled by 4 jobs


def test_candidate_counts_are_the_two_whole_numbers_around_the_ideal() -> None:
    jobs = [job(str(i), 100, 3.3) for i in range(10)]  # n = 100 * 33 / 1000 = 3.3
    assert harmony.candidate_counts(jobs, 100) == [3, 4]
    assert harmony.candidate_counts(jobs, 2) == [1]  # n = 0.066: at least one group


def test_groups_are_filled_evenly_with_jobs_of_similar_iteration_time() -> None:
    short = [job(f"s{i}", 1, 1) for i in range(3)]
    long = [job(f"l{i}", 30, 30) for i in range(3)]
    groups = harmony.fill_groups([*short, *long], 2, 2)
    assert sorted(len(group) for group in groups) == [3, 3]
    assert {frozenset(j.job_id[0] for j in group) for group in groups} == {frozenset("s"), frozenset("l")}
    assert harmony.group_sizes(7, 3) == [3, 2, 2]


def test_fine_tuning_swaps_jobs_between_complementary_groups_until_no_swap_helps() -> None:
    # two CPU-heavy jobs in one group, two network-heavy in the other: one swap balances both
    cpu_heavy = [job("c1", 8, 1), job("c2", 8, 1)]
    net_heavy = [job("n1", 1, 8), job("n2", 1, 8)]
    tuned = harmony.fine_tune([cpu_heavy, net_heavy], 1.0)
    for group in tuned:
        assert {j.job_id[0] for j in group} == {"c", "n"}
    assert [[j.job_id for j in g] for g in [cpu_heavy, net_heavy]] == [["c1", "c2"], ["n1", "n2"]]  # untouched


def test_fine_tuning_leaves_groups_leaning_the_same_way_alone() -> None:
    groups = [[job("a", 8, 1), job("b", 7, 1)], [job("c", 6, 1), job("d", 9, 1)]]
    assert harmony.fine_tune(groups, 1.0) == groups


# --- Algorithm 1 (the number of jobs) ----------------------------------------------------------------------------


def test_schedule_runs_the_fewest_leading_jobs_within_5_percent_of_the_best_utilisation() -> None:
    rng = random.Random(7)
    jobs = [job(f"j{i}", rng.uniform(20, 200), rng.uniform(1, 10)) for i in range(30)]
    chosen = harmony.schedule(jobs, 40)
    count = len(chosen.job_ids)
    assert chosen.job_ids == {j.job_id for j in jobs[:count]}  # a prefix of the candidates, in their order
    best = max(
        (cluster_utilisation(harmony.best_grouping(jobs[:k], 40)) for k in range(1, 31)),
        key=lambda u: (round(u.cpu, 9), round(u.net, 9)),
    )
    assert best.gain_over(chosen.utilisation) < harmony.THRESHOLD
    for k in range(1, count):  # every shorter prefix falls 5 % or more short of the best
        assert best.gain_over(cluster_utilisation(harmony.best_grouping(jobs[:k], 40))) >= harmony.THRESHOLD
    assert sum(group.machines for group in chosen.groups) == 40


def test_schedule_with_no_candidates_runs_nothing() -> None:
    assert harmony.schedule([], 10).groups == ()
    with pytest.raises(ValueError, match="at least one machine"):
        harmony.schedule([job("a", 1, 1)], 0)


def test_cpu_utilisation_counts_before_the_networks() -> None:
    assert Utilisation(0.9, 0.1).better_than(Utilisation(0.8, 1.0))
    assert Utilisation(0.9, 0.5).better_than(Utilisation(0.9, 0.4))
    assert not Utilisation(0.9, 0.4).better_than(Utilisation(0.9, 0.4))
    assert Utilisation(1.05, 0).gain_over(Utilisation(1.0, 0)) == pytest.approx(0.05)


# --- regrouping thresholds (section IV-B4) ---------------------------------------------------------------------


def test_jobs_within_5_percent_are_similar_and_beyond_are_not() -> None:
    finished = job("f", cpu=10, net=10)
    assert harmony.similar([job("a", 10.4, 10.4)], [finished], 1)  # 4 % longer, same ratio
    assert not harmony.similar([job("b", 10.6, 10.6)], [finished], 1)  # 6 % longer
    assert not harmony.similar([job("c", 11, 9)], [finished], 1)  # same length, ratio 1.22
    pair = [job("p", 5, 5), job("q", 5.1, 5.1)]
    assert harmony.similar(pair, [finished], 1)


def test_a_finished_job_is_replaced_by_a_similar_one_then_by_a_similar_pair() -> None:
    finished = job("f", 10, 10)
    unlike, alike = job("u", 30, 1), job("a", 10.2, 10.2)
    assert harmony.replacement_for(finished, [unlike, alike], 1) == (alike,)
    halves = [job("h1", 5, 5), unlike, job("h2", 5, 5)]
    assert harmony.replacement_for(finished, halves, 1) == (halves[0], halves[2])
    assert harmony.replacement_for(finished, [unlike], 1) is None


def test_a_new_job_joins_the_group_that_raises_utilisation_by_5_percent_or_waits() -> None:
    network_bound = Group((job("n", 1, 10),), 1)  # U = (1/11, 10/11)
    cpu_bound = Group((job("c", 10, 1),), 1)
    complementary = job("x", 9, 1)  # fills network_bound's idle CPU
    assert harmony.best_addition([network_bound, cpu_bound], complementary) == 0
    tiny = job("t", 0.01, 0.001)  # adds well under 5 % of CPU utilisation anywhere
    assert harmony.best_addition([network_bound, cpu_bound], tiny) is None


def test_a_regrouping_with_more_jobs_must_beat_one_with_fewer_by_5_percent() -> None:
    now = Utilisation(0.5, 0.5)
    fewer = harmony.Schedule((), Utilisation(0.80, 0.5))
    slightly_more = harmony.Schedule((), Utilisation(0.83, 0.9))  # +3.75 %: not enough to involve more jobs
    much_more = harmony.Schedule((), Utilisation(0.90, 0.5))  # +12.5 % over fewer
    assert harmony.choose_regroup([fewer, slightly_more], now) is fewer
    assert harmony.choose_regroup([fewer, much_more], now) is much_more
    assert harmony.choose_regroup([harmony.Schedule((), Utilisation(0.52, 1.0))], now) is None  # +4 % over now


# --- the baselines' models ---------------------------------------------------------------------------------------


def test_isolated_runs_a_job_where_its_comp_takes_as_long_as_its_comm() -> None:
    assert isolated_dop(job("a", 60, 5), 100) == 12  # 60 / 12 = 5
    assert isolated_dop(job("b", 60, 5), 8) == 8  # capped by the cluster
    assert isolated_dop(job("c", 1, 5), 100) == 1  # at least one machine
    assert isolated_dop(job("d", 60, 0), 100) == 100  # never waits on the network
    # between 12 and 13 machines (C / T_net = 12.5) the product speed x CPU utilisation decides
    odd = job("e", 62.5, 5)
    score = {m: (62.5 / m) / (62.5 / m + 5) ** 2 for m in (12, 13)}
    assert isolated_dop(odd, 100) == max(score, key=lambda m: score[m])


def test_naive_contention_slows_each_job_by_the_others_use_of_its_resources() -> None:
    assert contended_iterations([job("a", 4, 2)], 2) == [pytest.approx(4.0)]  # alone: its own iteration
    both = contended_iterations([job("a", 4, 0), job("b", 4, 0)], 1)  # two CPU-only jobs share the CPU
    assert both == [pytest.approx(8.0), pytest.approx(8.0)]
    rng = random.Random(3)
    for _ in range(30):
        jobs = [job(str(i), rng.uniform(0.5, 10), rng.uniform(0.5, 10)) for i in range(rng.randint(2, 4))]
        times = contended_iterations(jobs, 1)
        for profile, time in zip(jobs, times, strict=True):
            # never faster than alone, never slower than sharing every phase with all the others all the time
            assert profile.iteration_seconds(1) - 1e-9 <= time <= len(jobs) * profile.iteration_seconds(1) + 1e-9
        # no resource busier than all the time
        assert sum(j.cpu_machine_seconds / t for j, t in zip(jobs, times, strict=True)) <= 1 + 1e-9
