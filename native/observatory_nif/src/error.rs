//! Maps the core's errors to `{:error, atom}` the Elixir side can match on.

use observatory_core::Error as CoreError;

use crate::atoms;

pub fn to_nif(error: CoreError) -> rustler::Error {
    let reason = match error {
        CoreError::InvalidSessionId => atoms::invalid_session_id(),
        CoreError::InvalidAgentId => atoms::invalid_agent_id(),
        CoreError::FieldTooLong => atoms::field_too_long(),
        CoreError::InvalidUtf8 => atoms::invalid_utf8(),
        CoreError::InvalidWindowSize => atoms::invalid_window_size(),
        CoreError::InvalidThreshold => atoms::invalid_threshold(),
    };
    rustler::Error::Term(Box::new(reason))
}
