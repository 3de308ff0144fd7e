//! The labelled scenario suite (issue 8): `test/fixtures/loop_verdict_scenarios.json`,
//! one test per scenario, named after its label. Each step becomes a real DecisionLog
//! envelope and goes the gateway's way: validation, call and outcome keys with the
//! default normalization, the entropy store (FRD-009 defaults) and the verdict.
//!
//! Each test checks the verdict (final, highest, first step at LOOP) and, for the
//! contrast, what the uniqueness ratio says (final severity, first step at LOOP). The
//! same file runs through `SchemaInterceptor.ingest/1` in
//! `test/observatory/gateway/loop_verdict_scenarios_test.exs`.

use serde_json::{json, Value};

use super::keys::Normalization;
use super::*;
use crate::decision_log::{validate, verdict_keys};
use crate::normalize::{IdRules, VolatileWords};
use crate::session_store::{Observation, Settings, Store};

const FIXTURE: &str = include_str!(concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/../../test/fixtures/loop_verdict_scenarios.json"
));

/// What one scenario did, step by step.
#[derive(Debug)]
struct Run {
    verdicts: Vec<Verdict>,
    severities: Vec<Severity>,
}

impl Run {
    /// The first verdict that calls the run a loop.
    fn first_loop_verdict(&self) -> Option<&Verdict> {
        self.verdicts.iter().find(|v| v.level == Level::Loop)
    }

    fn first_loop(&self) -> Option<u32> {
        self.first_loop_verdict().map(|v| v.step)
    }

    fn entropy_first_loop(&self) -> Option<u32> {
        self.severities
            .iter()
            .position(|&s| s == Severity::Loop)
            .map(|i| i as u32 + 1)
    }
}

fn scenario(name: &str) -> Value {
    let fixture: Value = serde_json::from_str(FIXTURE).expect("the fixture is JSON");
    fixture["scenarios"]
        .as_array()
        .unwrap()
        .iter()
        .find(|s| s["name"] == name)
        .unwrap_or_else(|| panic!("no scenario named {name:?}"))
        .clone()
}

fn envelope(step: &Value, n: usize) -> Value {
    let mut action = json!({
        "tool_call": step["tool"],
        "tool_input": step["input"],
        "status": step["status"],
    });
    if let Some(result) = step.get("result") {
        action["result"] = result.clone();
    }
    json!({
        "meta": {
            "step_id": format!("step-{n}"),
            "session_id": "sess-scenario",
            "agent_id": "agent-scenario",
            "timestamp": "2026-02-22T10:30:00Z"
        },
        "cognition": {"intent": step["intent"]},
        "action": action
    })
}

fn run(scenario: &Value, rules: &Normalization) -> Run {
    let store = Store::new(1, 16);
    let config = Config::default();
    let mut state = VerdictState::new();
    let mut run = Run {
        verdicts: vec![],
        severities: vec![],
    };
    for (i, step) in scenario["steps"].as_array().unwrap().iter().enumerate() {
        let envelope = envelope(step, i + 1);
        let fields = validate(&envelope).expect("scenario steps are valid envelopes");
        let obs = Observation {
            session_id: fields.session_id.as_bytes(),
            intent: fields.intent.as_bytes(),
            tool_call: fields.tool_call.as_bytes(),
            status: fields.status,
            agent_id: Some(fields.agent_id.as_bytes()),
        };
        let (severity, window) = store
            .record(&obs, &Settings::default(), |s| (s.severity, s.window_len))
            .unwrap();
        let keys = verdict_keys(&envelope, rules);
        let signal = EntropySignal { severity, window };
        run.verdicts
            .push(state.observe(keys, Some(signal), &config));
        run.severities.push(severity);
    }
    run
}

fn level(name: &str) -> Level {
    match name {
        "progress" => Level::Progress,
        "suspect" => Level::Suspect,
        "loop" => Level::Loop,
        other => panic!("unknown level {other}"),
    }
}

