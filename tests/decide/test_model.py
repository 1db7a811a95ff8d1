"""Step-cost model fit, predictions, k choice, break-even, and TensorRT-LLM schedule semantics."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from spectool.decide.acceptance import expected_tokens_per_step
from spectool.decide.model import (
    TERMS,
    ConcurrencyGate,
    StepCostObservation,
    break_even_concurrency,
    capped_choices,
    choice_for_batch,
    choose_k,
    draft_len_for_batch,
    fit_step_cost,
    gate_from_choices,
    predict_cell,
    predict_grid,
    schedule_from_choices,
)
from spectool.errors import BadInputError

CONCURRENCIES = (1, 2, 4, 8, 16, 32, 64)


def exact_observations(coef: dict[str, float], k_max: int = 6) -> list[StepCostObservation]:
    """The tune plan's design: baselines everywhere, k=1 and k=K at the smallest and largest."""

    def t(b: float, k: int) -> float:
        on = 1.0 if k else 0.0
        return (
            coef["fixed_ms"]
            + coef["per_request_ms"] * b
            + on
            * (
                coef["spec_fixed_ms"]
                + coef["per_draft_token_ms"] * b * k
                + coef["per_draft_pass_ms"] * k
            )
        )

    cells = [(c, 0) for c in CONCURRENCIES] + [(c, k) for c in (1, 64) for k in (1, k_max)]
    return [StepCostObservation(float(c), k, t(c, k)) for c, k in cells]


@settings(max_examples=50, deadline=None)
@given(st.tuples(*[st.floats(0.0, 50.0) for _ in TERMS]))
def test_fit_recovers_known_coefficients(values: tuple[float, ...]) -> None:
    coef = dict(zip(TERMS, values, strict=True))
    model = fit_step_cost(exact_observations(coef))
    for term in TERMS:
        assert getattr(model, term) == pytest.approx(coef[term], rel=1e-6, abs=1e-6)
    assert model.rms_residual_ms < 1e-6
    assert model.n_observations == 7 + 4


def test_fit_is_non_negative() -> None:
    # Speculation made steps *cheaper* per drafted token: no cost can be negative, so clip.
    obs = [StepCostObservation(b, 0, 10.0 + b) for b in (1.0, 8.0)]
    obs += [StepCostObservation(b, k, 12.0 + b - 0.1 * b * k) for b in (1.0, 8.0) for k in (1, 4)]
    model = fit_step_cost(obs)
    assert all(getattr(model, t) >= 0.0 for t in TERMS)
    assert model.per_draft_token_ms == 0.0


def test_unidentifiable_terms_are_dropped() -> None:
    # Only k=1 measured: "per draft pass" cannot be told from "speculation on".
    obs = [StepCostObservation(b, 0, 10.0 + 0.5 * b) for b in (1.0, 16.0)]
    obs += [StepCostObservation(b, 1, 10.0 + 0.5 * b + 3.0 + 0.2 * b) for b in (1.0, 16.0)]
    model = fit_step_cost(obs)
    assert "per_draft_pass_ms" not in model.fitted
    assert model.per_draft_pass_ms == 0.0
    assert model.step_ms(8.0, 1) == pytest.approx(10.0 + 4.0 + 3.0 + 1.6)
    with pytest.raises(BadInputError, match="no measured cells"):
        fit_step_cost([])


def test_prediction_uses_measured_baseline_plus_modelled_extra() -> None:
    coef = dict(zip(TERMS, (15.0, 0.3, 1.5, 0.5, 1.0), strict=True))
    model = fit_step_cost(exact_observations(coef))
    alphas = (0.8, 0.6, 0.4)
    p = predict_cell(model, 8, 2, alphas, base_step_ms=20.0)
    extra = 1.5 + 0.5 * 8 * 2 + 1.0 * 2
    tokens = expected_tokens_per_step(alphas, 2)
    assert p.step_ms == pytest.approx(20.0 + extra)
    assert p.ratio == pytest.approx((20.0 + extra) / (tokens * 20.0))
    assert p.ms_per_token == pytest.approx((20.0 + extra) / tokens)
    own = predict_cell(model, 8, 2, alphas)  # without a measured baseline: the model's own
    assert own.base_step_ms == pytest.approx(15.0 + 0.3 * 8)


def test_choose_k_takes_the_lowest_ratio_and_zero_when_none_pays() -> None:
    coef = dict(zip(TERMS, (15.0, 0.3, 1.5, 0.5, 1.0), strict=True))
    model = fit_step_cost(exact_observations(coef))
    alphas = (0.8, 0.65, 0.5, 0.4, 0.3, 0.2)
    preds = predict_grid(model, {c: alphas for c in CONCURRENCIES}, 6)
    choices = choose_k(preds)
    for c in CONCURRENCIES:
        ratios = {p.k: p.ratio for p in preds if p.concurrency == c}
        best = min((k for k in ratios if k), key=ratios.__getitem__)
        assert choices[c] == (best if ratios[best] < 1 else 0)
    assert choices[1] == 3
    assert choices[64] == 0
    # Demanding a 30% gain turns the marginal concurrencies off.
    strict = choose_k(preds, min_gain=0.3)
    assert all(strict[c] <= choices[c] for c in CONCURRENCIES)
    assert strict[8] == 0
    assert strict[1] == 3


