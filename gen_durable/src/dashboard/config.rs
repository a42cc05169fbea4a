//! How a dashboard is served: read-only or with an operator token, and `/metrics`.

use std::fmt;

/// The shortest operator token accepted, in bytes: 32 bytes of `openssl rand -hex 32`
/// carry 128 bits, out of reach of guessing even without the wrong-token limit.
pub const MIN_OPERATOR_TOKEN_LEN: usize = 32;

/// Why a [`DashboardConfig`] was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum DashboardConfigError {
    /// The operator token is shorter than [`MIN_OPERATOR_TOKEN_LEN`] bytes.
    #[error(
        "the operator token is {len} bytes long; it must be at least {} bytes: make one with \
         `openssl rand -hex 32`",
        MIN_OPERATOR_TOKEN_LEN
    )]
    TokenTooShort {
        /// The length of the token given, in bytes.
        len: usize,
    },
}

/// How a dashboard is served: read-only unless it has an operator token.
///
/// ```
/// # fn build() -> Result<(), gen_durable::dashboard::DashboardConfigError> {
/// use gen_durable::dashboard::DashboardConfig;
/// let token = "0123456789abcdef0123456789abcdef"; // openssl rand -hex 32, in real life
/// let config = DashboardConfig::new().with_operator_token(token)?;
/// assert!(!config.is_read_only());
/// # Ok(()) }
/// # build().unwrap();
/// ```
#[derive(Clone, Default)]
pub struct DashboardConfig {
    pub(crate) operator_token: Option<String>,
    pub(crate) metrics: Option<crate::metrics::PrometheusHandle>,
}

impl DashboardConfig {
    /// A read-only dashboard.
    pub fn new() -> Self {
        Self::default()
    }

    /// Lets an operator who presents `token` act (cancel, retry, signal, …).
    ///
    /// Refused with [`DashboardConfigError::TokenTooShort`] when `token` is shorter than
    /// [`MIN_OPERATOR_TOKEN_LEN`] bytes (an empty one included: for a read-only
    /// dashboard, do not call this). The check is here, where the token is given, so
    /// that a weak token stops the program before it serves anything.
    pub fn with_operator_token(
        mut self,
        token: impl Into<String>,
    ) -> Result<Self, DashboardConfigError> {
        let token = token.into();
        if token.len() < MIN_OPERATOR_TOKEN_LEN {
            return Err(DashboardConfigError::TokenTooShort { len: token.len() });
        }
        self.operator_token = Some(token);
        Ok(self)
    }

    /// Serves `/metrics` from `handle` (see [`crate::metrics::install_prometheus`]): the
    /// engine metrics this process records, and the queue gauges read at each scrape.
    pub fn with_metrics(mut self, handle: crate::metrics::PrometheusHandle) -> Self {
        self.metrics = Some(handle);
        self
    }

    /// Whether actions are refused.
    pub fn is_read_only(&self) -> bool {
        self.operator_token.is_none()
    }
}

impl fmt::Debug for DashboardConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DashboardConfig")
            .field(
                "operator_token",
                &self.operator_token.as_ref().map(|_| "<redacted>"),
            )
            .field("metrics", &self.metrics.is_some())
            .finish()
    }
}