fn severity(name: &str) -> Severity {
    match name {
        "normal" => Severity::Normal,
        "warning" => Severity::Warning,
        "loop" => Severity::Loop,
        other => panic!("unknown severity {other}"),
    }
}

/// Runs the named scenario and checks every expectation of the fixture.
fn check(name: &str, label: &str) -> Run {
    let scenario = scenario(name);
    assert_eq!(scenario["label"], label, "{name}: label");
    let expect = &scenario["expect"];
    let run = run(&scenario, Normalization::shared_default());
    let trace: Vec<_> = run
        .verdicts
        .iter()
        .zip(&run.severities)
        .map(|(v, s)| format!("{}:{:?}/{:?} {}", v.step, v.level, s, v.reason))
        .collect();
    let last = run.verdicts.last().unwrap();
    let max = run.verdicts.iter().map(|v| v.level).max().unwrap();
    assert_eq!(
        last.level,
        level(expect["verdict"].as_str().unwrap()),
        "{name}: final verdict\n{trace:#?}"
    );
    assert_eq!(
        max,
        level(expect["max_verdict"].as_str().unwrap()),
        "{name}: highest verdict\n{trace:#?}"
    );
    assert_eq!(
        run.first_loop(),
        expect["verdict_first_loop"].as_u64().map(|n| n as u32),
        "{name}: first loop\n{trace:#?}"
    );
    assert_eq!(
        *run.severities.last().unwrap(),
        severity(expect["entropy"].as_str().unwrap()),
        "{name}: final entropy severity\n{trace:#?}"
    );
    assert_eq!(
        run.entropy_first_loop(),
        expect["entropy_first_loop"].as_u64().map(|n| n as u32),
        "{name}: entropy's first loop\n{trace:#?}"
    );
    if label == "must-flag" {
        assert!(
            !last.evidence.as_slice().is_empty(),
            "{name}: a loop names its evidence"
        );
        assert_ne!(last.rule, Rule::None);
    }
    run
}

#[test]
fn every_scenario_in_the_fixture_has_a_test() {
    let fixture: Value = serde_json::from_str(FIXTURE).unwrap();
    let names: Vec<&str> = fixture["scenarios"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["name"].as_str().unwrap())
        .collect();
    let tested = [
        "reading eight different files",
        "polling a job 10% → 80%",
        "writing ten different files",
        "a healthy varied session",
        "retrying once, then succeeding",
        "sleeping between polls of a moving job",
        "the same tool, the same failure, repeated",
        "edit/build alternation with the same failing build",
        "an A → B → C cycle with the same outcomes",
        "grep, rg, find and ack for the same missing symbol",
        "the same call and result with a changing pid and timestamp",
        "A/B ping-pong with the same results",
        "a health check flapping between two answers",
        "three different fixes, the same build failure",
        "prose resubmitted to the shell, the error's line number counting up",
        "different scripts, each failing with its own line number",
        "the same insertion applied again and again, the file echo growing by the same lines",
        "different insertions one after another, the file echo growing by new lines",
        "the same failing command retried with whitespace-only differences",
        "a retry with other whitespace that succeeds",
        "a long build log that differs only in its timing and size fields",
        "tailing a build log that gains new lines each time",
        "the same search for a missing symbol, repeated",
        "walking up with cd .., each empty, then listing",
        "cd .. at the root, pwd answering / each time",
        "the same failing command, stderr and stdout interleaved differently each run",
        "a near-identical edit re-applied, the linter rejecting it the same way each time",
        "an edit-test cycle whose failure changes each time",
        "different arguments, the same error",
        "different approaches, the same outcome",
        "a search that narrows",
        "a round of seven views repeated with the same results",
        "a round of status checks whose answers move each time",
        "earlier lookups re-run between other steps, the results unchanged",
        "the same tool used productively on different targets",
        "the same file ranges opened again, no edit in between",
        "re-reading a file after each edit, its content changed",
        "a pipeline grown by a stage each time, the same quoting error echoing it",
        "a path walked up, each 'cannot access' quoting another path",
        "a support agent answering order after order, the same help text each time",
        "every command sent inside a fence the shell cannot run, the status following what comes after",
        "a test runner's banner on every run, some files failing, some passing",
        "one search reworked six ways, every answer empty",
        "one search swept over six directories, every answer empty",
    ];
    assert_eq!(names, tested);
}

