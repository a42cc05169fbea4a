//! `?live=N` on a page: it reloads itself every N seconds, and the header's "Live" link
//! turns that on and off, keeping the rest of the address (filters, cursor). A meta
//! refresh, not a script: the pages run none, and the policy allows none.

use axum::extract::FromRequestParts;
use axum::http::request::Parts;

use super::error::DashboardError;

/// The reload period the "Live" link turns on.
pub(crate) const DEFAULT_EVERY: u32 = 10;
/// The periods `?live=` takes, in seconds.
const EVERY_RANGE: std::ops::RangeInclusive<u32> = 2..=300;

/// Whether the page reloads itself, and the address that toggles it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Live {
    /// Seconds between reloads; `None`: the page stays as it is.
    pub(crate) every: Option<u32>,
    /// The same page with reloading switched the other way.
    pub(crate) toggle: String,
}

impl Live {
    /// Reads `?live=` from a path and query; other parameters are kept as they are.
    pub(crate) fn parse(path: &str, query: Option<&str>) -> Result<Live, DashboardError> {
        let mut every = None;
        let mut rest: Vec<&str> = Vec::new();
        for pair in query
            .unwrap_or_default()
            .split('&')
            .filter(|p| !p.is_empty())
        {
            match pair.strip_prefix("live=") {
                Some(v) => {
                    let n = v
                        .parse::<u32>()
                        .ok()
                        .filter(|n| EVERY_RANGE.contains(n))
                        .ok_or_else(|| {
                            DashboardError::BadRequest(format!(
                                "live={v}: give the seconds between reloads, from {} to {}",
                                EVERY_RANGE.start(),
                                EVERY_RANGE.end()
                            ))
                        })?;
                    every = Some(n);
                }
                None => rest.push(pair),
            }
        }
        let mut params: Vec<String> = rest.iter().map(|p| p.to_string()).collect();
        if every.is_none() {
            params.push(format!("live={DEFAULT_EVERY}"));
        }
        let toggle = if params.is_empty() {
            path.to_string()
        } else {
            format!("{path}?{}", params.join("&"))
        };
        Ok(Live { every, toggle })
    }
}

impl<S: Send + Sync> FromRequestParts<S> for Live {
    type Rejection = DashboardError;

    async fn from_request_parts(parts: &mut Parts, _: &S) -> Result<Self, Self::Rejection> {
        Live::parse(parts.uri.path(), parts.uri.query())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_toggle_keeps_the_other_parameters() {
        let off = Live::parse("/instances", Some("status=failed&after=9")).unwrap();
        assert_eq!(off.every, None);
        assert_eq!(off.toggle, "/instances?status=failed&after=9&live=10");
        let on = Live::parse("/instances", Some("live=5&status=failed")).unwrap();
        assert_eq!(on.every, Some(5));
        assert_eq!(on.toggle, "/instances?status=failed");
        assert_eq!(Live::parse("/", None).unwrap().toggle, "/?live=10");
        assert_eq!(Live::parse("/", Some("live=30")).unwrap().toggle, "/");
        for bad in ["live=0", "live=1", "live=301", "live=soon", "live="] {
            assert!(Live::parse("/", Some(bad)).is_err(), "{bad}");
        }
    }
}
