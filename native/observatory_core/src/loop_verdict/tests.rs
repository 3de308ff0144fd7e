//! One test per rule and threshold, on hand-made keys. The labelled scenarios, on real
//! envelopes, are in `scenarios.rs`.

use super::*;
use proptest::prelude::*;

/// A step: call `c`, outcome `o`, with a result, failed or not.
fn step(c: u64, o: u64, failure: bool) -> StepKeys {
    StepKeys::exact(c, o, true, failure)
}

fn ok(c: u64, o: u64) -> StepKeys {
    step(c, o, false)
}

fn fail(c: u64, o: u64) -> StepKeys {
    step(c, o, true)
}

/// Runs the steps with the default config and no entropy signal; all verdicts.
fn run(steps: &[StepKeys]) -> Vec<Verdict> {
    run_with(steps, &Config::default())
}

fn run_with(steps: &[StepKeys], config: &Config) -> Vec<Verdict> {
    let mut state = VerdictState::new();
    steps
        .iter()
        .map(|&s| state.observe(s, None, config))
        .collect()
}

/// The rules of issues 8 and 11 alone: no near-identical calls, no failure runs, no
/// revisits. Their tests isolate one rule each; `e_`, `f_` and `g_` tests cover the
/// others, and `defaults_` tests how they play together.
fn classic() -> Config {
    Config {
        near_share: 100,
        failure_run_suspect: u32::MAX,
        failure_run_loop: None,
        revisit_suspect: u32::MAX,
        revisit_loop: None,
        ..Config::default()
    }
}

fn run_classic(steps: &[StepKeys]) -> Vec<Verdict> {
    run_with(steps, &classic())
}

fn levels(verdicts: &[Verdict]) -> Vec<Level> {
    verdicts.iter().map(|v| v.level).collect()
}

use Level::{Loop, Progress, Suspect};

#[test]
fn first_step_is_progress_with_no_rule() {
    let v = run(&[ok(1, 1)]);
    assert_eq!(
        (v[0].level, v[0].rule, v[0].step, v[0].previous),
        (Progress, Rule::None, 1, None)
    );
    assert_eq!(v[0].reason, Reason::NoRepetition { steps: 1 });
    assert!(v[0].evidence.as_slice().is_empty());
}

#[test]
fn a_same_call_same_outcome_is_suspect_at_2_and_loop_at_3() {
    let v = run(&[ok(9, 9), fail(1, 5), fail(1, 5), fail(1, 5), fail(1, 5)]);
    assert_eq!(levels(&v), [Progress, Progress, Suspect, Loop, Loop]);
    assert_eq!(v[3].rule, Rule::Repeat);
    assert_eq!(
        v[3].reason,
        Reason::Repeated {
            times: 3,
            blank: false
        }
    );
    assert_eq!(v[3].evidence.as_slice(), [2, 3, 4]);
    assert_eq!(v[4].evidence.as_slice(), [2, 3, 4, 5]);
    assert_eq!((v[3].previous, v[4].previous), (Some(Suspect), Some(Loop)));
}

#[test]
fn a_same_call_with_a_changing_outcome_is_progress() {
    let v = run(&[ok(1, 10), ok(1, 20), ok(1, 40), ok(1, 80)]);
    assert_eq!(levels(&v), [Progress; 4]);
    assert_eq!(v[3].rule, Rule::Repeat);
    assert_eq!(v[3].reason, Reason::Polling { times: 4 });
    assert_eq!(v[3].evidence.as_slice(), [1, 2, 3, 4]);
}

#[test]
fn a_counts_only_the_latest_identical_outcomes() {
    // A stalled poll (20, 20) is suspect; moving again (30) is progress.
    let v = run(&[ok(1, 10), ok(1, 20), ok(1, 20), ok(1, 30)]);
    assert_eq!(levels(&v), [Progress, Progress, Suspect, Progress]);
}

#[test]
fn a_thresholds_are_configurable() {
    let config = Config {
        repeat_suspect: 3,
        repeat_loop: 5,
        ..classic()
    };
    let v = run_with(&[fail(1, 1); 5], &config);
    assert_eq!(levels(&v), [Progress, Progress, Suspect, Suspect, Loop]);
}

#[test]
fn b_alternation_with_the_same_outcomes_is_a_cycle() {
    // edit → ok, build → the same failure, again and again.
    let v = run_classic(&[
        ok(1, 1),
        fail(2, 2),
        ok(1, 1),
        fail(2, 2),
        ok(1, 1),
        fail(2, 2),
    ]);
    assert_eq!(
        levels(&v),
        [Progress, Progress, Progress, Suspect, Suspect, Loop]
    );
    assert_eq!(v[5].rule, Rule::Cycle);
    assert_eq!(
        v[5].reason,
        Reason::Cycle {
            period: 2,
            blocks: 3
        }
    );
    assert_eq!(v[5].evidence.as_slice(), [1, 2, 3, 4, 5, 6]);
}

#[test]
fn b_a_three_call_cycle_loops_on_its_third_round() {
    let round = [ok(1, 1), ok(2, 2), fail(3, 3)];
    let steps: Vec<_> = round.iter().cycle().take(9).copied().collect();
    let v = run_classic(&steps);
    assert_eq!(levels(&v)[..5], [Progress; 5]);
    assert_eq!(levels(&v)[5..], [Suspect, Suspect, Suspect, Loop]);
    assert_eq!(
        v[8].reason,
        Reason::Cycle {
            period: 3,
            blocks: 3
        }
    );
}

#[test]
fn b_cycles_up_to_max_period_only() {
    let round: Vec<_> = (1..=6).map(|c| ok(c, c)).collect();
    let steps: Vec<_> = round.iter().cycle().take(18).copied().collect();
    assert!(levels(&run_classic(&steps)).iter().all(|&l| l == Progress));
    let config = Config {
        max_period: 6,
        history: 18,
        ..classic()
    };
    assert_eq!(*levels(&run_with(&steps, &config)).last().unwrap(), Loop);
}

#[test]
fn b_a_cycle_whose_outcomes_change_is_progress() {
    // sleep → ok, poll → 10 %, 40 %, 80 %: the poll moves.
    let v = run_classic(&[
        ok(1, 1),
        ok(2, 10),
        ok(1, 1),
        ok(2, 40),
        ok(1, 1),
        ok(2, 80),
    ]);
    assert_eq!(levels(&v), [Progress; 6]);
    assert_eq!(
        v[5].reason,
        Reason::CycleProgress {
            period: 2,
            blocks: 3
        }
    );
    // The build gets further each round: progress even on the edit steps.
    let v = run_classic(&[ok(1, 1), fail(2, 21), ok(1, 1), fail(2, 22), ok(1, 1)]);
    assert_eq!(levels(&v), [Progress; 5]);
}

