"""Unit tests for the fair local scheduler (coldbrew.scheduler)."""

from __future__ import annotations

import random
from collections import Counter

import pytest

from coldbrew.scheduler import TOP_CLASS, FairScheduler, Pending, effective_priority


def item(tenant: str, priority: int = 5, at: float = 0.0, payload: int = 0) -> Pending[int]:
    """A pending item with test defaults."""
    return Pending(tenant=tenant, priority=priority, enqueued_at=at, payload=payload)


def pop_all(sched: FairScheduler[int], now: float = 0.0) -> list[Pending[int]]:
    """Pop until the scheduler is empty."""
    out = []
    while (got := sched.pop(now)) is not None:
        out.append(got)
    return out


# --- effective priority ------------------------------------------------------------


@pytest.mark.parametrize(
    ("priority", "age", "expected"),
    [
        (5, 0.0, 5),
        (5, 0.99, 5),
        (5, 1.0, 6),
        (0, 9.5, 9),
        (0, 10.0, 10),
        (0, 1e9, TOP_CLASS),
        (9, 1.0, TOP_CLASS),
        (9, 50.0, TOP_CLASS),
        (3, -5.0, 3),  # an item "from the future" does not lose priority
    ],
)
def test_effective_priority(priority: int, age: float, expected: int) -> None:
    """Effective priority gains a level per aging period and is capped at TOP_CLASS."""
    assert effective_priority(priority, 100.0, 100.0 + age, 1.0) == expected


# --- fairness ------------------------------------------------------------------------


def test_burst_of_one_tenant_does_not_delay_the_others() -> None:
    """Twenty tenants with one item each are all served within the first ~40 pops."""
    sched: FairScheduler[int] = FairScheduler()
    for n in range(10_000):
        sched.push(item("a", payload=n))
    for n in range(20):
        sched.push(item(f"t{n}"))
    first = [sched.pop(0.0) for _ in range(40)]
    served = {p.tenant for p in first if p is not None}
    assert {f"t{n}" for n in range(20)} <= served
    assert len(sched) == 10_020 - 40


def test_newcomer_waits_at_most_one_round() -> None:
    """A tenant arriving behind a 10,000-item backlog is served at the very next turn."""
    sched: FairScheduler[int] = FairScheduler()
    for n in range(10_000):
        sched.push(item("a", payload=n))
    for _ in range(500):
        sched.pop(0.0)
    sched.push(item("b"))
    got = sched.pop(0.0)
    assert got is not None
    assert got.tenant == "b"


def test_equal_tenants_alternate() -> None:
    """Two backlogged tenants of equal weight and priority are served alternately."""
    sched: FairScheduler[int] = FairScheduler()
    for n in range(50):
        sched.push(item("a", payload=n))
        sched.push(item("b", payload=n))
    tenants = [p.tenant for p in pop_all(sched)]
    assert all(tenants[i] != tenants[i + 1] for i in range(len(tenants) - 1))


def test_weights_share_service_proportionally() -> None:
    """A tenant of weight 3 gets about three times the service of a tenant of weight 1."""
    sched: FairScheduler[int] = FairScheduler(weights={"a": 3.0})
    for n in range(1000):
        sched.push(item("a", payload=n))
        sched.push(item("b", payload=n))
    counts = Counter(p.tenant for p in (sched.pop(0.0) for _ in range(400)) if p is not None)
    assert 295 <= counts["a"] <= 305
    assert counts["a"] + counts["b"] == 400


def test_set_weight_changes_future_shares() -> None:
    """set_weight takes effect for later picks."""
    sched: FairScheduler[int] = FairScheduler()
    sched.set_weight("b", 4.0)
    for n in range(500):
        sched.push(item("a", payload=n))
        sched.push(item("b", payload=n))
    counts = Counter(p.tenant for p in (sched.pop(0.0) for _ in range(250)) if p is not None)
    assert 195 <= counts["b"] <= 205


@pytest.mark.parametrize("weight", [0.0, -1.0, float("nan"), float("inf")])
def test_bad_weight_is_rejected(weight: float) -> None:
    """A weight that is not a positive finite number is a programming error."""
    with pytest.raises(ValueError):
        FairScheduler[int]().set_weight("a", weight)


