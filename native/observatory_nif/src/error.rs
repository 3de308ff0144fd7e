//! Maps the core's errors to `{:error, atom}` the Elixir side can match on.

use observatory_core::Error as CoreError;

use crate::atoms;

pub fn to_nif(error: CoreError) -> rustler::Error {
    rustler::Error::Term(Box::new(reason(error)))
}

/// The atom for each error, for NIFs that build their own `{:error, reason}`.
pub fn reason(error: CoreError) -> rustler::Atom {
    match error {
        CoreError::InvalidSessionId => atoms::invalid_session_id(),
        CoreError::InvalidAgentId => atoms::invalid_agent_id(),
        CoreError::FieldTooLong => atoms::field_too_long(),
        CoreError::InvalidUtf8 => atoms::invalid_utf8(),
        CoreError::InvalidWindowSize => atoms::invalid_window_size(),
        CoreError::InvalidThreshold => atoms::invalid_threshold(),
        CoreError::InvalidStepThresholds => atoms::invalid_step_thresholds(),
        CoreError::InvalidBreakerConfig => atoms::invalid_breaker_config(),
        CoreError::InvalidKillSwitchWindow => atoms::invalid_kill_switch_window(),
        CoreError::InvalidKillSwitchThreshold => atoms::invalid_kill_switch_threshold(),
        CoreError::InvalidVerdictConfig => atoms::invalid_verdict_config(),
        CoreError::NotAnObject => atoms::not_an_object(),
        CoreError::NotACompletion => atoms::not_a_completion(),
    }
}