#[test]
fn must_not_flag_reading_eight_different_files() {
    let run = check("reading eight different files", "must-not-flag");
    assert_eq!(
        run.verdicts.last().unwrap().rule,
        Rule::Entropy,
        "the ratio's alarm, explained"
    );
}

#[test]
fn must_not_flag_polling_a_job_10_to_80_percent() {
    let run = check("polling a job 10% → 80%", "must-not-flag");
    assert_eq!(
        run.verdicts.last().unwrap().reason,
        Reason::Polling { times: 8 }
    );
}

#[test]
fn must_not_flag_writing_ten_different_files() {
    check("writing ten different files", "must-not-flag");
}

#[test]
fn must_not_flag_a_healthy_varied_session() {
    check("a healthy varied session", "must-not-flag");
}

#[test]
fn must_not_flag_retrying_once_then_succeeding() {
    check("retrying once, then succeeding", "must-not-flag");
}

#[test]
fn must_not_flag_sleeping_between_polls_of_a_moving_job() {
    let run = check("sleeping between polls of a moving job", "must-not-flag");
    assert_eq!(run.verdicts.last().unwrap().rule, Rule::Cycle);
}

#[test]
fn must_flag_the_same_tool_the_same_failure_repeated() {
    let run = check("the same tool, the same failure, repeated", "must-flag");
    assert_eq!(run.verdicts[2].rule, Rule::Repeat);
    assert_eq!(run.verdicts[2].evidence.as_slice(), [1, 2, 3]);
}

#[test]
fn must_flag_edit_build_alternation_with_the_same_failing_build() {
    let run = check(
        "edit/build alternation with the same failing build",
        "must-flag",
    );
    let last = run.verdicts.last().unwrap();
    assert_eq!(
        last.reason,
        Reason::Cycle {
            period: 2,
            blocks: 3
        }
    );
}

#[test]
fn must_flag_an_a_b_c_cycle_with_the_same_outcomes() {
    let run = check("an A → B → C cycle with the same outcomes", "must-flag");
    let last = run.verdicts.last().unwrap();
    assert_eq!(
        last.reason,
        Reason::Cycle {
            period: 3,
            blocks: 3
        }
    );
    assert_eq!(last.evidence.as_slice(), (1..=9).collect::<Vec<_>>());
}

#[test]
fn must_not_flag_grep_rg_find_ack_for_the_same_missing_symbol() {
    // Issue 11: an empty search miss is an answer, not a failure that counts for (c).
    let run = check(
        "grep, rg, find and ack for the same missing symbol",
        "must-not-flag",
    );
    assert!(run.verdicts.iter().all(|v| v.rule != Rule::SameFailure));
}

#[test]
fn must_flag_the_same_call_and_result_with_a_changing_pid_and_timestamp() {
    let scenario = scenario("the same call and result with a changing pid and timestamp");
    check(
        "the same call and result with a changing pid and timestamp",
        "must-flag",
    );
    // Without the normalizer every step would be new: the ids are what it removes.
    let raw = Normalization {
        input: IdRules {
            hex_ids: false,
            epoch_timestamps: false,
            numbers: false,
            volatile: VolatileWords::new(Vec::<&str>::new()),
        },
        result: IdRules {
            hex_ids: false,
            epoch_timestamps: false,
            numbers: false,
            volatile: VolatileWords::new(Vec::<&str>::new()),
        },
    };
    // Without the id rules the pid and the timestamp stay, but the step failed: its
    // numbers are counters, masked in the result's shape, so the repeat still shows.
    let run = run(&scenario, &raw);
    assert_eq!(run.first_loop(), Some(3));
}