def test_refilled_tenants_share_equally() -> None:
    """Tenants refilled right after each pop (prefetch 1) still get equal shares."""
    sched: FairScheduler[int] = FairScheduler()
    for name in "abc":
        sched.push(item(name))
    counts: Counter[str] = Counter()
    for _ in range(300):
        got = sched.pop(0.0)
        assert got is not None
        counts[got.tenant] += 1
        sched.push(item(got.tenant))
    assert counts == Counter({"a": 100, "b": 100, "c": 100})


# --- priority and aging -------------------------------------------------------------


def test_priority_order_within_a_tenant() -> None:
    """A tenant's items come out by priority descending, then oldest first."""
    sched: FairScheduler[int] = FairScheduler()
    for n, prio in enumerate([3, 9, 0, 9, 5]):
        sched.push(item("a", prio, payload=n))
    assert [(p.priority, p.payload) for p in pop_all(sched)] == [
        (9, 1),
        (9, 3),
        (5, 4),
        (3, 0),
        (0, 2),
    ]


def test_higher_priority_class_wins_across_tenants() -> None:
    """All of a higher-priority tenant's fresh items run before another tenant's lower ones."""
    sched: FairScheduler[int] = FairScheduler()
    for n in range(5):
        sched.push(item("low", 4, payload=n))
        sched.push(item("high", 7, payload=n))
    assert [p.tenant for p in pop_all(sched)] == ["high"] * 5 + ["low"] * 5


def test_old_low_priority_item_beats_fresh_high_priority_in_same_tenant() -> None:
    """Within one tenant an aged priority-0 item outranks a fresh priority-9 item."""
    sched: FairScheduler[int] = FairScheduler(aging_seconds=1.0)
    sched.push(item("a", 0, at=0.0, payload=1))
    sched.push(item("a", 9, at=10.0, payload=2))
    got = sched.pop(10.0)
    assert got is not None
    assert got.payload == 1


@pytest.mark.parametrize("same_tenant", [False, True])
@pytest.mark.parametrize(
    ("priority", "arrivals_per_pop", "levels"),
    [
        # the stream keeps up: fresh 9s only; the item wins once it ties them (9 - p levels)
        (0, 1, 9),
        (5, 1, 4),
        # the stream outruns the pops: the 9s age too and reach the cap, so the item
        # must reach the cap as well (10 - p levels), where it is the oldest
        (0, 2, 10),
        (5, 2, 5),
    ],
)
def test_aging_lets_low_priority_overtake_a_sustained_stream(
    same_tenant: bool, priority: int, arrivals_per_pop: int, levels: int
) -> None:
    """A low-priority item is picked once its age reaches aging_seconds times the gap."""
    aging, step = 1.0, 0.1
    sched: FairScheduler[int] = FairScheduler(aging_seconds=aging)
    sched.push(item("hot" if same_tenant else "low", priority, at=0.0, payload=-1))
    picked_at = None
    for n in range(1, 400):
        now = n * step
        for _ in range(arrivals_per_pop):
            sched.push(item("hot", 9, at=now, payload=n))
        got = sched.pop(now)
        assert got is not None
        if got.payload == -1:
            picked_at = now
            break
    assert picked_at is not None
    assert levels * aging - step <= picked_at <= levels * aging + step


def test_now_going_backwards_is_tolerated() -> None:
    """A pop with an older now than before behaves as the newer now."""
    sched: FairScheduler[int] = FairScheduler(aging_seconds=1.0)
    sched.push(item("a", 0, at=0.0, payload=1))
    sched.push(item("b", 9, at=0.0, payload=2))
    assert sched.pop(20.0) is not None
    sched.push(item("b", 9, at=20.0, payload=3))
    got = sched.pop(5.0)
    assert got is not None
    assert got.payload in {1, 2}


# --- eligibility ------------------------------------------------------------------


def test_ineligible_tenant_is_skipped_and_keeps_its_items() -> None:
    """A paused tenant is passed over without losing its items, and served once eligible."""
    sched: FairScheduler[int] = FairScheduler()
    for n in range(3):
        sched.push(item("paused", 9, payload=n))
        sched.push(item("open", 1, payload=n))
    only_open = [sched.pop(0.0, lambda t: t != "paused") for _ in range(4)]
    assert [p.tenant if p else None for p in only_open] == ["open", "open", "open", None]
    assert sched.pending_by_tenant() == {"paused": 3}
    assert [p.payload for p in pop_all(sched)] == [0, 1, 2]


