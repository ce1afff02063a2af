"""Schedules written as policies (schedules.library.policy): built-ins rewritten as rules, whole programs
compared, every refusal's message, and determinism."""

from __future__ import annotations

import pytest

from schedules import (
    Action,
    Kind,
    PassTimes,
    PipelineParams,
    RankState,
    ScheduleError,
    build,
    from_policy,
    lower,
    register,
    validate,
)
from schedules import registry as registry_module
from schedules.library.looped import looped_placement
from schedules.timing import evaluate
from sim import UniformCosts, simulate

F, I, W, B = Kind.F, Kind.I, Kind.W, Kind.B  # noqa: E741  (the kinds as torch writes them)
SHAPES = [(p, m) for p in range(1, 7) for m in range(1, 3 * p + 1)]
SKEWED = PassTimes(tf=1, tb=2, tw=0.5, tcomm=0.3)
INSTANT = PassTimes(tf=0, tb=0, tw=0)  # every pass ends as it starts: the run goes in waves at t=0


# The built-ins, written as a user would: each a rule over the rank's counts, waiting (None) for what it wants.

def one_f_one_b(s: RankState) -> Action | None:
    """Forwards until pp - rank are in flight, then one backward, one forward."""
    f, b = s.count(F), s.count(B)
    if f < s.num_microbatches and f - b < s.pp - s.rank:
        return s.first(F)
    return s.first(B)


def zb_h1(s: RankState) -> Action | None:
    """1F1B with I for B; rank r keeps r weight gradients (W) back and runs them at the end."""
    f, i, w = s.count(F), s.count(I), s.count(W)
    m = s.num_microbatches
    if i - w > s.rank or i == m:
        return s.first(W)
    if f < m and f - i < s.pp - s.rank:
        return s.first(F)
    return s.first(I)


def gpipe(s: RankState) -> Action | None:
    """Every forward, then every backward."""
    return s.first(F) if s.count(F) < s.num_microbatches else s.first(B)