#[test]
fn must_flag_a_b_ping_pong_with_the_same_results() {
    check("A/B ping-pong with the same results", "must-flag");
}

#[test]
fn must_flag_a_health_check_flapping_between_two_answers() {
    // X, Y, X, Y: from the third answer on, nothing the same call had not said.
    let run = check("a health check flapping between two answers", "must-flag");
    let last = run.verdicts.last().unwrap();
    assert_eq!(last.rule, Rule::Repeat);
}

#[test]
fn suspect_three_different_fixes_the_same_build_failure() {
    let run = check("three different fixes, the same build failure", "suspect");
    // The build re-run after each edit gives the same failure: three failures in a
    // row (the edits between print nothing), amber.
    assert_eq!(run.verdicts.last().unwrap().rule, Rule::FailureRun);
}

// Issue 11: each way real runs fooled the verdict, the loop and its near-miss.

#[test]
fn must_flag_prose_resubmitted_to_the_shell_error_line_counting_up() {
    check(
        "prose resubmitted to the shell, the error's line number counting up",
        "must-flag",
    );
}

#[test]
fn must_not_flag_different_scripts_each_failing_with_its_own_line_number() {
    check(
        "different scripts, each failing with its own line number",
        "must-not-flag",
    );
}

#[test]
fn must_flag_the_same_insertion_reapplied_file_echo_growing() {
    check(
        "the same insertion applied again and again, the file echo growing by the same lines",
        "must-flag",
    );
}

#[test]
fn must_not_flag_different_insertions_file_echo_growing_by_new_lines() {
    check(
        "different insertions one after another, the file echo growing by new lines",
        "must-not-flag",
    );
}

#[test]
fn must_flag_the_same_failing_command_with_whitespace_only_differences() {
    check(
        "the same failing command retried with whitespace-only differences",
        "must-flag",
    );
}

#[test]
fn must_not_flag_a_retry_with_other_whitespace_that_succeeds() {
    check(
        "a retry with other whitespace that succeeds",
        "must-not-flag",
    );
}

#[test]
fn must_flag_a_long_build_log_differing_only_in_timing_and_size() {
    check(
        "a long build log that differs only in its timing and size fields",
        "must-flag",
    );
}

#[test]
fn must_not_flag_tailing_a_build_log_that_gains_new_lines() {
    check(
        "tailing a build log that gains new lines each time",
        "must-not-flag",
    );
}

#[test]
fn must_flag_the_same_search_for_a_missing_symbol_repeated() {
    check(
        "the same search for a missing symbol, repeated",
        "must-flag",
    );
}

#[test]
fn must_not_flag_walking_up_with_cd_dot_dot() {
    check(
        "walking up with cd .., each empty, then listing",
        "must-not-flag",
    );
}

#[test]
fn must_flag_cd_dot_dot_at_the_root() {
    check("cd .. at the root, pwd answering / each time", "must-flag");
}

#[test]
fn must_flag_stderr_and_stdout_interleaved_differently() {
    check(
        "the same failing command, stderr and stdout interleaved differently each run",
        "must-flag",
    );
}

// Issue 26: stuck, not only repeating. A loop and its near-miss for each class of stuck
// session a careful reader found that the rules above missed.

/// Checks the scenario and the rule that decided its first loop.
fn check_rule(name: &str, label: &str, rule: Rule) {
    let run = check(name, label);
    let first = run.first_loop_verdict();
    assert_eq!(first.map(|v| v.rule), Some(rule), "{name}: the rule");
}

#[test]
fn must_flag_a_near_identical_edit_re_applied_the_same_linter_error() {
    check_rule(
        "a near-identical edit re-applied, the linter rejecting it the same way each time",
        "must-flag",
        Rule::NearRepeat,
    );
}

#[test]
fn must_not_flag_an_edit_test_cycle_whose_failure_changes() {
    check(
        "an edit-test cycle whose failure changes each time",
        "must-not-flag",
    );
}