#[test]
fn a_a_flapping_result_says_nothing_new() {
    // The same call answered X, Y, X, Y: from the third answer on, nothing that call
    // had not already said.
    let v = run(&[
        ok(1, 10),
        ok(1, 20),
        ok(1, 10),
        ok(1, 20),
        ok(1, 10),
        ok(1, 20),
    ]);
    assert_eq!(levels(&v), [Progress, Progress, Suspect, Loop, Loop, Loop]);
    assert_eq!(
        v[3].reason,
        Reason::Repeated {
            times: 3,
            blank: false
        }
    );
    // Once the answer moves on, progress again.
    let mut steps = vec![ok(1, 10), ok(1, 20), ok(1, 10), ok(1, 20)];
    steps.push(ok(1, 30));
    assert_eq!(run(&steps)[4].level, Progress);
}

#[test]
fn a_blank_results_need_more_repeats() {
    // `cd ..` three times says nothing either way: suspect, not yet a loop.
    let blank = |c| StepKeys::exact(c, 5, false, false);
    let v = run(&[blank(1), blank(1), blank(1), blank(1)]);
    assert_eq!(levels(&v), [Progress, Suspect, Suspect, Loop]);
    assert_eq!(
        v[3].reason,
        Reason::Repeated {
            times: 4,
            blank: true
        }
    );
    // With an informative result, the third call is already a loop.
    assert_eq!(run(&[ok(1, 5); 3])[2].level, Loop);
}

#[test]
fn a_a_failure_whose_lines_are_all_known_is_stale() {
    // The same failing call, its result another mix of lines already seen (stderr and
    // stdout interleaved differently): not progress.
    let mut a = fail(1, 100);
    let mut b = fail(1, 200);
    let mut c = fail(1, 300);
    let mut lines = shape::LineSketch::single(1);
    lines.union_with(&shape::LineSketch::single(2));
    for k in [&mut a, &mut b, &mut c] {
        k.lines = lines;
    }
    assert_eq!(levels(&run(&[a, b, c])), [Progress, Suspect, Loop]);
    // A successful result whose numbers all changed (same skeleton) is progress.
    let numbers = |text: String| {
        shape::shape("success", text.as_bytes(), &mut shape::Scratch::default()).numbers
    };
    let poll = |o: u64| StepKeys {
        skeleton: 9,
        lines,
        numbers: numbers(format!("\"{o}\"")),
        ..ok(1, o)
    };
    assert_eq!(levels(&run(&[poll(1), poll(2), poll(3)])), [Progress; 3]);
    // One number of eight changed (a timing in a long log) is a detail.
    let long = |o: u64| StepKeys {
        numbers: numbers(format!("\"1 2 3 4 5 6 7 {o}\"")),
        ..poll(o)
    };
    assert_eq!(
        levels(&run(&[long(1), long(2), long(3)])),
        [Progress, Suspect, Loop]
    );
}

#[test]
fn b_the_smallest_period_wins() {
    let v = run(&[ok(1, 1); 4]);
    assert_eq!(v[3].rule, Rule::Repeat);
    // A A B A A B: period 3.
    let v = run_classic(&[ok(1, 1), ok(1, 1), ok(2, 2), ok(1, 1), ok(1, 1), ok(2, 2)]);
    assert_eq!(
        v[5].reason,
        Reason::Cycle {
            period: 3,
            blocks: 2
        }
    );
}

/// The same-failure rule with a loop threshold (off by default).
fn failure_loop_at(n: u32) -> Config {
    Config {
        failure_loop: Some(n),
        ..classic()
    }
}

#[test]
fn c_the_same_failure_under_different_calls() {
    // Four different calls, the same "permission denied": suspect by default.
    let steps = [fail(1, 7), fail(2, 7), fail(3, 7), fail(4, 7)];
    let v = run_classic(&steps);
    assert_eq!(levels(&v), [Progress, Progress, Suspect, Suspect]);
    assert_eq!(v[3].rule, Rule::SameFailure);
    assert_eq!(v[3].reason, Reason::SameFailure { calls: 4 });
    assert_eq!(v[3].evidence.as_slice(), [1, 2, 3, 4]);
    // With a loop threshold, a loop.
    let v = run_with(&steps, &failure_loop_at(4));
    assert_eq!(levels(&v), [Progress, Progress, Suspect, Loop]);
}

#[test]
fn c_counts_distinct_calls_within_the_history_and_ignores_successes() {
    // The same failing call twice counts once; a success in between does not reset it.
    let v = run_classic(&[
        fail(1, 7),
        fail(1, 7),
        ok(9, 9),
        fail(2, 7),
        ok(8, 8),
        fail(3, 7),
    ]);
    assert_eq!(v[5].level, Suspect);
    assert_eq!(v[5].evidence.as_slice(), [2, 4, 6]);
    // Identical *successes* under different calls (ten different writes → "ok") are not failures.
    let writes: Vec<_> = (1..=10).map(|c| ok(c, 1)).collect();
    assert!(levels(&run(&writes)).iter().all(|&l| l == Progress));
    // Out of the history, out of the count.
    let config = Config {
        history: 3,
        ..classic()
    };
    let v = run_with(
        &[fail(1, 7), fail(2, 7), ok(9, 9), fail(3, 7), fail(4, 7)],
        &config,
    );
    assert_eq!(v[4].level, Progress);
}

#[test]
fn c_needs_a_result() {
    let no_result = |c| StepKeys::exact(c, 7, false, true);
    let v = run(&[no_result(1), no_result(2), no_result(3), no_result(4)]);
    assert!(levels(&v).iter().all(|&l| l == Progress));
}

#[test]
fn strongest_rule_wins() {
    // The poll moves (a: progress), but four different calls fail the same way (c: loop).
    let v = run_with(
        &[fail(1, 7), fail(2, 7), fail(3, 7), fail(4, 3), fail(4, 7)],
        &failure_loop_at(4),
    );
    assert_eq!(v[4].level, Loop);
    assert_eq!(v[4].rule, Rule::SameFailure);
}

fn entropy(severity: Severity, window: usize) -> Option<EntropySignal> {
    Some(EntropySignal { severity, window })
}

#[test]
fn d_low_entropy_explained_by_different_calls_or_results_is_progress() {
    let mut state = VerdictState::new();
    let config = Config::default();
    let mut last = None;
    for c in 1..=8 {
        last = Some(state.observe(ok(c, 100 + c), entropy(Severity::Loop, 5), &config));
    }
    let v = last.unwrap();
    assert_eq!((v.level, v.rule), (Progress, Rule::Entropy));
    assert_eq!(v.reason, Reason::EntropyExplained { window: 5 });
}