@pytest.mark.parametrize(
    ("choices", "expected"),
    [
        ({1: 3, 2: 2, 4: 0, 8: 0}, 4),
        ({1: 0, 2: 0}, 1),
        ({1: 3, 8: 0, 16: 2}, None),
        ({1: 2, 2: 0, 4: 1, 8: 0}, 8),
        ({1: 2}, None),
    ],
)
def test_break_even_concurrency(choices: dict[int, int], expected: int | None) -> None:
    assert break_even_concurrency(choices) == expected


def test_trtllm_documented_examples() -> None:
    # NVIDIA/TensorRT-LLM speculative/utils.py docstring (main): {4: 4, 8: 2, 32: 1}.
    sched = {4: 4, 8: 2, 32: 1}
    expected = {1: 4, 4: 4, 5: 2, 8: 2, 9: 1, 32: 1, 33: 0, 1000: 0}
    assert {b: draft_len_for_batch(sched, b, "up_to") for b in expected} == expected
    # 1.2.x docs: {1: 4, 4: 2, 8: 0} = bs>=1 -> 4, bs>=4 -> 2, bs>=8 -> 0.
    old = {1: 4, 4: 2, 8: 0}
    expected_old = {1: 4, 3: 4, 4: 2, 7: 2, 8: 0, 100: 0}
    assert {b: draft_len_for_batch(old, b, "from") for b in expected_old} == expected_old
    # max_concurrency=C is translated to {C: max_draft_len} on main.
    assert [draft_len_for_batch({16: 3}, b) for b in (1, 16, 17)] == [3, 3, 0]
    assert draft_len_for_batch({}, 1) == 0


def test_schedule_from_choices_examples() -> None:
    choices = {1: 4, 2: 4, 4: 3, 8: 0, 16: 0}
    assert schedule_from_choices(choices) == {2: 4, 4: 3}
    assert schedule_from_choices(choices, "from") == {1: 4, 3: 3, 5: 0}
    middle_off = {1: 4, 2: 0, 4: 2}
    assert schedule_from_choices(middle_off) == {1: 4, 2: 0, 4: 2}
    assert schedule_from_choices(middle_off, "from") == {1: 4, 2: 0, 3: 2, 5: 0}
    assert schedule_from_choices({1: 0, 8: 0}) == {}
    assert schedule_from_choices({1: 0, 8: 0}, "from") == {}


@st.composite
def choice_maps(draw: st.DrawFn) -> dict[int, int]:
    concs = draw(st.lists(st.integers(1, 256), min_size=1, max_size=9, unique=True))
    ks = draw(st.lists(st.integers(0, 8), min_size=len(concs), max_size=len(concs)))
    return capped_choices(dict(zip(sorted(concs), ks, strict=True)))


@settings(max_examples=200, deadline=None)
@given(choice_maps(), st.sampled_from(["up_to", "from"]))
def test_schedule_round_trips_at_every_batch_size(choices: dict[int, int], semantics: str) -> None:
    schedule = schedule_from_choices(choices, semantics)  # type: ignore[arg-type]
    # At each measured concurrency TensorRT-LLM applies exactly the chosen k ...
    for c, k in choices.items():
        assert draft_len_for_batch(schedule, c, semantics) == k  # type: ignore[arg-type]
    # ... and at every other batch size the documented bucket rule.
    for b in range(1, 2 * max(choices) + 3):
        applied = draft_len_for_batch(schedule, b, semantics)  # type: ignore[arg-type]
        assert applied == choice_for_batch(choices, b)
    # TensorRT-LLM's validator: keys >= 1, values >= 0, smallest key holds the largest value.
    if schedule:
        assert min(schedule) >= 1
        assert min(schedule.values()) >= 0
        assert schedule[min(schedule)] == max(schedule.values()) == choices[min(choices)] > 0
        if semantics == "from":
            assert 1 in schedule
    else:
        assert all(k == 0 for k in choices.values())


def test_unrepresentable_choices_are_refused_and_capped() -> None:
    rising = {1: 2, 4: 3, 8: 0}
    with pytest.raises(BadInputError, match="cap them first"):
        schedule_from_choices(rising)
    assert capped_choices(rising) == {1: 2, 4: 2, 8: 0}
    with pytest.raises(BadInputError, match="unknown semantics"):
        schedule_from_choices({1: 2}, "sideways")  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("choices", "gate"),
    [
        ({1: 3, 4: 3, 8: 0, 16: 0}, ConcurrencyGate(3, 4)),
        ({1: 3, 2: 3}, ConcurrencyGate(3, 2)),
        ({1: 3, 4: 2}, None),
        ({1: 3, 4: 0, 8: 3}, None),
        ({1: 0, 4: 0}, None),
    ],
)
def test_gate_from_choices(choices: dict[int, int], gate: ConcurrencyGate | None) -> None:
    assert gate_from_choices(choices) == gate
    if gate is not None:
        # The gate is the one-key schedule {max_concurrency: max_draft_len}: same per batch size.
        for b in range(1, 40):
            expected = gate.max_draft_len if b <= gate.max_concurrency else 0
            assert choice_for_batch(choices, b) == expected
            assert draft_len_for_batch(schedule_from_choices(choices), b) == expected
