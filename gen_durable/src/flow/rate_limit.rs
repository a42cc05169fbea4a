//! Rate limits on a client: declaring one (or changing it) and reading its buckets. What a
//! rate limit is, and its limits, are the contract's (`model::rate_limit`).

use crate::model::error::Result;
use crate::model::rate_limit::{BucketUse, RateLimit};
use crate::store::pg;
use crate::Client;

impl Client {
    /// Declares rate limit `name`, or changes it; true if written (new or changed).
    /// Lets a client insert rate-limited rows before any engine declared the limit.
    pub async fn set_rate_limit(&self, name: &str, limit: RateLimit) -> Result<bool> {
        limit.check(name)?;
        let limits = [(name.to_string(), limit.per_second(), limit.capacity())];
        let db = self.pooler().pool(self.pool());
        Ok(pg::rate_limit::declare(db, &limits, self.clock().now_param()).await? > 0)
    }

    /// Every declared rate limit with its buckets and their tokens now.
    pub async fn rate_limits(&self) -> Result<Vec<BucketUse>> {
        let db = self.pooler().pool(self.pool());
        pg::rate_limit::buckets(db, self.clock().now_param()).await
    }
}