#[test]
fn d_low_entropy_with_repeated_pairs_is_suspect_never_loop() {
    // A B A C A: no run, no cycle, no failure, but A → 1 three times.
    let mut state = VerdictState::new();
    let config = classic();
    let steps = [ok(1, 1), ok(2, 2), ok(1, 1), ok(3, 3), ok(1, 1)];
    let v: Vec<_> = steps
        .iter()
        .map(|&s| state.observe(s, entropy(Severity::Loop, 5), &config))
        .collect();
    assert_eq!((v[4].level, v[4].rule), (Suspect, Rule::Entropy));
    assert_eq!(v[4].evidence.as_slice(), [1, 3, 5]);
}

#[test]
fn d_is_silent_when_normal_off_or_overruled() {
    let config = Config::default();
    let mut state = VerdictState::new();
    let v = state.observe(ok(1, 1), entropy(Severity::Normal, 1), &config);
    assert_eq!(v.rule, Rule::None);
    let off = Config {
        entropy: false,
        ..Config::default()
    };
    let mut state = VerdictState::new();
    state.observe(ok(1, 1), None, &off);
    state.observe(ok(2, 2), None, &off);
    let v = state.observe(ok(1, 1), entropy(Severity::Loop, 3), &off);
    assert_eq!(v.rule, Rule::None);
    // A moving poll under entropy LOOP: rule (a)'s progress stands, (d) is not asked.
    let mut state = VerdictState::new();
    let v = (0..5)
        .map(|i| state.observe(ok(1, i), entropy(Severity::Loop, 5), &config))
        .last()
        .unwrap();
    assert_eq!((v.level, v.rule), (Progress, Rule::Repeat));
}

#[test]
fn history_is_bounded_and_can_shrink_at_run_time() {
    let mut state = VerdictState::new();
    let config = Config::default();
    for c in 0..100 {
        state.observe(ok(c, c), None, &config);
    }
    assert_eq!(state.ring.len(), config.history);
    assert_eq!(state.steps(), 100);
    let small = Config {
        history: 4,
        ..Config::default()
    };
    state.observe(ok(1000, 1), None, &small);
    assert_eq!(state.ring.len(), 4);
    // A loop longer than the history is still seen as a run that fits in it.
    let v = (0..6)
        .map(|_| state.observe(fail(5, 5), None, &small))
        .last()
        .unwrap();
    assert_eq!(
        (v.level, v.evidence.as_slice()),
        (Loop, &[104, 105, 106, 107][..])
    );
}

#[test]
fn evidence_keeps_the_most_recent_steps() {
    let config = Config {
        history: 40,
        ..Config::default()
    };
    let v = run_with(&[fail(1, 1); 30], &config);
    assert_eq!(v[29].evidence.as_slice(), (15..=30).collect::<Vec<_>>());
}

#[test]
fn last_and_reset() {
    let mut state = VerdictState::new();
    let config = Config::default();
    for _ in 0..3 {
        state.observe(fail(1, 1), None, &config);
    }
    assert_eq!(state.last().unwrap().level, Loop);
    state.reset();
    assert!(state.last().is_none());
    assert_eq!(state.observe(fail(1, 1), None, &config).level, Progress);
}

#[test]
fn reasons_read_as_sentences() {
    let cases = [
        (
            Reason::NoRepetition { steps: 4 },
            "no repeated call pattern in the last 4 steps",
        ),
        (
            Reason::Repeated {
                times: 3,
                blank: false,
            },
            "the same call 3 times in a row, its result saying nothing new",
        ),
        (
            Reason::Repeated {
                times: 4,
                blank: true,
            },
            "the same call 4 times in a row, each time with an empty result",
        ),
        (
            Reason::Cycle {
                period: 2,
                blocks: 3,
            },
            "a cycle of 2 calls repeated 3 times with the same results",
        ),
        (
            Reason::SameFailure { calls: 4 },
            "4 different calls failed with the same result",
        ),
    ];
    for (reason, text) in cases {
        assert_eq!(reason.to_string(), text);
    }
    assert_eq!(Level::Suspect.as_str(), "suspect");
    assert_eq!(Rule::SameFailure.as_str(), "same_failure");
}

#[test]
fn a_kept_sentence_is_the_written_one() {
    // Every history a session can keep, each its own sentence, written as Display
    // writes it; past the longest history, and for a finding, nothing is kept.
    for steps in 0..=MAX_HISTORY {
        let reason = Reason::NoRepetition { steps };
        assert_eq!(reason.kept_sentence(), Some(reason.to_string().as_str()));
    }
    assert_eq!(
        Reason::NoRepetition { steps: 7 }.kept_sentence(),
        Some("no repeated call pattern in the last 7 steps")
    );
    assert_eq!(
        Reason::NoRepetition { steps: 1 }.kept_sentence(),
        Some("the session's first step: nothing to compare yet")
    );
    let past = Reason::NoRepetition {
        steps: MAX_HISTORY + 1,
    };
    assert_eq!(past.kept_sentence(), None);
    assert_eq!(Reason::Polling { times: 3 }.kept_sentence(), None);
}

#[test]
fn invalid_configs_are_refused() {
    let ok = Config::default();
    assert_eq!(ok.validate(), Ok(()));
    let bad = [
        Config { history: 1, ..ok },
        Config {
            history: MAX_HISTORY + 1,
            ..ok
        },
        Config {
            max_period: 0,
            ..ok
        },
        Config {
            max_period: MAX_PERIOD + 1,
            ..ok
        },
        Config {
            repeat_suspect: 1,
            ..ok
        },
        Config {
            repeat_loop: 1,
            ..ok
        },
        Config {
            cycle_suspect: 4,
            ..ok
        },
        Config {
            failure_suspect: 5,
            failure_loop: Some(4),
            ..ok
        },
        Config {
            failure_suspect: 1,
            ..ok
        },
        Config {
            blank_repeat_loop: 1,
            ..ok
        },
    ];
    for config in bad {
        assert_eq!(
            config.validate(),
            Err(Error::InvalidVerdictConfig),
            "{config:?}"
        );
    }
    // suspect == loop: no suspect stage.
    let v = run_with(
        &[fail(1, 1); 3],
        &Config {
            repeat_suspect: 3,
            ..ok
        },
    );
    assert_eq!(levels(&v), [Progress, Progress, Loop]);
}