def test_eligible_is_asked_once_per_tenant_per_pick() -> None:
    """The eligibility callback is called at most once per tenant for one pop."""
    sched: FairScheduler[int] = FairScheduler()
    for name in ("a", "b", "c"):
        for n in range(5):
            sched.push(item(name, n, payload=n))
    asked: Counter[str] = Counter()

    def eligible(tenant: str) -> bool:
        asked[tenant] += 1
        return False

    assert sched.pop(0.0, eligible) is None
    assert asked == Counter({"a": 1, "b": 1, "c": 1})
    assert len(sched) == 15


def test_skipped_tenant_is_not_charged() -> None:
    """A tenant skipped while ineligible is served first when it becomes eligible again."""
    sched: FairScheduler[int] = FairScheduler()
    for n in range(10):
        sched.push(item("a", payload=n))
        sched.push(item("b", payload=n))
    for _ in range(4):
        got = sched.pop(0.0, lambda t: t == "b")
        assert got is not None
        assert got.tenant == "b"
    got = sched.pop(0.0)
    assert got is not None
    assert got.tenant == "a"


def test_raising_eligibility_callback_loses_nothing() -> None:
    """If eligible() raises mid-pick, every tenant stays schedulable."""
    sched: FairScheduler[int] = FairScheduler()
    for name in ("a", "b", "c"):
        sched.push(item(name))

    def eligible(tenant: str) -> bool:
        if tenant == "c":
            raise RuntimeError("cap lookup failed")
        return False

    with pytest.raises(RuntimeError):
        sched.pop(0.0, eligible)
    assert sorted(p.tenant for p in pop_all(sched)) == ["a", "b", "c"]


# --- removal and introspection ------------------------------------------------------


def test_remove_where_removes_and_returns_in_push_order() -> None:
    """remove_where takes out exactly the matching items and reports them in push order."""
    sched: FairScheduler[int] = FairScheduler()
    for n in range(10):
        sched.push(item("ab"[n % 2], n % 10, payload=n))
    removed = sched.remove_where(lambda p: p.payload % 3 == 0)
    assert [p.payload for p in removed] == [0, 3, 6, 9]
    assert len(sched) == 6
    assert sorted(p.payload for p in pop_all(sched)) == [1, 2, 4, 5, 7, 8]


def test_remove_where_lowers_a_tenants_class() -> None:
    """Removing a tenant's best item lets another tenant's higher item go first."""
    sched: FairScheduler[int] = FairScheduler()
    sched.push(item("a", 9, payload=1))
    sched.push(item("a", 1, payload=2))
    sched.push(item("b", 5, payload=3))
    assert [p.payload for p in sched.remove_where(lambda p: p.payload == 1)] == [1]
    assert [p.payload for p in pop_all(sched)] == [3, 2]


def test_raising_predicate_removes_nothing() -> None:
    """If the remove_where predicate raises, no item is removed."""
    sched: FairScheduler[int] = FairScheduler()
    for n in range(6):
        sched.push(item(f"t{n % 3}", payload=n))

    def pred(p: Pending[int]) -> bool:
        if p.payload == 4:
            raise RuntimeError("boom")
        return True

    with pytest.raises(RuntimeError):
        sched.remove_where(pred)
    assert len(sched) == 6
    assert sorted(p.payload for p in pop_all(sched)) == list(range(6))


def test_drain_empties_the_scheduler() -> None:
    """drain returns every item in push order and leaves nothing behind."""
    sched: FairScheduler[int] = FairScheduler()
    for n in range(20):
        sched.push(item(f"t{n % 4}", n % 7, payload=n))
    assert [p.payload for p in sched.drain()] == list(range(20))
    assert len(sched) == 0
    assert sched.pop(100.0) is None
    assert sched.pending_by_tenant() == {}
    assert sched.oldest_enqueued_at() is None


def test_priority_is_clamped_and_counted() -> None:
    """Priorities outside 0..9 are clamped and counted in ``clamped``."""
    sched: FairScheduler[int] = FairScheduler()
    sched.push(item("a", 15, payload=1))
    sched.push(item("a", -3, payload=2))
    sched.push(item("a", 4, payload=3))
    assert sched.clamped == 2
    assert [(p.payload, p.priority) for p in pop_all(sched)] == [(1, 9), (3, 4), (2, 0)]