#[test]
fn must_flag_different_arguments_the_same_error() {
    check_rule(
        "different arguments, the same error",
        "must-flag",
        Rule::FailureRun,
    );
}

#[test]
fn must_flag_different_approaches_the_same_outcome() {
    check_rule(
        "different approaches, the same outcome",
        "must-flag",
        Rule::FailureRun,
    );
}

#[test]
fn must_not_flag_a_search_that_narrows() {
    check("a search that narrows", "must-not-flag");
}

#[test]
fn must_flag_a_round_of_seven_views_repeated() {
    check_rule(
        "a round of seven views repeated with the same results",
        "must-flag",
        Rule::Revisit,
    );
}

#[test]
fn must_not_flag_a_round_of_status_checks_that_move() {
    check(
        "a round of status checks whose answers move each time",
        "must-not-flag",
    );
}

#[test]
fn must_flag_earlier_lookups_re_run_with_unchanged_results() {
    check_rule(
        "earlier lookups re-run between other steps, the results unchanged",
        "must-flag",
        Rule::Revisit,
    );
}

#[test]
fn must_not_flag_the_same_tool_on_different_targets() {
    check(
        "the same tool used productively on different targets",
        "must-not-flag",
    );
}

#[test]
fn must_flag_the_same_file_ranges_opened_again() {
    check_rule(
        "the same file ranges opened again, no edit in between",
        "must-flag",
        Rule::Revisit,
    );
}

#[test]
fn must_not_flag_re_reading_a_file_after_each_edit() {
    check(
        "re-reading a file after each edit, its content changed",
        "must-not-flag",
    );
}

// Round two of stuck detection: an error that echoes its own call.

#[test]
fn must_flag_a_pipeline_grown_by_a_stage_each_time_the_same_quoting_error_echoing_it() {
    check_rule(
        "a pipeline grown by a stage each time, the same quoting error echoing it",
        "must-flag",
        Rule::FailureRun,
    );
}

#[test]
fn must_not_flag_a_path_walked_up_each_cannot_access_quoting_another_path() {
    check(
        "a path walked up, each 'cannot access' quoting another path",
        "must-not-flag",
    );
}

#[test]
fn must_not_flag_a_support_agent_answering_order_after_order() {
    // Each round's search and reply differ from the round before only in the order's
    // number: a new target, not a revisit, though the answers are the same.
    check(
        "a support agent answering order after order, the same help text each time",
        "must-not-flag",
    );
}

#[test]
fn must_flag_every_command_inside_a_fence_the_shell_cannot_run_the_status_flipping() {
    let run = check(
        "every command sent inside a fence the shell cannot run, the status following what comes after",
        "must-flag",
    );
    let first = run.first_loop_verdict().unwrap();
    assert_eq!(first.rule, Rule::FailureRun);
    assert_eq!(
        first.reason,
        Reason::SameOpening {
            times: 4,
            failed: 3
        }
    );
    assert_eq!(first.evidence.as_slice(), [1, 2, 3, 4]);
}

#[test]
fn must_not_flag_a_test_runner_s_banner_on_every_run_some_files_failing_some_passing() {
    check(
        "a test runner's banner on every run, some files failing, some passing",
        "must-not-flag",
    );
}

// Round five: one command reworked while nothing comes back.

#[test]
fn must_flag_one_search_reworked_six_ways_every_answer_empty() {
    let run = check(
        "one search reworked six ways, every answer empty",
        "must-flag",
    );
    let first = run.first_loop_verdict().unwrap();
    assert_eq!(first.rule, Rule::NearRepeat);
    assert_eq!(first.reason, Reason::BlankRework { times: 6 });
    assert_eq!(first.evidence.as_slice(), [2, 3, 4, 5, 6, 7]);
}

#[test]
fn must_not_flag_one_search_swept_over_six_directories_every_answer_empty() {
    check(
        "one search swept over six directories, every answer empty",
        "must-not-flag",
    );
}