proptest! {
    /// A session of all-distinct calls with all-distinct results is never a loop, and
    /// never even suspect, whatever the entropy tracker says.
    #[test]
    fn distinct_calls_with_distinct_results_are_never_flagged(
        n in 1usize..80,
        failures in prop::collection::vec(any::<bool>(), 80),
        severities in prop::collection::vec(0u8..3, 80),
    ) {
        let mut state = VerdictState::new();
        let config = Config::default();
        for i in 0..n {
            let severity = [Severity::Normal, Severity::Warning, Severity::Loop][usize::from(severities[i])];
            let v = state.observe(step(i as u64, 1000 + i as u64, failures[i]), entropy(severity, 5), &config);
            prop_assert_eq!(v.level, Progress);
        }
    }

    /// Any session's verdicts: evidence is sorted, within the steps seen, at most
    /// MAX_EVIDENCE; `previous` is the previous step's level; step numbers count up.
    #[test]
    fn verdicts_are_well_formed(
        steps in prop::collection::vec((0u64..4, 0u64..4, any::<bool>(), any::<bool>()), 1..60),
        history in 2usize..20,
        max_period in 1usize..6,
    ) {
        let config = Config { history, max_period, ..Config::default() };
        let mut state = VerdictState::new();
        let mut previous = None;
        for (i, &(c, o, has_result, failure)) in steps.iter().enumerate() {
            let v = state.observe(StepKeys::exact(c, o, has_result, failure), entropy(Severity::Warning, 5), &config);
            prop_assert_eq!(v.step as usize, i + 1);
            prop_assert_eq!(v.previous, previous);
            let ev = v.evidence.as_slice();
            prop_assert!(ev.len() <= MAX_EVIDENCE);
            prop_assert!(ev.windows(2).all(|w| w[0] < w[1]));
            prop_assert!(ev.iter().all(|&s| s >= 1 && s as usize <= i + 1));
            // Within the history, or the earlier step a revisit in it repeated.
            prop_assert!(ev.iter().all(|&s| (i + 1) - (s as usize) < 2 * history));
            prop_assert_eq!(v.level == Progress, v.level < Suspect);
            if v.level > Progress { prop_assert!(!ev.is_empty()); }
            previous = Some(v.level);
        }
    }

    /// The runs kept as the steps come agree with counting them in the history.
    #[test]
    fn runs_kept_step_by_step_agree_with_the_history(
        steps in prop::collection::vec((0u64..3, 0u64..3, any::<bool>(), any::<bool>(), 0u64..4), 1..80),
        shrink_at in 0usize..80,
    ) {
        let mut state = VerdictState::new();
        for (i, &(c, o, failure, blank, shape)) in steps.iter().enumerate() {
            let history = if i >= shrink_at { 6 } else { 32 };
            let config = Config { history, ..Config::default() };
            let mut keys = shaped(c, shape, o, failure);
            keys.blank = blank;
            state.observe(keys, None, &config);
            let ring = &state.ring;
            let newest = ring.back().unwrap();
            let same = ring.iter().rev().take_while(|e| e.call == newest.call).count();
            let stale = ring.iter().rev().take_while(|e| e.stale).count().min(same - 1);
            prop_assert_eq!((state.same_run as usize).min(ring.len()), same);
            prop_assert_eq!((state.stale_run as usize).min(same - 1), stale);
            if stale == state.stale_run as usize {
                prop_assert_eq!(state.stale_blank, ring.iter().rev().take(stale + 1).all(|e| e.blank));
            }
            prop_assert_eq!(state.outcomes.iter().copied().collect::<Vec<_>>(),
                            ring.iter().map(|e| fold(e.outcome)).collect::<Vec<_>>());
        }
    }

    /// The same call with the same outcome forever ends as a loop.
    #[test]
    fn a_pure_repeat_always_ends_as_a_loop(n in 3usize..30, c in any::<u64>(), o in any::<u64>(), failure in any::<bool>()) {
        let v = run(&vec![step(c, o, failure); n]);
        prop_assert_eq!(v.last().unwrap().level, Loop);
    }
}

#[test]
fn a_history_entry_is_forty_bytes_and_its_outcome_four_more() {
    // Three hashes, two folded to 32 bits (what cycles compare, the exact result), the
    // tool's 16-bit hash, the call's wording in 8 bits, how far back a revisit reaches
    // and four flags, and the outcome again (32 bits) in the ring rule (g) scans: what
    // a session pays per step kept.
    assert_eq!(std::mem::size_of::<Entry>(), 40);
}

#[test]
fn a_a_repeat_below_the_suspect_threshold_is_progress_but_says_why() {
    // repeat_suspect 3: the second identical answer is not yet suspect, and the reason
    // does not claim the result moved.
    let config = Config {
        repeat_suspect: 3,
        repeat_loop: 4,
        ..Config::default()
    };
    let v = run_with(&[ok(1, 5), ok(1, 5)], &config);
    assert_eq!(v[1].level, Progress);
    assert_eq!(
        v[1].reason,
        Reason::Repeated {
            times: 2,
            blank: false
        }
    );
}

// Issue 26: stuck, not only repeating. Rules (e) near-identical calls in a row, (f) the
// same error in a row, (g) revisits.

/// Call `c` of tool 1 whose input shape (its set of words) is `shape`: shapes sharing
/// most of their bits are nearly identical inputs.
fn shaped(c: u64, shape: u64, o: u64, failure: bool) -> StepKeys {
    StepKeys {
        tool: 1,
        shape,
        ..step(c, o, failure)
    }
}

/// A blank answer (`cd ..`, an empty `grep`, `{"ok": true}`).
fn blank(mut keys: StepKeys) -> StepKeys {
    keys.blank = true;
    keys
}

/// Sixteen words in common and one of its own: any two of these share 16 of 18 words.
fn bits(n: u32) -> u64 {
    0xFFFF | 1 << (16 + n)
}

#[test]
fn e_nearly_identical_calls_with_the_same_answer_are_suspect_at_3_and_loop_at_4() {
    // The same edit re-applied with a character changed, the same test failure each time.
    let steps: Vec<_> = (1..=5)
        .map(|k| shaped(k, bits(k as u32), 7, true))
        .collect();
    let v = run(&steps);
    assert_eq!(levels(&v), [Progress, Progress, Suspect, Loop, Loop]);
    assert_eq!(v[3].rule, Rule::NearRepeat);
    assert_eq!(
        v[3].reason,
        Reason::NearRepeat {
            times: 4,
            blank: false
        }
    );
    assert_eq!(v[3].evidence.as_slice(), [1, 2, 3, 4]);
    assert_eq!(
        v[3].reason.to_string(),
        "4 nearly identical calls in a row (the same tool, most of the input the same), each with the same result"
    );
    // The same with a success that does not move: the same answer.
    let steps: Vec<_> = (1..=4)
        .map(|k| shaped(k, bits(k as u32), 7, false))
        .collect();
    assert_eq!(run(&steps)[3].level, Loop);
}