def test_push_assigns_increasing_sequence_numbers() -> None:
    """Each pushed item gets a unique, increasing seq."""
    sched: FairScheduler[int] = FairScheduler()
    for n in range(5):
        sched.push(item("a", payload=n))
    assert [p.seq for p in pop_all(sched)] == [1, 2, 3, 4, 5]


def test_introspection() -> None:
    """len, pending_by_tenant and oldest_enqueued_at describe what is held."""
    sched: FairScheduler[int] = FairScheduler()
    assert sched.oldest_enqueued_at() is None
    sched.push(item("a", 1, at=5.0))
    sched.push(item("a", 8, at=7.0))
    sched.push(item("b", 3, at=2.5))
    assert len(sched) == 3
    assert sched.pending_by_tenant() == {"a": 2, "b": 1}
    assert sched.oldest_enqueued_at() == 2.5


def test_bad_construction_and_push_are_rejected() -> None:
    """A non-positive aging period or a non-finite enqueued_at is refused."""
    with pytest.raises(ValueError):
        FairScheduler[int](aging_seconds=0.0)
    with pytest.raises(ValueError):
        FairScheduler[int]().push(item("a", at=float("nan")))


# --- scale and invariants ------------------------------------------------------------


def test_thousand_tenants_times_ten_items() -> None:
    """1,000 tenants x 10 items push and pop completely, one round per tenant at a time."""
    sched: FairScheduler[int] = FairScheduler()
    for n in range(10):
        for t in range(1000):
            sched.push(item(f"t{t}", n % 10, at=n * 0.001, payload=n))
    popped = [sched.pop(1.0) for _ in range(10_000)]
    assert sched.pop(1.0) is None
    assert len({p.tenant for p in popped[:1000] if p is not None}) == 1000
    assert Counter(p.tenant for p in popped if p is not None) == Counter(
        {f"t{t}": 10 for t in range(1000)}
    )


def test_random_operations_respect_class_and_tenant_order() -> None:
    """Under random pushes, pops, removals and eligibility, every pick is a best one."""
    rng = random.Random(7)
    aging = 0.5
    sched: FairScheduler[int] = FairScheduler(aging_seconds=aging)
    model: dict[int, Pending[int]] = {}  # payload -> the item as the scheduler holds it
    now, pushes = 0.0, 0
    for n in range(6000):
        now += rng.random() * 0.05
        roll = rng.random()
        if roll < 0.55:
            pushes += 1
            new = item(f"t{rng.randrange(40)}", rng.randrange(10), at=now, payload=n)
            sched.push(new)
            model[n] = Pending(new.tenant, new.priority, now, n, seq=pushes)
        elif roll < 0.56:
            removed = sched.remove_where(lambda p: p.payload % 11 == 0)
            assert removed == sorted(
                (p for p in model.values() if p.payload % 11 == 0), key=lambda p: p.seq
            )
            for p in removed:
                del model[p.payload]
        else:
            _check_pick(sched, model, now, aging, {f"t{rng.randrange(40)}" for _ in range(5)})
    assert len(sched) == len(model)
    assert sorted(p.payload for p in sched.drain()) == sorted(model)


def _check_pick(
    sched: FairScheduler[int],
    model: dict[int, Pending[int]],
    now: float,
    aging: float,
    blocked: set[str],
) -> None:
    """Pop once and check the pick against a brute-force ranking of the model."""

    def rank(p: Pending[int]) -> tuple[int, float, int]:
        return (effective_priority(p.priority, p.enqueued_at, now, aging), -p.enqueued_at, -p.seq)

    best: dict[str, tuple[int, float, int]] = {}
    for p in model.values():
        if p.tenant not in blocked and (p.tenant not in best or rank(p) > best[p.tenant]):
            best[p.tenant] = rank(p)
    got = sched.pop(now, lambda tenant: tenant not in blocked)
    if not best:
        assert got is None
        return
    assert got is not None
    assert got == model.pop(got.payload)
    assert rank(got) == best[got.tenant]  # the tenant's own best item
    assert rank(got)[0] == max(best.values())[0]  # from the highest class
