//! The one error type of the core crate. The NIF glue turns each variant into an atom.

/// Why an observation was refused. Every variant leaves the store untouched.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum Error {
    #[error("session_id must be 1..=256 bytes")]
    InvalidSessionId,
    #[error("agent_id must be 1..=256 bytes")]
    InvalidAgentId,
    #[error("a field exceeds its size limit")]
    FieldTooLong,
    #[error("a field is not valid UTF-8")]
    InvalidUtf8,
    #[error("window size must be between 1 and the maximum window size")]
    InvalidWindowSize,
    #[error("thresholds must be finite numbers between 0 and 1")]
    InvalidThreshold,
    #[error("step thresholds need warn >= 1 and block >= warn")]
    InvalidStepThresholds,
    #[error("circuit breaker needs max_calls, window_ms and max_keys all >= 1")]
    InvalidBreakerConfig,
    #[error("kill switch window_size must be between 2 and 1000")]
    InvalidKillSwitchWindow,
    #[error("kill switch threshold must be a finite number above 0")]
    InvalidKillSwitchThreshold,
    #[error("loop verdict thresholds need suspect >= 2, loop >= suspect, history 2..=64, max_period 1..=8")]
    InvalidVerdictConfig,
    #[error("a chat-completions request must be a JSON object")]
    NotAnObject,
    #[error("a chat-completions response must be an object with a choices array")]
    NotACompletion,
}
