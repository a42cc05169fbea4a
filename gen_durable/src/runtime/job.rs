//! The job form: a one-step FSM for plain background work.

use std::fmt;
use std::time::Duration;

use serde_json::Value;

use crate::runtime::fsm::{backoff_capped, Fsm, Step, StepError};

/// What a `#[durable_job]` function returns: a result to finish with, or a [`JobError`].
pub type JobResult = Result<Value, JobError>;

/// How a job failed, and whether to try again.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum JobError {
    /// Try again after the backoff, until `max_attempts` runs have failed.
    Retry(String),
    /// Fail the job now, without retrying; the message is its `last_error`.
    Fail(String),
}

impl JobError {
    /// A retryable error from anything displayable (use with `map_err(JobError::retry)`).
    pub fn retry(err: impl fmt::Display) -> Self {
        JobError::Retry(err.to_string())
    }
    /// A final error from anything displayable (use with `map_err(JobError::fail)`).
    pub fn fail(err: impl fmt::Display) -> Self {
        JobError::Fail(err.to_string())
    }
}

impl fmt::Display for JobError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            JobError::Retry(m) => write!(f, "retry: {m}"),
            JobError::Fail(m) => write!(f, "failed: {m}"),
        }
    }
}

/// Any error converts with `?` into a retryable [`JobError`].
impl<E: std::error::Error + Send + Sync + 'static> From<E> for JobError {
    fn from(err: E) -> Self {
        JobError::Retry(err.to_string())
    }
}

/// The retry policy of a job: how many runs, the backoff between them, and its cap.
#[derive(Debug, Clone, Copy)]
pub struct RetryPolicy {
    /// Total runs allowed before the job fails (default 20).
    pub max_attempts: i32,
    /// The longest wait between runs (default 300 s).
    pub max_backoff: Duration,
    /// The wait after failed run number `attempt + 1` (`#[durable_job(backoff = f)]`);
    /// default `1 s · 2^attempt`. Capped by `max_backoff` either way.
    pub backoff: Option<fn(i32) -> Duration>,
}

impl Default for RetryPolicy {
    fn default() -> Self {
        RetryPolicy {
            max_attempts: 20,
            max_backoff: Duration::from_secs(300),
            backoff: None,
        }
    }
}

impl PartialEq for RetryPolicy {
    fn eq(&self, other: &Self) -> bool {
        // Function pointers compare by address, the only identity they have.
        self.max_attempts == other.max_attempts
            && self.max_backoff == other.max_backoff
            && self.backoff.map(|f| f as usize) == other.backoff.map(|f| f as usize)
    }
}

impl Eq for RetryPolicy {}

impl RetryPolicy {
    /// The outcome of a job run that ended with `result` on run number `attempt + 1`.
    pub fn outcome<F: Fsm>(&self, attempt: i32, result: JobResult) -> Step<F> {
        match result {
            Ok(value) => Step::done(value),
            Err(JobError::Fail(msg)) => Step::stop(msg),
            Err(JobError::Retry(msg)) => self.retry_or_stop(attempt, msg),
        }
    }

    /// The outcome of a job run that panicked or otherwise failed.
    pub fn on_error<F: Fsm>(&self, attempt: i32, err: &StepError) -> Step<F> {
        self.retry_or_stop(attempt, err.to_string())
    }

    /// The delay before run number `attempt + 2`, after run `attempt + 1` failed.
    pub fn delay(&self, attempt: i32) -> Duration {
        match self.backoff {
            Some(f) => f(attempt).min(self.max_backoff),
            None => backoff_capped(attempt, self.max_backoff),
        }
    }

    fn retry_or_stop<F: Fsm>(&self, attempt: i32, msg: String) -> Step<F> {
        if attempt + 1 >= self.max_attempts {
            Step::stop(format!(
                "gave up after {} attempts: {msg}",
                self.max_attempts
            ))
        } else {
            Step::replay(self.delay(attempt)).with_error(msg)
        }
    }
}
