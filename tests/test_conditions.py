"""Stop conditions: semantics, state round-trips, missing keys, progress and config files."""

from __future__ import annotations

import math
import time
import warnings

import pytest
import yaml

from rl8.training import conditions
from rl8.training.conditions import (
    CONDITIONS,
    And,
    Condition,
    HitsLowerBound,
    HitsUpperBound,
    MissingStatError,
    Or,
    Plateaus,
    StopsDecreasing,
    StopsIncreasing,
    TimeLimit,
    from_config,
)

KEY = "episodes/return_mean"


def run(condition: Condition, values, key: str = KEY) -> list[bool]:
    """Feed a sequence of values of ``key`` and return the condition's answers."""
    return [condition({key: v, "env/steps": i}) for i, v in enumerate(values)]


class FakeClock:
    def __init__(self, now: float = 1000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock(monkeypatch) -> FakeClock:
    fake = FakeClock()
    monkeypatch.setattr(time, "monotonic", fake)
    return fake


# ------------------------------------------------------------------------------------ bounds


def test_hits_upper_bound_is_inclusive():
    condition = HitsUpperBound(KEY, 475)
    assert run(condition, [0, 474.9, 475, 500, 10]) == [False, False, True, True, False]


def test_hits_lower_bound_is_inclusive():
    condition = HitsLowerBound("losses/vf", 0.5)
    assert run(condition, [3, 0.51, 0.5, -1], key="losses/vf") == [False, False, True, True]


def test_bounds_accept_tensors_and_never_stop_on_nan():
    torch = pytest.importorskip("torch")
    assert HitsUpperBound(KEY, 1)({KEY: torch.tensor(2.0)})
    assert not HitsUpperBound(KEY, 1)({KEY: math.nan})
    assert not HitsLowerBound(KEY, 1)({KEY: math.nan})


def test_non_numeric_stat_is_a_type_error():
    with pytest.raises(TypeError, match="must be a number"):
        HitsUpperBound(KEY, 1)({KEY: "high"})


# ---------------------------------------------------------------------------------- plateaus


def test_plateaus_needs_patience_checks_after_the_reference():
    condition = Plateaus(KEY, patience=3, rtol=0.01)
    # reference 100, then three values within 1 % -> stop on the 4th value
    assert run(condition, [100, 100.5, 99.2, 101]) == [False, False, False, True]
    assert condition.reference == 100 and condition.count == 3


def test_plateaus_resets_on_a_jump_and_takes_the_new_reference():
    condition = Plateaus(KEY, patience=2, rtol=0.01)
    assert run(condition, [100, 100, 120, 120.5, 121]) == [False, False, False, False, True]
    assert condition.reference == 120


def test_plateaus_slow_drift_does_not_count_as_a_plateau():
    # each value is within 1 % of the previous one, but drifts away from the reference
    condition = Plateaus(KEY, patience=3, rtol=0.01)
    values = [100 * 1.006**i for i in range(12)]
    assert not any(run(condition, values))


def test_plateaus_tolerance_boundary_is_inclusive_and_relative():
    condition = Plateaus(KEY, patience=1, rtol=0.5)
    assert run(condition, [-10, -15]) == [False, True]  # |−15 − (−10)| = 5 = 0.5 · |−10|
    condition = Plateaus(KEY, patience=1, rtol=0.5)
    assert run(condition, [-10, -15.01]) == [False, False]


def test_plateaus_at_zero_needs_atol():
    assert not any(run(Plateaus(KEY, patience=2, rtol=0.1), [0, 1e-9, -1e-9]))
    assert run(Plateaus(KEY, patience=2, rtol=0.1, atol=1e-6), [0, 1e-9, -1e-9])[-1]


def test_plateaus_rtol_zero_means_exact_equality():
    assert run(Plateaus(KEY, patience=2, rtol=0), [5, 5, 5]) == [False, False, True]


def test_plateaus_ignores_nan():
    condition = Plateaus(KEY, patience=2, rtol=0.01)
    assert run(condition, [math.nan, 10, math.nan, 10, math.nan, 10]) == [
        False,
        False,
        False,
        False,
        False,
        True,
    ]


# ------------------------------------------------------------------------- stops increasing


def test_stops_increasing_counts_checks_without_new_maximum():
    condition = StopsIncreasing(KEY, patience=2)
    assert run(condition, [1, 2, 2, 1.5, 3, 2, 2.9]) == [False, False, False, True, False, False, True]
    assert condition.best == 3


def test_stops_increasing_min_delta():
    condition = StopsIncreasing(KEY, patience=2, min_delta=0.5)
    # 1.4 and 1.5 improve by <= 0.5 over the best (1), so they don't count as new maxima
    assert run(condition, [1, 1.4, 1.5]) == [False, False, True]
    assert condition.best == 1


def test_stops_decreasing_mirrors_stops_increasing():
    condition = StopsDecreasing("losses/vf", patience=2)
    assert run(condition, [5, 4, 4, 4.5, 1], key="losses/vf") == [False, False, False, True, False]


def test_patience_conditions_ignore_nan():
    condition = StopsIncreasing(KEY, patience=1)
    assert run(condition, [1, math.nan, math.nan, 2, 1]) == [False, False, False, False, True]


def test_patience_one_stops_on_the_second_check():
    assert run(StopsIncreasing(KEY, patience=1), [1, 1]) == [False, True]
    assert run(Plateaus(KEY, patience=1, rtol=0), [1, 1]) == [False, True]


# ------------------------------------------------------------------------------- combinators


class Recorder(Condition):
    """Counts its calls and answers a fixed value."""

    def __init__(self, answer: bool) -> None:
        self.answer = answer
        self.calls = 0

    def __call__(self, stats) -> bool:
        self.calls += 1
        return self.answer

    def __repr__(self) -> str:
        return f"Recorder({self.answer})"


@pytest.mark.parametrize(
    "cls, answers, expected",
    [
        (And, [False, True, True], False),
        (And, [True, True, True], True),
        (Or, [True, False, False], True),
        (Or, [False, False, False], False),
    ],
)
def test_and_or_evaluate_every_child(cls, answers, expected):
    children = [Recorder(a) for a in answers]
    condition = cls(children)
    assert condition({}) is expected
    assert condition({}) is expected
    assert [child.calls for child in children] == [2, 2, 2]


def test_or_keeps_stateful_children_updated():
    patience = StopsIncreasing(KEY, patience=2)
    condition = Or([HitsUpperBound(KEY, 0), patience])  # first child is always true
    run(condition, [5, 4, 3])
    assert patience.count == 2 and patience.best == 5


def test_operators_build_and_or():
    a, b = HitsUpperBound(KEY, 1), TimeLimit(10)
    assert isinstance(a & b, And) and (a & b).conditions == [a, b]
    assert isinstance(a | b, Or) and (a | b).conditions == [a, b]


def test_combinator_validation():
    with pytest.raises(ValueError, match="non-empty"):
        And([])
    with pytest.raises(TypeError, match="list of conditions"):
        Or(HitsUpperBound(KEY, 1))
    with pytest.raises(TypeError, match=r"conditions\[1\] must be a Condition"):
        Or([HitsUpperBound(KEY, 1), "time_limit"])


# ------------------------------------------------------------------------------- time limit


def test_time_limit_starts_at_the_first_check(clock):
    condition = TimeLimit(60)
    clock.now += 1000  # time before the first check is not counted
    assert not condition({})
    clock.now += 59.9
    assert not condition({})
    clock.now += 0.1
    assert condition({})


def test_time_limit_start_hook_starts_the_clock_early(clock):
    condition = TimeLimit(60)
    condition.start()
    clock.now += 60
    assert condition({})


def test_time_limit_state_round_trip_continues_counting(clock):
    condition = TimeLimit(60)
    condition({})
    clock.now += 40
    state = condition.state_dict()
    assert state == {"type": "TimeLimit", "elapsed": 40.0}

    resumed = TimeLimit(60)
    resumed.load_state_dict(state)
    clock.now += 500  # the gap between the runs is not counted
    assert not resumed({})
    assert resumed.progress({}) == pytest.approx(40 / 60)
    clock.now += 20
    assert resumed({})


def test_time_limit_reset(clock):
    condition = TimeLimit(10)
    condition({})
    clock.now += 20
    assert condition({})
    condition.reset()
    assert not condition({})
    assert condition.elapsed == 0


def test_time_limit_with_real_clock():
    assert not TimeLimit(3600)({})


# ------------------------------------------------------------------------------------- state


def test_patience_state_round_trip_continues_counters():
    condition = StopsIncreasing(KEY, patience=3)
    run(condition, [5, 4, 3])
    state = condition.state_dict()
    assert state == {"type": "StopsIncreasing", "key": KEY, "best": 5.0, "count": 2}
    assert all(type(v) in (str, int, float) for v in state.values())

    resumed = StopsIncreasing(KEY, patience=3)
    resumed.load_state_dict(state)
    assert resumed({KEY: 4.9})


def test_plateaus_state_round_trip():
    condition = Plateaus(KEY, patience=2, rtol=0.1)
    run(condition, [10, 10.5])
    resumed = Plateaus(KEY, patience=2, rtol=0.1)
    resumed.load_state_dict(condition.state_dict())
    assert resumed.reference == 10 and resumed.count == 1
    assert resumed({KEY: 9.5})


def test_nested_state_round_trip_through_a_checkpoint(tmp_path, clock):
    from rl8.io.checkpoint import load_checkpoint, save_checkpoint

    def build():
        return Or(
            [
                And([Plateaus(KEY, patience=5, rtol=0.1), TimeLimit(100)]),
                StopsDecreasing("losses/vf", patience=4),
            ]
        )

    condition = build()
    for v in [1.0, 1.01, 0.99]:
        condition({KEY: v, "losses/vf": v})
        clock.now += 10
    save_checkpoint({"stop": condition.state_dict()}, tmp_path / "c.pt")
    resumed = build()
    resumed.load_state_dict(load_checkpoint(tmp_path / "c.pt")["stop"])
    assert resumed.state_dict() == condition.state_dict()


def test_state_of_a_fresh_condition_round_trips():
    condition = Plateaus(KEY, patience=2, rtol=0.1)
    state = condition.state_dict()
    assert state["reference"] is None
    other = Plateaus(KEY, patience=2, rtol=0.1)
    other.load_state_dict(state)
    assert other.reference is None and other.count == 0


def test_load_state_dict_rejects_another_condition():
    with pytest.raises(ValueError, match="Plateaus"):
        StopsIncreasing(KEY, patience=1).load_state_dict(Plateaus(KEY, patience=1, rtol=0).state_dict())
    with pytest.raises(ValueError, match="losses/vf"):
        StopsIncreasing(KEY, patience=1).load_state_dict(
            StopsIncreasing("losses/vf", patience=1).state_dict()
        )
    with pytest.raises(ValueError, match="holds 1 conditions"):
        Or([TimeLimit(1), TimeLimit(2)]).load_state_dict(Or([TimeLimit(1)]).state_dict())


def test_reset_forgets_counters():
    condition = StopsIncreasing(KEY, patience=1)
    run(condition, [2, 1])
    wrapper = And([condition])
    wrapper.reset()
    assert condition.best is None and condition.count == 0


# ------------------------------------------------------------------------------ missing keys


def test_missing_key_raises_with_close_matches_and_available_keys():
    stats = {"episodes/return_mean": 1.0, "episodes/length_mean": 3.0, "env/steps": 10}
    with pytest.raises(KeyError) as info:
        HitsUpperBound("episodes/retrun_mean", 475)(stats)
    message = str(info.value)
    assert isinstance(info.value, MissingStatError)
    assert "'episodes/retrun_mean'" in message
    assert "Did you mean 'episodes/return_mean'" in message
    assert "Available keys: env/steps, episodes/length_mean, episodes/return_mean" in message


def test_missing_key_with_many_stats_does_not_list_them_all():
    stats = {f"monitors/x{i}": 0.0 for i in range(100)}
    with pytest.raises(KeyError, match="100 keys available"):
        Plateaus("monitors/x", patience=1, rtol=0)(stats)


@pytest.mark.parametrize(
    "condition",
    [
        HitsUpperBound("rollout/reward_sum_mean", 1),
        HitsLowerBound("rollout/reward_sum_mean", 1),
        Plateaus("rollout/reward_sum_mean", patience=1, rtol=0),
        StopsIncreasing("rollout/reward_sum_mean", patience=1),
        StopsDecreasing("rollout/reward_sum_mean", patience=1),
        Or([TimeLimit(10), HitsUpperBound("rollout/reward_sum_mean", 1)]),
    ],
)
def test_every_stat_condition_raises_on_a_missing_key(condition):
    with pytest.raises(MissingStatError):
        condition({"env/steps": 1})


def test_eval_keys_may_be_absent_on_steps_without_eval():
    condition = StopsIncreasing("eval/rollout/reward_sum_mean", patience=1)
    assert not condition({"env/steps": 1})
    assert condition.best is None  # state unchanged
    assert not condition({"env/steps": 2, "eval/rollout/reward_sum_mean": 5.0})
    assert not condition({"env/steps": 3})
    assert condition.count == 0
    assert condition({"env/steps": 4, "eval/rollout/reward_sum_mean": 4.0})
    assert HitsUpperBound("eval/rollout/reward_sum_mean", 1)({"env/steps": 1}) is False


def test_misspelled_eval_key_fails_on_the_first_eval_step():
    condition = HitsUpperBound("eval/episodes/returns_mean", 1)
    assert not condition({"env/steps": 1})
    with pytest.raises(MissingStatError, match="Did you mean 'eval/episodes/return_mean'"):
        condition({"env/steps": 2, "eval/episodes/return_mean": 0.0})


# ---------------------------------------------------------------------------------- progress


def test_progress_of_an_upper_bound_on_a_counter():
    condition = HitsUpperBound("env/steps", 1_000_000)
    assert condition.progress({"env/steps": 250_000}) == 0.25
    assert condition.progress({"env/steps": 2_000_000}) == 1.0
    assert HitsUpperBound("algorithm/collects", 10).progress({"algorithm/collects": 3}) == 0.3


def test_progress_is_none_when_unknown():
    assert HitsUpperBound(KEY, 475).progress({KEY: 100}) is None  # not a counter
    assert HitsLowerBound("env/steps", 10).progress({"env/steps": 1}) is None
    assert HitsUpperBound("env/steps", 10).progress({}) is None  # never raises
    assert StopsIncreasing(KEY, patience=1).progress({KEY: 1}) is None


def test_progress_of_combinators(clock):
    steps = HitsUpperBound("env/steps", 100)
    time_limit = TimeLimit(10)
    time_limit.start()
    clock.now += 5
    stats = {"env/steps": 20, KEY: 0.0}
    assert Or([steps, time_limit]).progress(stats) == 0.5
    assert And([steps, time_limit]).progress(stats) == 0.2
    assert Or([steps, HitsUpperBound(KEY, 1)]).progress(stats) == 0.2
    assert And([steps, HitsUpperBound(KEY, 1)]).progress(stats) is None
    assert Or([HitsUpperBound(KEY, 1)]).progress(stats) is None


def test_time_limit_progress(clock):
    condition = TimeLimit(100)
    assert condition.progress({}) == 0.0
    condition({})
    clock.now += 25
    assert condition.progress({}) == 0.25
    clock.now += 1000
    assert condition.progress({}) == 1.0


# -------------------------------------------------------------------------------- validation


@pytest.mark.parametrize(
    "build, error, match",
    [
        (lambda: HitsUpperBound("", 1), TypeError, "key must be a non-empty str"),
        (lambda: HitsUpperBound(3, 1), TypeError, "key must be a non-empty str.*got 3"),
        (lambda: HitsUpperBound(KEY, math.inf), ValueError, "bound must be a finite number, got inf"),
        (lambda: HitsLowerBound(KEY, math.nan), ValueError, "bound must be a finite number"),
        (lambda: HitsUpperBound(KEY, "475"), TypeError, r"bound must be a finite number, got '475'"),
        (lambda: HitsUpperBound(KEY, True), TypeError, "bound must be a finite number"),
        (lambda: Plateaus(KEY, patience=0, rtol=0.1), ValueError, "patience must be an int >= 1.*0"),
        (lambda: Plateaus(KEY, patience=2.5, rtol=0.1), TypeError, "patience must be an int >= 1.*2.5"),
        (lambda: Plateaus(KEY, patience=2, rtol=-0.1), ValueError, "rtol must be >= 0, got -0.1"),
        (lambda: Plateaus(KEY, patience=2, rtol=0.1, atol=-1), ValueError, "atol must be >= 0"),
        (lambda: StopsIncreasing(KEY, patience=-1), ValueError, "StopsIncreasing: patience"),
        (lambda: StopsDecreasing(KEY, patience=1, min_delta=-1), ValueError, "min_delta must be >= 0"),
        (lambda: TimeLimit(0), ValueError, "TimeLimit: seconds must be > 0, got 0"),
        (lambda: TimeLimit(-5), ValueError, "seconds must be > 0"),
        (lambda: TimeLimit(math.inf), ValueError, "seconds must be a finite number"),
    ],
)
def test_constructor_validation(build, error, match):
    with pytest.raises(error, match=match):
        build()


def test_repr_is_readable():
    condition = Or(
        [
            HitsUpperBound(KEY, 475),
            Plateaus("losses/vf", patience=3, rtol=0.01),
            And([StopsIncreasing(KEY, patience=2), TimeLimit(seconds=60)]),
        ]
    )
    assert repr(condition) == (
        "Or([HitsUpperBound('episodes/return_mean', 475), "
        "Plateaus('losses/vf', patience=3, rtol=0.01), "
        "And([StopsIncreasing('episodes/return_mean', patience=2), TimeLimit(seconds=60)])])"
    )


# ------------------------------------------------------------------------------- from_config


def test_from_config_builds_every_condition():
    spec = {
        "or": [
            {"hits_upper_bound": {"key": KEY, "bound": 475}},
            {"hits_lower_bound": {"key": "losses/vf", "bound": 0.01}},
            {"plateaus": {"key": KEY, "patience": 10, "rtol": 0.01, "atol": 0.5}},
            {"stops_increasing": {"key": "eval/rollout/reward_sum_mean", "patience": 5}},
            {"stops_decreasing": {"key": "losses/vf", "patience": 5, "min_delta": 0.1}},
            {"and": [{"time_limit": {"seconds": 60}}]},
        ]
    }
    condition = from_config(spec)
    assert repr(condition) == (
        "Or([HitsUpperBound('episodes/return_mean', 475), HitsLowerBound('losses/vf', 0.01), "
        "Plateaus('episodes/return_mean', patience=10, rtol=0.01, atol=0.5), "
        "StopsIncreasing('eval/rollout/reward_sum_mean', patience=5), "
        "StopsDecreasing('losses/vf', patience=5, min_delta=0.1), "
        "And([TimeLimit(seconds=60)])])"
    )
    assert set(CONDITIONS) == {
        "hits_upper_bound",
        "hits_lower_bound",
        "plateaus",
        "stops_increasing",
        "stops_decreasing",
        "time_limit",
        "and",
        "or",
    }


def test_from_config_reads_yaml_including_1e6():
    spec = yaml.safe_load("""
or:
  - hits_upper_bound: {key: env/steps, bound: 1e6}   # YAML reads 1e6 as a string
  - time_limit: {seconds: 3600}
""")
    condition = from_config(spec)
    assert condition.conditions[0].bound == 1e6
    assert not condition({"env/steps": 10})


@pytest.mark.parametrize(
    "spec, match",
    [
        (
            {"hits_uper_bound": {"key": KEY, "bound": 1}},
            r"unknown condition 'hits_uper_bound'\. Did you mean 'hits_upper_bound'.*Valid names: "
            r"hits_upper_bound, hits_lower_bound",
        ),
        ({"foo": {}}, r"unknown condition 'foo'\. Valid names"),
        ({"hits_upper_bound": {"key": KEY}}, r"at hits_upper_bound: missing field 'bound'"),
        (
            {"plateaus": {"key": KEY, "patience": 3, "rtoll": 0.1}},
            r"unknown field 'rtoll'\. Did you mean 'rtol'.*Valid fields: key, patience, rtol, atol",
        ),
        ({"plateaus": {"key": KEY, "patience": 0, "rtol": 0.1}}, r"at plateaus: .*patience must be"),
        ({"time_limit": {"seconds": "soon"}}, r"seconds must be a number, got 'soon'"),
        ({"time_limit": 60}, r"expected a mapping of arguments, got 60"),
        ({"or": {"time_limit": {"seconds": 1}}}, r"at or: expected a list of conditions"),
        ({"or": []}, r"non-empty list"),
        (
            {"or": [{"time_limit": {"seconds": 1}}, {"time_limt": {"seconds": 1}}]},
            r"at or\[1\]: unknown condition 'time_limt'\. Did you mean 'time_limit'",
        ),
        (
            {"and": [{"or": [{"time_limit": {"seconds": -1}}]}]},
            r"at and\[0\]\.or\[0\]\.time_limit: TimeLimit: seconds must be > 0",
        ),
        ({}, r"exactly one key"),
        ({"time_limit": {"seconds": 1}, "or": []}, r"exactly one key"),
        ([{"time_limit": {"seconds": 1}}], r"exactly one key"),
    ],
)
def test_from_config_errors(spec, match):
    with pytest.raises(ValueError, match=match):
        from_config(spec)


def test_to_config_rebuilds_conditions_and_is_none_for_classes_defined_elsewhere():
    class MyOr(Or):
        pass

    condition = Or([HitsUpperBound(KEY, 5), StopsIncreasing(KEY, patience=3)])
    assert repr(from_config(condition.to_config())) == repr(condition)
    assert MyOr([TimeLimit(5)]).to_config() is None  # was StopIteration
    assert Or([MyOr([TimeLimit(5)])]).to_config() is None


@pytest.mark.parametrize(
    "build",
    [
        lambda c: c.Plateaus("returns/mean", patience=3, rtol=0.1),
        lambda c: c.StopsIncreasing("returns/mean", patience=3),
        lambda c: c.StopsDecreasing("eval/returns/mean", patience=3),
        lambda c: c.HitsUpperBound("returns/mean", 1.0),
    ],
)
def test_an_old_stat_name_warns_at_the_users_line(build):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        build(conditions)
    assert [w.filename for w in caught if issubclass(w.category, DeprecationWarning)] == [__file__]
