//! rustler glue for Observatory. Each file serves one Elixir module; the algorithms
//! live in `observatory_core`.

#[cfg(feature = "alloc_count")]
mod alloc_count;
mod body_edit;
mod data_dir_lock;
mod decision_log;
mod entropy_tracker;
mod error;
mod idempotency;
mod json;
mod kill_switch;
mod loop_verdict;
mod replay;
mod responses;
mod session_log;
mod step_detector;
mod step_score;
mod test_support;

mod atoms {
    rustler::atoms! {
        ok,
        error,
        // severities
        normal,
        warning,
        loop_ = "loop",
        // step detector and breaker
        full_progress,
        world_changed,
        stuck,
        full_stagnation,
        continue_ = "continue",
        warn,
        block,
        allow,
        deny,
        // replay
        envelope,
        flat,
        // loop verdict: levels and rules
        progress,
        suspect,
        none,
        repeat,
        cycle,
        near_repeat,
        failure_run,
        revisit,
        same_failure,
        entropy,
        // error reasons
        invalid_session_id,
        invalid_agent_id,
        field_too_long,
        invalid_utf8,
        invalid_window_size,
        invalid_threshold,
        invalid_step_thresholds,
        invalid_breaker_config,
        invalid_kill_switch_window,
        invalid_kill_switch_threshold,
        invalid_verdict_config,
        invalid_verdict_keys,
        invalid_step_digest,
        not_started,
        not_an_object,
        not_a_completion,
        invalid_json,
        // data directory lock
        locked,
        // idempotency: what a claim finds
        new,
        replay,
        conflict,
        in_progress,
        // kill switch: how a request's prompt is read
        last_user_message,
        // proxied APIs (body edits)
        messages,
        responses,
        // session log: how a step is kept, what a put found
        nil,
        json,
        term,
        over_bytes,
        new_session,
    }
}

rustler::init!("Elixir.Observatory.Native");
