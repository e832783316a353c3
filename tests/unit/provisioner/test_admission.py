"""Admission control, the pure rule (karios.provisioner.jobs.admission.plan)."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from karios.provisioner.jobs.admission import Limits, Waiting, candidates_per_vendor, oldest_per_vendor, plan


def q(*vendors: str) -> list[Waiting]:
    return [Waiting(f"j{i}", v) for i, v in enumerate(vendors)]


def test_admits_oldest_first_up_to_the_overall_limit():
    out = plan(Limits(overall=2, per_vendor=10), {}, q("dell", "dell", "dell"))
    assert out == {"j0": "", "j1": "", "j2": "overall"}


def test_counts_jobs_already_admitted_by_any_replica():
    out = plan(Limits(overall=3, per_vendor=10), {"dell": 1, "hpe": 1}, q("dell", "hpe"))
    assert out == {"j0": "", "j1": "overall"}


def test_vendor_limit_holds_a_vendor_but_not_the_others_behind_it():
    out = plan(Limits(overall=10, per_vendor=1), {"dell": 1}, q("dell", "hpe", "dell", "hpe"))
    assert out == {"j0": "vendor:dell", "j1": "", "j2": "vendor:dell", "j3": "vendor:hpe"}


def test_per_vendor_override():
    lim = Limits(overall=10, per_vendor=2, vendors={"supermicro": 1})
    out = plan(lim, {}, q("supermicro", "supermicro", "dell", "dell", "dell"))
    assert out == {"j0": "", "j1": "vendor:supermicro", "j2": "", "j3": "", "j4": "vendor:dell"}


def test_overall_is_reported_before_vendor_when_both_are_full():
    out = plan(Limits(overall=1, per_vendor=1), {"dell": 1}, q("dell"))
    assert out == {"j0": "overall"}


def test_nothing_waits_when_there_is_room():
    assert plan(Limits(64, 32), {}, q("dell", "hpe")) == {"j0": "", "j1": ""}
    assert plan(Limits(64, 32), {"dell": 5}, []) == {}


vendors = st.sampled_from(["dell", "hpe", "supermicro", "lenovo", ""])


@given(
    overall=st.integers(1, 20),
    per_vendor=st.integers(1, 20),
    active=st.dictionaries(vendors, st.integers(0, 5)),
    queue=st.lists(vendors, max_size=60),
)
def test_never_past_a_limit_and_never_idle_when_a_job_fits(overall, per_vendor, active, queue):
    lim = Limits(overall, per_vendor)
    out = plan(lim, active, q(*queue))
    admitted = [w for w in q(*queue) if out[w.job_id] == ""]
    total = sum(active.values()) + len(admitted)
    assert not admitted or total <= overall
    for v in set(queue):
        now = active.get(v, 0) + sum(1 for w in admitted if w.vendor == v)
        assert not any(w.vendor == v for w in admitted) or now <= per_vendor
    # a job left waiting names a limit that is really full
    for w in q(*queue):
        why = out[w.job_id]
        if why == "overall":
            assert total >= overall
        elif why:
            assert why == f"vendor:{w.vendor}"
            assert active.get(w.vendor, 0) + sum(1 for a in admitted if a.vendor == w.vendor) >= per_vendor


@given(
    overall=st.integers(1, 20),
    per_vendor=st.integers(1, 8),
    overrides=st.dictionaries(vendors, st.integers(0, 12), max_size=3),
    active=st.dictionaries(vendors, st.integers(0, 5)),
    queue=st.lists(vendors, max_size=80),
)
def test_a_round_that_reads_each_vendors_oldest_admits_what_the_whole_queue_would(
    overall, per_vendor, overrides, active, queue
):
    """The repository's bounded read (each vendor's candidates_per_vendor oldest) changes no
    admission: the same jobs go now, and every job it leaves out would have waited."""
    lim = Limits(overall, per_vendor, overrides)
    full = plan(lim, active, q(*queue))
    bounded = plan(lim, active, oldest_per_vendor(q(*queue), candidates_per_vendor(lim)))
    assert {j for j, why in bounded.items() if not why} == {j for j, why in full.items() if not why}
    assert all(full[j] for j in full.keys() - bounded.keys())


def test_the_bound_is_the_largest_vendor_limit():
    assert candidates_per_vendor(Limits(64, 32)) == 32
    assert candidates_per_vendor(Limits(64, 8, {"dell": 40, "hpe": 2})) == 40
    assert [w.job_id for w in oldest_per_vendor(q("dell", "hpe", "dell", "dell", "hpe"), 2)] == [
        "j0", "j1", "j2", "j4"
    ]  # fmt: skip