#[test]
fn e_near_calls_whose_answer_changes_are_progress() {
    // An edit-test cycle whose failure changes each time: the agent is getting somewhere.
    let steps: Vec<_> = (1..=6)
        .map(|k| shaped(k, bits(k as u32), 100 + k, true))
        .collect();
    assert_eq!(levels(&run(&steps)), [Progress; 6]);
}

#[test]
fn e_near_calls_whose_answers_differ_word_for_word_are_progress() {
    // `sort | md5sum`, then `sort -k 2 | md5sum`, …: the checksum normalizes to the same
    // `<ID>`, but it is the answer itself, and it changed with the call.
    let checksum = |k: u64| StepKeys {
        exact: 1000 + k,
        ..shaped(k, bits(k as u32), 7, false)
    };
    let v = run(&(1..=5).map(checksum).collect::<Vec<_>>());
    assert_eq!(levels(&v), [Progress; 5]);
    // The same call re-sent: an id that changes is noise (rule (a) by the outcome).
    let resent: Vec<_> = (1..=3)
        .map(|k| StepKeys {
            exact: 1000 + k,
            ..ok(1, 7)
        })
        .collect();
    assert_eq!(run(&resent)[2].level, Loop);
    // Empty answers are alike whatever their bytes (`""`, `"\n"`).
    let empty: Vec<_> = (1..=6).map(|k| blank(checksum(k))).collect();
    assert_eq!(run(&empty)[5].level, Loop);
}

#[test]
fn e_far_inputs_or_other_tools_are_not_near() {
    // Shapes with no word in common: different inputs (another file, another query).
    let far: Vec<_> = (0..5)
        .map(|k| shaped(k + 1, 0xFF << (8 * k), 7, false))
        .collect();
    assert!(run(&far).iter().all(|v| v.rule != Rule::NearRepeat));
    // The same shape under another tool: not the same call either.
    let tools: Vec<_> = (1..=5)
        .map(|k| StepKeys {
            tool: k,
            shape: 0,
            ..ok(k, 7)
        })
        .collect();
    assert!(run(&tools).iter().all(|v| v.rule != Rule::NearRepeat));
    // near_share 100: only identical calls compare.
    let steps: Vec<_> = (1..=5)
        .map(|k| shaped(k, bits(k as u32), 7, true))
        .collect();
    let exact_only = Config {
        near_share: 100,
        failure_run_loop: None,
        ..Config::default()
    };
    assert!(run_with(&steps, &exact_only)
        .iter()
        .all(|v| v.rule != Rule::NearRepeat && v.level < Loop));
}

#[test]
fn e_blank_answers_need_six_and_identical_calls_are_rule_a() {
    // Six variants of a query each answered with nothing: a loop only at the sixth.
    let steps: Vec<_> = (1..=6)
        .map(|k| blank(shaped(k, bits(k as u32), 5, false)))
        .collect();
    let v = run(&steps);
    assert_eq!(
        levels(&v),
        [Progress, Progress, Suspect, Suspect, Suspect, Loop]
    );
    assert_eq!(
        v[5].reason,
        Reason::NearRepeat {
            times: 6,
            blank: true
        }
    );
    // An empty answer is the same empty answer whatever the exit status.
    let mixed: Vec<_> = (1..=6)
        .map(|k| blank(shaped(k, bits(k as u32), 5 + k % 2, k % 2 == 0)))
        .collect();
    assert_eq!(run(&mixed)[5].level, Loop);
    // The identical call again and again is the repeat rule's, not this one's.
    let v = run(&[fail(1, 1); 4]);
    assert!(v.iter().all(|v| v.rule != Rule::NearRepeat));
}

// Round five: one command reworked while nothing comes back.

/// A base command of eight word pairs with a tail of its own (`tail` 0: the bare base).
fn base_with_tail(tail: u32) -> u64 {
    let base = 0xFF;
    if tail == 0 {
        base
    } else {
        base | 0b111 << (8 + 3 * tail)
    }
}

#[test]
fn e_six_reworks_of_one_command_all_answered_empty_are_a_loop() {
    // A pipeline that prints nothing, a different stage appended each time: each call keeps
    // every pair of the bare command, no two are nearly identical in a row (three pairs
    // of eleven change), every answer empty.
    let steps: Vec<_> = (0..6u32)
        .map(|k| blank(shaped(u64::from(k) + 1, base_with_tail(k), 5, k % 2 == 0)))
        .collect();
    let v = run(&steps);
    assert!(v[..5].iter().all(|v| v.level < Loop), "{v:?}");
    assert_eq!(v[5].level, Loop);
    assert_eq!(v[5].rule, Rule::NearRepeat);
    assert_eq!(v[5].reason, Reason::BlankRework { times: 6 });
    assert_eq!(v[5].evidence.as_slice(), [1, 2, 3, 4, 5, 6]);
    assert_eq!(
        v[5].reason.to_string(),
        "6 calls in a row got an empty answer, each a rework of another of them (the same command reworded, re-sent or with words added): nothing the agent tries brings anything back"
    );
    // Reworded forms and earlier forms re-sent, in any order: each has a partner among
    // the six (1 and 3 nearly identical, 2 and 5 the same call, 4 and 6 nearly identical).
    let forms = [
        bits(1),
        0xFF00,
        bits(2),
        0xFF_0000,
        0xFF00,
        0xFF_0000 | 1 << 40,
    ];
    let steps: Vec<_> = forms
        .iter()
        .enumerate()
        .map(|(k, &shape)| {
            let call = if shape == 0xFF00 { 50 } else { k as u64 + 1 };
            blank(shaped(call, shape, 5, false))
        })
        .collect();
    assert_eq!(run(&steps)[5].reason, Reason::BlankRework { times: 6 });
    // near_share 100: only identical calls compare, rule (e) is off, this half too.
    let exact_only = Config {
        near_share: 100,
        ..Config::default()
    };
    assert!(run_with(&steps, &exact_only).iter().all(|v| v.level < Loop));
}