def interleaved(s: RankState) -> Action | None:
    """Interleaved 1F1B: chunk passes in rounds of pp, (v-1)pp + 2(pp-1-rank) warm-up forwards."""
    p, v, r = s.pp, s.num_stages // s.pp, s.rank
    total = s.num_microbatches * v
    f, b = s.count(F), s.count(B)
    warmup = min((v - 1) * p + 2 * (p - 1 - r), total)
    kind, k = (F, f) if f < total and f - b <= warmup else (B, b)
    chunk = (k // p) % v
    stage = ((v - 1 - chunk) if kind is B else chunk) * p + r
    want = Action(kind, stage, (k // (p * v)) * p + k % p)
    return want if want in s.ready else None


def backward_first(s: RankState) -> Action | None:
    """Greedy: any ready backward, else the oldest ready forward."""
    return s.first(B) or s.first(F)


def forward_first(s: RankState) -> Action | None:
    return s.first(F) or s.first(B)


def forward_first_within_limit(s: RankState) -> Action | None:
    """Greedy: the oldest ready forward that fits the memory limit, else the oldest ready backward (I, W or B)."""
    return next((a for a in s.ready if a.kind is F and s.fits(a)), None) or \
        next((a for a in s.ready if a.kind is not F), None)


def forwards_only(s: RankState) -> Action | None:
    return s.first(F)


def params(p: int, m: int) -> PipelineParams:
    return PipelineParams(pp=p, microbatches=m)


# Built-ins as policies: the same programs, action for action.

@pytest.mark.parametrize(("p", "m"), SHAPES)
@pytest.mark.parametrize("times", [None, SKEWED, PassTimes(tw=0, tcomm=1), INSTANT],
                         ids=["unit", "skewed", "free-w", "instant"])
def test_1f1b_gpipe_and_zb_h1_as_policies_equal_the_built_ins(p, m, times):
    for name, policy, split in [("1f1b", one_f_one_b, False), ("gpipe", gpipe, False), ("zb-h1", zb_h1, True)]:
        mine = from_policy(name, params(p, m), policy, split_backward=split, times=times)
        built = build(name, pp=p, microbatches=m)
        assert mine.programs == built.programs, (name, p, m)
        assert (mine.stage_to_rank, mine.num_stages, mine.num_microbatches) == \
            (built.stage_to_rank, built.num_stages, built.num_microbatches)


@pytest.mark.parametrize(("p", "v", "m"), [(2, 2, 2), (2, 2, 4), (3, 2, 6), (4, 2, 8), (4, 3, 8), (2, 4, 6)])
def test_interleaved_1f1b_as_a_policy_on_the_looped_placement(p, v, m):
    mine = from_policy("interleaved-1f1b", PipelineParams(pp=p, microbatches=m, chunks=v), interleaved,
                       placement=looped_placement(p, v))
    built = build("interleaved-1f1b", pp=p, microbatches=m, chunks=v)
    assert mine.programs == built.programs
    assert mine.stage_to_rank == built.stage_to_rank and mine.params["chunks"] == v


def test_the_params_record_the_policy_and_the_limit():
    s = from_policy("mine", params(4, 8), forward_first_within_limit, mem_limit=2)
    assert dict(s.params) == {"pp": 4, "microbatches": 8, "chunks": 1, "policy": "forward_first_within_limit",
                              "mem_limit": 2}
    assert dict(from_policy("mine", params(2, 2), gpipe).params) == {"pp": 2, "microbatches": 2, "chunks": 1,
                                                                    "policy": "gpipe"}


def test_a_registered_policy_builds_lowers_validates_and_simulates(monkeypatch):
    monkeypatch.setattr(registry_module, "_REGISTRY", dict(registry_module._REGISTRY))  # undone after the test

    @register("policy-1f1b")
    def policy_1f1b(params: PipelineParams):
        """1F1B written as a policy."""
        return from_policy("policy-1f1b", params, one_f_one_b)

    s = build("policy-1f1b", pp=4, microbatches=8)
    assert s.name == "policy-1f1b" and s.programs == build("1f1b", pp=4, microbatches=8).programs
    graph = validate(lower(s))
    result = simulate(graph, UniformCosts())
    assert result.makespan == 33  # (m + p - 1)(tf + tb + tw), 1F1B's
    assert result.bubble_ratio == simulate(lower(build("1f1b", pp=4, microbatches=8)), UniformCosts()).bubble_ratio


# Readiness follows the pass times: a greedy rule gives different orders under different times.

def test_a_greedy_policy_follows_the_pass_times():
    unit = from_policy("greedy", params(2, 4), backward_first)
    assert unit.to_text() == "0F0,0F1,0F2,0F3,0B0,0B1,0B2,0B3\n1F0,1B0,1F1,1B1,1F2,1B2,1F3,1B3\n"
    # tf=2, B=1: 0B0 arrives at t=5, while 0F2 runs (4..6), so it runs before 0F3
    slow_forward = from_policy("greedy", params(2, 4), backward_first, times=PassTimes(tf=2, tb=0.5, tw=0.5))
    assert slow_forward.to_text() == "0F0,0F1,0F2,0B0,0F3,0B1,0B2,0B3\n1F0,1B0,1F1,1B1,1F2,1B2,1F3,1B3\n"
    # instant passes: each wave of ends readies the next; in the fifth, rank 1 has 1B0 and 1F3 ready and runs 1B0
    instant = from_policy("greedy", params(3, 4), backward_first, times=INSTANT)
    assert instant.to_text() == ("0F0,0F1,0F2,0F3,0B0,0B1,0B2,0B3\n1F0,1F1,1F2,1B0,1F3,1B1,1B2,1B3\n"
                                 "2F0,2B0,2F1,2B1,2F2,2B2,2F3,2B3\n")
    validate(instant)


def test_a_policy_that_asks_fits_stays_within_the_limit():
    for limit in (1, 2, 3):
        s = from_policy("capped", params(4, 8), forward_first_within_limit, mem_limit=limit)
        assert max(evaluate(s, 1, 1, 1).peaks) == limit
        validate(s)
    assert from_policy("capped", params(3, 4), forward_first_within_limit, mem_limit=1).to_text() == \
        "0F0,0B0,0F1,0B1,0F2,0B2,0F3,0B3\n1F0,1B0,1F1,1B1,1F2,1B2,1F3,1B3\n2F0,2B0,2F1,2B1,2F2,2B2,2F3,2B3\n"


def test_split_backward_counts_what_w_holds():
    """With mw = 0.5 an I leaves half a microbatch for its W: two forwards fit 1.5 M_B only after a W."""
    s = from_policy("zb", params(1, 3), forward_first_within_limit, split_backward=True, mem_limit=1.5, times=PassTimes(mw=0.5))
    assert s.to_text() == "0F0,0I0,0F1,0W0,0I1,0F2,0W1,0I2,0W2\n"
    assert max(evaluate(s, 1, 1, 1, mw=0.5).peaks) == 1.5


# Every refusal: one line naming the schedule, rank and action, and what would be valid.

def refusal(policy, *, p=2, m=2, **kw) -> str:
    with pytest.raises(ScheduleError) as e:
        from_policy("mine", params(p, m), policy, **kw)
    message = str(e.value)
    assert "\n" not in message
    return message


def test_an_action_that_is_not_ready_names_what_it_waits_for():
    assert refusal(lambda s: Action(B, 0, 0)) == (
        "schedule 'mine', rank 0, action 0B0: the policy <lambda> chose it at step 0 (t=0), but it is not ready: "
        "it needs 0F0, not run yet; valid: 0F0, 0F1 or None (wait)")

    def ahead(s):  # rank 1 asks for microbatch 1 while rank 0 still runs its forward
        return Action(F, 1, 1) if s.rank == 1 else s.first(F)

    assert refusal(ahead) == (
        "schedule 'mine', rank 1, action 1F1: the policy ahead chose it at step 0 (t=1), but it is not ready: it needs 0F1, still running; "
        "valid: 1F0 or None (wait)")

    def early(s):
        return Action(F, 1, 1) if s.rank == 1 else s.first(F)

    assert refusal(early, times=PassTimes(tcomm=1)).endswith(
        "action 1F1: the policy early chose it at step 0 (t=2), but it is not ready: its inputs arrive at t=3; valid: 1F0 or None (wait)")


def test_an_action_of_another_rank_or_already_run_or_not_in_the_schedule():
    assert refusal(lambda s: Action(F, 1, 0)) == (
        "schedule 'mine', rank 0, action 1F0: the policy <lambda> chose it at step 0 (t=0), but it is rank 1's "
        "(stage 1 is placed there); valid: 0F0, 0F1 or None (wait)")
    assert refusal(lambda s: s.done[0] if s.done else s.first(F)) == (
        "schedule 'mine', rank 0, action 0F0: the policy <lambda> chose it at step 1 (t=1), but it already ran "
        "(step 0); valid: 0F1 or None (wait)")
    assert refusal(lambda s: Action(I, 0, 0)) == (
        "schedule 'mine', rank 0, action 0I0: the policy <lambda> chose it at step 0 (t=0), but it is not work "
        "of this schedule (kinds F, B, stages 0..1, microbatches 0..1); valid: 0F0, 0F1 or None (wait)")
    assert refusal(lambda s: Action(B, 0, 0), split_backward=True).endswith(
        "it is not work of this schedule (kinds F, I, W, stages 0..1, microbatches 0..1); "
        "valid: 0F0, 0F1 or None (wait)")
    assert "action 0F5: " in refusal(lambda s: Action(F, 0, 5))
    assert refusal(lambda s: "0F0") == (
        "schedule 'mine', rank 0: the policy <lambda> returned '0F0' at step 0 (t=0), not an Action; "
        "valid: 0F0, 0F1 or None (wait)")


def test_passing_the_memory_limit_names_rank_action_and_the_held_amount():
    assert refusal(forward_first, m=4, mem_limit=2) == (
        "schedule 'mine', rank 0, action 0F2: the policy forward_first chose it at step 2 (t=2), but it would "
        "hold 2 + 1 = 3 M_B, above mem_limit 2 M_B; valid: None (state.fits says which fit)")
    # one rank holding 0F0 is offered 0B0 and 0F1: the backward is what fits
    assert refusal(forward_first, p=1, mem_limit=1) == (
        "schedule 'mine', rank 0, action 0F1: the policy forward_first chose it at step 1 (t=1), but it would "
        "hold 1 + 1 = 2 M_B, above mem_limit 1 M_B; valid: 0B0 or None (state.fits says which fit)")


def test_a_deadlock_names_each_waiting_ranks_missing_dependency():
    assert refusal(forwards_only) == (
        "schedule 'mine': the policy forwards_only deadlocks at t=3, every rank waiting and nothing in flight "
        "with 4 actions left: rank 0 waits for 0B0: it needs 1B0, not run yet; rank 1 has 1B0, 1B1 ready but "
        "its policy returned None")


def test_a_policy_that_raises_is_named_with_rank_and_step_and_kept_as_the_cause():
    def broken(s):
        if s.rank == 1:
            raise KeyError("no such\nthing")
        return s.first(F)

    with pytest.raises(ScheduleError) as e:
        from_policy("mine", params(2, 2), broken)
    assert str(e.value) == ("schedule 'mine', rank 1: the policy broken raised KeyError at step 0 (t=1): "
                            "'no such\\nthing'")
    assert isinstance(e.value.__cause__, KeyError)


def test_bad_inputs_are_refused_before_the_run():
    with pytest.raises(ScheduleError, match=r"^schedule 'mine': mem_limit must be a finite number > 0 \(M_B\), "
                                            r"got 0$") as e:
        from_policy("mine", params(2, 2), gpipe, mem_limit=0)
    assert e.value.field == "mem_limit"
    with pytest.raises(ScheduleError, match=r"^schedule 'mine': placement places 3 stage\(s\); with pp=2 and "
                                            r"chunks=1 give one rank for each of 2 stages$"):
        from_policy("mine", params(2, 2), gpipe, placement=(0, 1, 1))
    with pytest.raises(ScheduleError, match=r"^schedule 'mine': placement puts 2 stage\(s\) on rank 0; give every "
                                            r"rank 1 \(chunks=1\), ranks 0..1$"):
        from_policy("mine", params(2, 2), gpipe, placement=(0, 0))
    with pytest.raises(ScheduleError, match=r"^schedule 'mine': times must be a PassTimes, got \{'tf': 1\}$"):
        from_policy("mine", params(2, 2), gpipe, times={"tf": 1})
    with pytest.raises(ScheduleError, match=r"^schedule 'mine': policy must be a function"):
        from_policy("mine", params(2, 2), "gpipe")
    with pytest.raises(ScheduleError, match=r"^tcomm must be a finite time >= 0, got -1$"):
        PassTimes(tcomm=-1)


# Determinism: the same policy sees the same states, in the same order, and makes the same schedule.

def test_the_same_policy_gives_the_same_run():
    def run() -> tuple[list[RankState], object]:
        seen: list[RankState] = []

        def watched(s: RankState) -> Action | None:
            seen.append(s)
            return backward_first(s)

        return seen, from_policy("mine", params(4, 8), watched, times=SKEWED)

    (seen1, s1), (seen2, s2) = run(), run()
    assert s1 == s2 and seen1 == seen2
    asked = [(s.time, s.rank) for s in seen1]
    assert asked == sorted(asked)  # in time order, ranks in order at one instant
    assert all(s.ready for s in seen1)  # a rank with nothing ready is not asked
