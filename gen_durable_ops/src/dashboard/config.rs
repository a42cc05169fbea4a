//! How a dashboard is served: read-only or with an operator token, its sign-in sessions'
//! lifetime, whether its cookies are `Secure`, the clock they run on, and `/metrics`.

use std::fmt;
use std::time::Duration;

use gen_durable::Clock;

/// The shortest operator token accepted, in bytes: 32 bytes of `openssl rand -hex 32`
/// carry 128 bits, out of reach of guessing even without the wrong-token limit.
pub const MIN_OPERATOR_TOKEN_LEN: usize = 32;

/// How long a sign-in lasts unless [`DashboardConfig::with_session_ttl`] says otherwise:
/// a working day, so that an operator signs in about once a day and a copied cookie is
/// worth at most that long.
pub const DEFAULT_SESSION_TTL: Duration = Duration::from_secs(12 * 60 * 60);

/// The longest sign-in: browsers cap a cookie's `Max-Age` at 400 days.
const MAX_SESSION_TTL: Duration = Duration::from_secs(400 * 24 * 60 * 60);

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
/// # fn build() -> Result<(), gen_durable_ops::dashboard::DashboardConfigError> {
/// use std::time::Duration;
/// use gen_durable_ops::dashboard::DashboardConfig;
/// let token = "0123456789abcdef0123456789abcdef"; // openssl rand -hex 32, in real life
/// let config = DashboardConfig::new()
///     .with_operator_token(token)?
///     .with_session_ttl(Duration::from_secs(8 * 60 * 60))
///     .secure_cookies(true); // served over TLS, or behind a TLS proxy
/// assert!(!config.is_read_only());
/// # Ok(()) }
/// # build().unwrap();
/// ```
#[derive(Clone)]
pub struct DashboardConfig {
    pub(crate) operator_token: Option<String>,
    pub(crate) metrics: Option<gen_durable::metrics::PrometheusHandle>,
    pub(crate) session_ttl: Duration,
    pub(crate) secure_cookies: bool,
    pub(crate) clock: Clock,
}

impl Default for DashboardConfig {
    fn default() -> Self {
        DashboardConfig {
            operator_token: None,
            metrics: None,
            session_ttl: DEFAULT_SESSION_TTL,
            secure_cookies: false,
            clock: Clock::database(),
        }
    }
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

    /// How long a sign-in lasts ([`DEFAULT_SESSION_TTL`] unless set): the server forgets
    /// the session then, and the cookie's `Max-Age` says the same. Rounded up to whole
    /// seconds (what `Max-Age` counts), and kept between 1 s and 400 days (what browsers
    /// allow). The bearer header is not affected: it carries the token itself.
    pub fn with_session_ttl(mut self, ttl: Duration) -> Self {
        let secs = ttl.as_secs() + u64::from(ttl.subsec_nanos() > 0);
        self.session_ttl = Duration::from_secs(secs).clamp(Duration::from_secs(1), MAX_SESSION_TTL);
        self
    }

    /// Marks the cookies (sign-in and CSRF) `Secure`, so that a browser sends them only
    /// over HTTPS. Turn it on when the dashboard is served over TLS or behind a TLS
    /// proxy (`gen_durable dashboard --secure-cookies`); left off, the cookies also work
    /// on `http://localhost`.
    pub fn secure_cookies(mut self, secure: bool) -> Self {
        self.secure_cookies = secure;
        self
    }

    /// The clock the dashboard's in-memory time runs on: sign-in expiry and the
    /// wrong-token window. By default the process's monotonic clock; a
    /// [`Clock::manual`] lets a test move time (the pages still read the database's
    /// `now()`).
    pub fn with_clock(mut self, clock: Clock) -> Self {
        self.clock = clock;
        self
    }

    /// Serves `/metrics` from `handle` (see [`gen_durable::metrics::install_prometheus`]): the
    /// engine metrics this process records, and the queue gauges read at each scrape.
    pub fn with_metrics(mut self, handle: gen_durable::metrics::PrometheusHandle) -> Self {
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
            .field("session_ttl", &self.session_ttl)
            .field("secure_cookies", &self.secure_cookies)
            .field("clock", &self.clock)
            .finish()
    }
}