#[test]
fn e_the_near_miss_six_empty_answers_on_other_targets_or_with_news_between_are_no_loop() {
    // The same command on six other targets: each loses a pair of the one before (the
    // target), none keeps another's pairs, none nearly identical.
    let targets: Vec<_> = (0..6)
        .map(|k| blank(shaped(k + 1, 0xF | 1 << (8 + k), 5, false)))
        .collect();
    assert!(run(&targets).iter().all(|v| v.level < Loop));
    // Calls that differ only in their digits (`file3`, `file4`): new targets.
    let numbered: Vec<_> = (0..6u32)
        .map(|k| {
            let mut keys = blank(shaped(u64::from(k) + 1, base_with_tail(k), 5, false));
            keys.wording = 77;
            keys
        })
        .collect();
    assert!(run(&numbered).iter().all(|v| v.level < Loop));
    // The same reworks with an answer between: the run of empty answers starts again.
    let mut steps: Vec<_> = (0..6u32)
        .map(|k| blank(shaped(u64::from(k) + 1, base_with_tail(k), 5, false)))
        .collect();
    steps.insert(3, shaped(9, base_with_tail(3), 6, false));
    assert!(run(&steps).iter().all(|v| v.level < Loop));
    // A short command (three pairs) kept inside longer ones is no rework: `ls` is in
    // every `ls …`.
    let short: Vec<_> = (0..6)
        .map(|k| {
            let tail = if k == 0 { 0 } else { 0b111 << (8 + 3 * k) };
            blank(shaped(k + 1, 0b111 | tail, 5, false))
        })
        .collect();
    assert!(run(&short).iter().all(|v| v.level < Loop));
}

/// A step whose answer opens with the line `line` (hashed), whatever follows it.
fn opening(line: u64, mut keys: StepKeys) -> StepKeys {
    keys.opening = line;
    keys
}

#[test]
fn f_answers_opening_alike_whether_the_call_failed_or_not_loop_at_4() {
    // Every command in a fence the shell cannot run: "BASH: command not found" first,
    // then the command's own output, the status following that output.
    let steps = [
        opening(42, fail(1, 1)),
        opening(42, fail(2, 2)),
        opening(42, ok(3, 3)),
        opening(42, fail(4, 4)),
        opening(42, ok(5, 5)),
        opening(42, ok(6, 6)),
    ];
    let v = run(&steps);
    // The third alone, a success after two failures, may be the call that worked.
    assert_eq!(levels(&v), [Progress, Progress, Progress, Loop, Loop, Loop]);
    assert_eq!(v[3].rule, Rule::FailureRun);
    assert_eq!(
        v[3].reason,
        Reason::SameOpening {
            times: 4,
            failed: 3
        }
    );
    assert_eq!(v[3].evidence.as_slice(), [1, 2, 3, 4]);
    assert_eq!(
        v[3].reason.to_string(),
        "4 calls in a row got answers opening with the same line, 3 failed and 1 succeeded: something in front of every call rejects it"
    );
    assert_eq!(
        v[5].reason,
        Reason::SameOpening {
            times: 6,
            failed: 3
        }
    );
    // failure_run_loop never: amber only.
    let amber = Config {
        failure_run_loop: None,
        ..Config::default()
    };
    assert_eq!(run_with(&steps, &amber)[3].level, Suspect);
    // Three, the newest failed: suspect.
    assert_eq!(run(&steps[..4])[2].level, Progress);
    let three = [steps[0], steps[2], steps[3]];
    assert_eq!(run(&three)[2].level, Suspect);
    // Three, the newest failed: suspect.
    let three = [steps[0], steps[2], steps[3]];
    assert_eq!(run(&three)[2].level, Suspect);
}

#[test]
fn f_the_near_miss_a_banner_then_a_pass_or_answers_of_one_status_are_not_a_same_opening() {
    // A test runner's banner on three failures, then the pass: the call that worked.
    let banner = [
        opening(42, fail(1, 1)),
        opening(42, fail(2, 2)),
        opening(42, fail(3, 3)),
        opening(42, ok(4, 4)),
    ];
    assert!(run(&banner).iter().all(|v| v.rule != Rule::FailureRun));
    // Tracebacks (every one a failure) or listings (every one a success) open alike.
    let tracebacks: Vec<_> = (1..=5).map(|k| opening(42, fail(k, k))).collect();
    assert!(run(&tracebacks).iter().all(|v| v.level == Progress));
    let listings: Vec<_> = (1..=5).map(|k| opening(42, ok(k, k))).collect();
    assert!(run(&listings).iter().all(|v| v.level == Progress));
    // An empty answer (an edit printing nothing) between them is work: it ends the run.
    let edited = [
        opening(42, fail(1, 1)),
        opening(42, ok(2, 2)),
        blank(ok(9, 0)),
        opening(42, fail(3, 3)),
        opening(42, ok(4, 4)),
        opening(42, ok(5, 5)),
    ];
    assert!(run(&edited).iter().all(|v| v.level < Loop));
    // So does an answer with lines of its own after the shared one: the call ran (test
    // files run one by one, a banner then each file's report).
    let report = |keys: StepKeys| {
        let mut keys = opening(42, keys);
        for line in [1, 2, 3] {
            keys.lines
                .union_with(&LineSketch::single(keys.outcome ^ line));
        }
        keys
    };
    let per_file = [
        report(fail(1, 1)),
        report(ok(2, 2)),
        report(ok(3, 3)),
        report(fail(4, 4)),
        report(ok(5, 5)),
    ];
    assert!(run(&per_file).iter().all(|v| v.level == Progress));
    // Another first line ends it too.
    let varied = [
        opening(42, fail(1, 1)),
        opening(42, ok(2, 2)),
        opening(43, fail(3, 3)),
        opening(42, ok(4, 4)),
        opening(42, fail(5, 5)),
    ];
    assert!(run(&varied).iter().all(|v| v.level < Loop));
}

#[test]
fn f_calls_in_a_row_failing_with_the_same_error_loop_at_4() {
    // Differently worded calls, one identical rejection.
    let steps = [fail(1, 7), fail(2, 7), fail(3, 7), fail(4, 7)];
    let v = run(&steps);
    assert_eq!(levels(&v), [Progress, Progress, Suspect, Loop]);
    assert_eq!(v[3].rule, Rule::FailureRun);
    assert_eq!(v[3].reason, Reason::FailureRun { times: 4, quiet: 0 });
    assert_eq!(v[3].evidence.as_slice(), [1, 2, 3, 4]);
    assert_eq!(
        v[3].reason.to_string(),
        "4 calls in a row failed with the same error"
    );
    // failure_run_loop never: amber only.
    let amber = Config {
        failure_run_loop: None,
        ..Config::default()
    };
    assert_eq!(run_with(&steps, &amber)[3].level, Suspect);
}

#[test]
fn f_a_success_or_another_error_breaks_the_run() {
    let v = run(&[fail(1, 7), fail(2, 7), ok(3, 3), fail(4, 7), fail(5, 7)]);
    assert!(v
        .iter()
        .all(|v| v.rule != Rule::FailureRun || v.level < Loop));
    let v = run(&[fail(1, 7), fail(2, 7), fail(3, 8), fail(4, 7), fail(5, 7)]);
    assert!(v.iter().all(|v| v.rule != Rule::FailureRun));
    // grep, rg, find, ack for a missing symbol: four empty answers are answers.
    let empty = |c| blank(fail(c, 7));
    let v = run(&[empty(1), empty(2), empty(3), empty(4)]);
    assert!(v.iter().all(|v| v.level == Progress));
}

#[test]
fn f_empty_answers_between_the_failures_neither_count_nor_break_the_run() {
    // An edit that prints nothing between runs of a test failing alike; an empty
    // `find` between rejected reads.
    let quiet = |c| blank(ok(c, 0));
    let steps = [
        fail(1, 7),
        quiet(10),
        fail(2, 7),
        blank(fail(11, 8)),
        fail(3, 7),
        quiet(12),
        fail(4, 7),
    ];
    let v = run(&steps);
    assert_eq!(v[4].level, Suspect, "{v:?}");
    assert_eq!(v[6].level, Loop);
    assert_eq!(v[6].rule, Rule::FailureRun);
    assert_eq!(v[6].reason, Reason::FailureRun { times: 4, quiet: 3 });
    assert_eq!(
        v[6].reason.to_string(),
        "4 calls failed with the same error, with only 3 empty answers between them"
    );
    // The failing steps are the evidence, not the quiet ones between.
    assert_eq!(v[6].evidence.as_slice(), [1, 3, 5, 7]);
    // Three failures and the quiet steps: amber, not a loop.
    assert!(run(&steps[..6]).iter().all(|v| v.level < Loop));
}

/// A failure of call `c`, input shape `shape`, whose full answer `o` echoes the call
/// and whose reply (the answer without the call's words) is `reply`.
fn echoing(c: u64, shape: u64, o: u64, reply: u64) -> StepKeys {
    StepKeys {
        exact: reply,
        ..shaped(c, shape, o, true)
    }
}

/// Sixteen words in common and `k` more: each one keeps the words of the one before.
fn grown(k: u32) -> u64 {
    0xFFFF | ((1u64 << (16 + k)) - (1 << 16))
}

#[test]
fn f_an_error_echoing_its_grown_call_is_the_same_error() {
    // A pipeline with one more stage each time, each time the same quoting error
    // quoting the longer pipeline: every answer differs, the reply does not.
    let steps: Vec<_> = (1..=4)
        .map(|k| echoing(k, grown(k as u32), 100 + k, 7))
        .collect();
    let v = run(&steps);
    assert_eq!(levels(&v), [Progress, Progress, Suspect, Loop]);
    assert_eq!(v[3].rule, Rule::FailureRun);
    assert_eq!(v[3].evidence.as_slice(), [1, 2, 3, 4]);
}

#[test]
fn f_an_error_quoting_a_changed_target_is_news() {
    // `ls a/b/c/d/`, `ls a/b/c/`, `ls a/b/`, `ls a/`: each "cannot access" quoting
    // the path it was given. The reply is the same, but each call dropped words: a
    // search that narrows.
    let steps: Vec<_> = (1..=5)
        .map(|k| echoing(k, grown(6 - k as u32), 100 + k, 7))
        .collect();
    assert!(
        run(&steps).iter().all(|v| v.level == Progress),
        "{:?}",
        run(&steps)
    );
    // Another target each time (a word changed, not added): news too.
    let steps: Vec<_> = (1..=5)
        .map(|k| echoing(k, bits(k as u32), 100 + k, 7))
        .collect();
    assert!(run(&steps).iter().all(|v| v.level == Progress));
    // Calls that are not nearly identical (another tool each time): the same reply
    // is not the same error.
    let steps: Vec<_> = (1..=5)
        .map(|k| StepKeys {
            tool: k,
            ..echoing(k, grown(k as u32), 100 + k, 7)
        })
        .collect();
    assert!(run(&steps).iter().all(|v| v.level == Progress));
}

#[test]
fn f_failures_whose_number_moves_are_not_the_same_error() {
    // "3 tests failed", "2 tests failed", "1 test failed": one gist (numbers masked),
    // another answer each time — an edit-test cycle making progress.
    let moving = |c, o| StepKeys {
        gist: 99,
        ..fail(c, o)
    };
    let v = run(&[moving(1, 3), moving(2, 2), moving(3, 1), moving(4, 5)]);
    assert!(v.iter().all(|v| v.rule != Rule::FailureRun), "{v:?}");
    // The same error word for word: a loop at the fourth.
    let v = run(&[moving(1, 7), moving(2, 7), moving(3, 7), moving(4, 7)]);
    assert_eq!(v[3].level, Loop);
    assert_eq!(v[3].rule, Rule::FailureRun);
}

#[test]
fn g_earlier_lookups_re_run_with_unchanged_results_are_revisits() {
    // A, B, C, then A again, D, B again, C again: three revisits in six steps.
    let v = run(&[
        ok(1, 1),
        ok(2, 2),
        ok(3, 3),
        ok(1, 1),
        ok(4, 4),
        ok(2, 2),
        ok(3, 3),
    ]);
    assert_eq!(
        levels(&v),
        [Progress, Progress, Progress, Progress, Progress, Suspect, Loop]
    );
    assert_eq!(v[6].rule, Rule::Revisit);
    assert_eq!(
        v[6].reason,
        Reason::Revisit {
            revisits: 3,
            window: 6
        }
    );
    // The revisits and the steps they repeat.
    assert_eq!(v[6].evidence.as_slice(), [1, 2, 3, 4, 6, 7]);
    assert_eq!(
        v[6].reason.to_string(),
        "3 of the last 6 steps repeated an earlier call (or a nearly identical one) and got the same result as before"
    );
}

#[test]
fn g_a_nearly_identical_call_in_other_numbers_is_a_new_target_not_a_revisit() {
    // Rounds of a lookup, a search and a reply; the search and the reply of each round
    // are nearly identical to the round before's (one word pair of many changed) and
    // get the same answers. In the same words with other numbers (the next order): a
    // new target, never a revisit. In other words (another query): revisits, a loop.
    let round = |r: u64, wording: u64| {
        [
            ok(100 + r, 200 + r),
            StepKeys {
                tool: 1,
                shape: bits((r % 2) as u32),
                wording: 1 + wording,
                ..ok(10 + r, 7)
            },
            StepKeys {
                tool: 2,
                shape: bits(2 + (r % 2) as u32),
                wording: 2 + wording,
                ..ok(20 + r, 8)
            },
        ]
    };
    let rounds = |wording: &dyn Fn(u64) -> u64| -> Vec<StepKeys> {
        (0..4).flat_map(|r| round(r, wording(r))).collect()
    };
    let orders = run(&rounds(&|_| 0));
    assert!(orders.iter().all(|v| v.level == Progress), "{orders:?}");

    let reworded = run(&rounds(&|r| 10 * r));
    assert_eq!(reworded.last().unwrap().level, Loop);
    assert_eq!(reworded.last().unwrap().rule, Rule::Revisit);

    // The identical call again is a revisit whatever its wording says.
    let same = run(&(0..4).flat_map(|_| round(0, 0)).collect::<Vec<_>>());
    assert_eq!(same.last().unwrap().level, Loop);
}

#[test]
fn g_a_long_cycle_is_caught_in_its_second_round() {
    // View eight files, then the same eight again, the same contents: past max_period.
    let round: Vec<_> = (1..=8).map(|c| ok(c, 100 + c)).collect();
    let steps: Vec<_> = round.iter().cycle().take(16).copied().collect();
    let v = run(&steps);
    assert!(levels(&v)[..9].iter().all(|&l| l == Progress));
    assert_eq!((v[10].level, v[10].rule), (Loop, Rule::Revisit));
    assert_eq!(v[10].evidence.as_slice(), [1, 2, 3, 9, 10, 11]);
}

#[test]
fn g_a_re_read_after_a_change_or_an_empty_answer_is_no_revisit() {
    // Re-reading a file that an edit changed: a new answer.
    let v = run(&[
        ok(1, 1),
        ok(2, 2),
        ok(1, 10),
        ok(3, 3),
        ok(1, 11),
        ok(2, 20),
    ]);
    assert!(v.iter().all(|v| v.level == Progress));
    // `cd ..` between listings: an empty answer says neither.
    let cd = blank(ok(9, 9));
    let v = run(&[cd, ok(1, 1), cd, ok(2, 2), cd, ok(3, 3), cd]);
    assert!(v.iter().all(|v| v.rule != Rule::Revisit));
    // A nearly identical lookup whose answer differs word for word (another checksum).
    let v = run(&[
        shaped(1, bits(3), 1, false),
        ok(20, 20),
        StepKeys {
            exact: 99,
            ..shaped(2, bits(4), 1, false)
        },
    ]);
    assert_eq!(v[2].level, Progress);
    // A nearly identical call (another line range of the same file) with the same
    // answer is a revisit too.
    let v = run(&[
        shaped(1, bits(3), 1, false),
        ok(20, 20),
        shaped(2, bits(4), 1, false),
        ok(21, 21),
        shaped(3, bits(5), 1, false),
        ok(22, 22),
        shaped(4, bits(6), 1, false),
    ]);
    assert_eq!((v[6].level, v[6].rule), (Loop, Rule::Revisit));
}

#[test]
fn g_an_empty_answer_counts_when_the_identical_call_got_it_with_only_failures_since() {
    // `cp -r src/* dst/` (nothing printed), a failing variant, the same cp again, …:
    // nothing but failures and empty answers between the identical calls.
    let copy = blank(ok(1, 1));
    let v = run(&[copy, fail(2, 2), copy, fail(3, 3), copy, fail(4, 4), copy]);
    assert_eq!(
        levels(&v),
        [Progress, Progress, Progress, Progress, Suspect, Progress, Loop]
    );
    assert_eq!(v[6].rule, Rule::Revisit);
    assert_eq!(v[6].evidence.as_slice(), [1, 3, 5, 7]);
    // `sleep 5` between polls that move: an answer came between, no revisit.
    let sleep = blank(ok(9, 9));
    let v = run(&[sleep, ok(1, 10), sleep, ok(1, 20), sleep, ok(1, 30), sleep]);
    assert!(v.iter().all(|v| v.rule != Rule::Revisit));
    // Only the identical call: a nearly identical one with an empty answer is not enough.
    let v = run(&[
        blank(shaped(1, bits(1), 1, false)),
        fail(7, 7),
        blank(shaped(2, bits(2), 1, false)),
        fail(8, 8),
        blank(shaped(3, bits(3), 1, false)),
        fail(9, 9),
        blank(shaped(4, bits(4), 1, false)),
    ]);
    assert!(v.iter().all(|v| v.rule != Rule::Revisit));
}

#[test]
fn g_revisits_fall_out_of_the_window_and_can_be_turned_off() {
    // Three revisits, but spread over more than six steps.
    let v = run(&[
        ok(1, 1),
        ok(2, 2),
        ok(1, 1),
        ok(3, 3),
        ok(4, 4),
        ok(5, 5),
        ok(2, 2),
        ok(6, 6),
        ok(7, 7),
        ok(1, 1),
    ]);
    assert!(v.iter().all(|v| v.level < Loop));
    let amber = Config {
        revisit_loop: None,
        ..Config::default()
    };
    let v = run_with(
        &[ok(1, 1), ok(2, 2), ok(3, 3), ok(1, 1), ok(2, 2), ok(3, 3)],
        &amber,
    );
    assert!(v.iter().all(|v| v.level < Loop));
}

#[test]
fn defaults_an_alternation_is_a_loop_by_its_revisits_before_the_cycle_completes() {
    // edit → ok, build → the same failure: by the third edit, three revisits.
    let v = run(&[ok(1, 1), fail(2, 2), ok(1, 1), fail(2, 2), ok(1, 1)]);
    assert_eq!(levels(&v), [Progress, Progress, Progress, Suspect, Loop]);
    assert_eq!(v[4].rule, Rule::Revisit);
}

#[test]
fn new_configs_are_checked() {
    let ok = Config::default();
    let bad = [
        Config {
            near_share: 101,
            ..ok
        },
        Config {
            near_share: 49,
            ..ok
        },
        Config {
            near_repeat_suspect: 5,
            ..ok
        },
        Config {
            near_repeat_suspect: 1,
            ..ok
        },
        Config {
            blank_near_repeat_loop: 1,
            ..ok
        },
        Config {
            failure_run_suspect: 5,
            ..ok
        },
        Config {
            failure_run_suspect: 1,
            failure_run_loop: None,
            ..ok
        },
        Config {
            revisit_window: 1,
            ..ok
        },
        Config {
            revisit_window: MAX_HISTORY + 1,
            ..ok
        },
        Config {
            revisit_suspect: 4,
            ..ok
        },
    ];
    for config in bad {
        assert_eq!(
            config.validate(),
            Err(Error::InvalidVerdictConfig),
            "{config:?}"
        );
    }
    assert_eq!(
        Config {
            near_share: 100,
            failure_run_loop: None,
            revisit_loop: None,
            revisit_window: MAX_HISTORY,
            ..ok
        }
        .validate(),
        Ok(())
    );
    assert_eq!(Rule::NearRepeat.as_str(), "near_repeat");
    assert_eq!(Rule::FailureRun.as_str(), "failure_run");
    assert_eq!(Rule::Revisit.as_str(), "revisit");
}
