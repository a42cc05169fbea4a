//! [`ShardedClient`]: one [`Client`] per PostgreSQL database (a *shard*), each instance
//! placed on the shard its key hashes to. The type's documentation holds the routing
//! contract (the hash, which never changes); docs/guide/scaling.md the deployment.

use std::fmt;
use std::future::{Future, IntoFuture};
use std::marker::PhantomData;
use std::pin::Pin;

use serde_json::Value;
use sqlx::PgExecutor;

use crate::client::wait::Wait;
use crate::client::{Client, SignalSend};
use crate::model::answers::Cancelled;
use crate::model::error::{Error, Result};
use crate::model::explain::Explanation;
use crate::model::options::InsertOptions;
use crate::model::target::Key;
use crate::runtime::fsm::Fsm;

/// An instance on a sharded deployment: its shard's index in the [`ShardedClient`] and
/// its id in that shard's database. Ids are per database, so the same `id` exists on
/// several shards; store both.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize, serde::Deserialize,
)]
pub struct ShardedId {
    /// The index of its shard in the list given to [`ShardedClient::new`].
    pub shard: usize,
    /// Its id in that shard's database.
    pub id: i64,
}

impl fmt::Display for ShardedId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "instance {} on shard {}", self.id, self.shard)
    }
}

/// How long a pool of [`ShardedClient::connect_lazy`] waits for a connection before its
/// call fails: a down shard's calls fail in this time, not in sqlx's default 30 s.
pub const SHARD_ACQUIRE_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(2);

/// [`Client`]s over several PostgreSQL databases (*shards*), routing each instance by a
/// stable hash of its key. Cheap to clone.
///
/// Every shard is a complete gen_durable database with its own engines; nothing crosses
/// shards. The engine inserts an instance's children in the database of their parent, so
/// a whole tree lives on its root's shard. This client only routes: an insert, a signal
/// or a wait by key goes to the key's shard, and an operation by id names the shard with
/// the id ([`ShardedId`]), since ids are per database. docs/guide/scaling.md says when to
/// shard and how to deploy it.
///
/// # The hash, which never changes
///
/// A key's shard is `jump_hash(fnv1a_64(the key's UTF-8 bytes), number of shards)`:
///
/// - **FNV-1a, 64 bits** (offset basis `0xcbf29ce484222325`, prime `0x100000001b3`), over
///   the key's bytes exactly, nothing appended. It is a published, fixed algorithm with
///   reference test vectors; std's `DefaultHasher` is not (its algorithm may change
///   between Rust releases, and `Hash for str` appends a byte).
/// - **Jump consistent hash** (Lamping and Veach, "A Fast, Minimal Memory, Consistent
///   Hash Algorithm", 2014, arXiv:1406.2294), as the paper's reference code: going from
///   `n` to `n + 1` shards moves only keys to the new shard, about `1/(n + 1)` of them,
///   where `hash % n` would move `n/(n + 1)`. Its floating-point steps are IEEE 754
///   double divisions, multiplications and conversions, correctly rounded on every
///   platform Rust supports, so a key has the same shard on every machine, and in any
///   port of the paper's code to another language (its unit test checks ClickHouse's
///   `jumpConsistentHash` answers).
///
/// Both are written out in this module rather than taken from a crate: they are a dozen
/// lines, and the placement of stored data must not move because a dependency changed. A
/// golden test (`gen_durable_suite/tests/client_sharded.rs`) pins the shard of fixed
/// keys; changing either function, the bytes hashed, or the order of the shards would be
/// a migration of every stored instance, never a refactor.
///
/// The order of the `Vec<Client>` is part of the routing: every process lists the same
/// databases in the same order, and a new shard is only ever appended.
///
/// ```no_run
/// # async fn demo<Checkout: gen_durable::Fsm>(
/// #     shard_0: sqlx::PgPool, shard_1: sqlx::PgPool, state: Checkout::State,
/// # ) -> gen_durable::Result<()> {
/// use gen_durable::{Client, Key, ShardedClient};
/// use serde_json::json;
///
/// let gd = ShardedClient::new(vec![Client::new(shard_0), Client::new(shard_1)])?;
/// // On the shard "order:42" hashes to, holding "order:42" as its correlation key.
/// let at = gd.insert::<Checkout>("order:42", state).await?;
/// gd.signal(Key("order:42"), "payment_confirmed", json!({ "amount": 100 })).await?;
/// let settled = gd.wait(Key("order:42")).await?;
/// gd.cancel(at).await?;
/// # Ok(()) }
/// ```
#[derive(Debug, Clone)]
pub struct ShardedClient {
    shards: Vec<Client>,
}

impl ShardedClient {
    /// A client over `shards`, one [`Client`] per database, in a fixed order: the index
    /// of a client in this list is its shard number, in routing and in [`ShardedId`].
    /// An empty list is [`Error::InvalidConfig`].
    pub fn new(shards: Vec<Client>) -> Result<Self> {
        if shards.is_empty() {
            return Err(Error::InvalidConfig(
                "a ShardedClient needs at least one shard (one Client per database)".into(),
            ));
        }
        // The jump hash's domain, as in the paper: a positive 32-bit bucket count.
        if i32::try_from(shards.len()).is_err() {
            return Err(Error::InvalidConfig(format!(
                "a ShardedClient routes over at most {} shards, got {}",
                i32::MAX,
                shards.len()
            )));
        }
        Ok(ShardedClient { shards })
    }

    /// A client over the databases at `urls`, in shard order, each through a pool that
    /// connects when first used and waits at most [`SHARD_ACQUIRE_TIMEOUT`] for a
    /// connection (sqlx's default is 30 s): a shard whose database is down fails its
    /// calls in that time, with [`Error::Shard`], while the others go on. For other
    /// pool settings, build each pool yourself (keep an `acquire_timeout` of a few
    /// seconds) and use [`ShardedClient::new`]. A URL that does not parse is
    /// [`Error::InvalidConfig`], naming its shard.
    pub fn connect_lazy<U: AsRef<str>>(urls: impl IntoIterator<Item = U>) -> Result<Self> {
        let clients = (urls.into_iter().enumerate())
            .map(|(shard, url)| {
                sqlx::postgres::PgPoolOptions::new()
                    .acquire_timeout(SHARD_ACQUIRE_TIMEOUT)
                    .connect_lazy(url.as_ref())
                    .map(Client::new)
                    .map_err(|e| Error::InvalidConfig(format!("shard {shard}: {e}")))
            })
            .collect::<Result<Vec<_>>>()?;
        ShardedClient::new(clients)
    }

    /// Every shard's client, in shard order.
    pub fn shards(&self) -> &[Client] {
        &self.shards
    }

    /// The shard `key` routes to: an index into [`ShardedClient::shards`]. The same on
    /// every process, platform and release for the same number of shards.
    pub fn shard_of(&self, key: &str) -> usize {
        // `new` bounds the count by i32::MAX; the answer is in 0..count.
        jump_hash(fnv1a_64(key.as_bytes()), self.shards.len() as i32) as usize
    }

    /// The client of the shard `key` routes to. Use it for what the routed operations
    /// below do not cover: an `insert_all` of entries routed to this shard, an insert
    /// inside a transaction on this shard's pool, or a signal to a child's key through
    /// its root's key (`gd.client(root_key).signal(Key(child_key), ..)`: a child lives on
    /// its parent's shard, whatever its own key hashes to).
    pub fn client(&self, key: &str) -> &Client {
        &self.shards[self.shard_of(key)]
    }

    /// The client of shard `index`, if there is one.
    pub fn shard(&self, index: usize) -> Option<&Client> {
        self.shards.get(index)
    }

    /// Starts an insert of one instance of `F` on the shard `key` routes to, holding
    /// `key` as its correlation key (so [`ShardedClient::signal`] and
    /// [`ShardedClient::wait`] find it by that key). Set other options, then `.await`
    /// it: it returns the instance's [`ShardedId`], or [`Error::Duplicate`] if the key
    /// is held, as [`Client::insert`] does.
    pub fn insert<F: Fsm>(&self, key: impl Into<String>, state: F::State) -> ShardedInsert<'_, F> {
        let key = key.into();
        let shard = self.shard_of(&key);
        ShardedInsert {
            client: &self.shards[shard],
            shard,
            key,
            state,
            opts: InsertOptions::default(),
            _fsm: PhantomData,
        }
    }

    /// Starts a signal delivery to the holder of correlation key `key`, on the shard the
    /// key routes to: [`Client::signal`] of that shard's client, with the same answers.
    pub fn signal<S: Into<String>>(
        &self,
        key: Key<S>,
        name: impl Into<String>,
        payload: Value,
    ) -> SignalSend<'_> {
        let key = key.0.into();
        let shard = self.shard_of(&key);
        self.shards[shard]
            .signal(Key(key), name, payload)
            .on_shard(shard)
    }

    /// Waits for the instance holding (or last inserted with) correlation key `key`, on
    /// the shard the key routes to: [`Client::wait`] of that shard's client.
    pub fn wait<S: Into<String>>(&self, key: Key<S>) -> Wait<'_> {
        let key = key.0.into();
        let shard = self.shard_of(&key);
        self.shards[shard].wait(Key(key)).on_shard(shard)
    }

    /// Why the instance holding (or last inserted with) correlation key `key` is not
    /// running, on the shard the key routes to: [`Client::explain`] of that shard's client.
    pub async fn explain<S: Into<String>>(&self, key: Key<S>) -> Result<Explanation> {
        let key = key.0.into();
        let shard = self.shard_of(&key);
        let explained = self.shards[shard].explain(Key(key)).await;
        explained.map_err(|e| e.on_shard(Some(shard)))
    }

    /// Why instance `at` is not running ([`Client::explain`] on its shard);
    /// [`Error::InvalidInput`] if its shard is not one of this client's.
    pub async fn explain_id(&self, at: ShardedId) -> Result<Explanation> {
        let explained = self.on(at)?.explain(at.id).await;
        explained.map_err(|e| e.on_shard(Some(at.shard)))
    }

    /// Starts a signal delivery to instance `at`; [`Error::InvalidInput`] if its shard
    /// is not one of this client's.
    pub fn signal_id(
        &self,
        at: ShardedId,
        name: impl Into<String>,
        payload: Value,
    ) -> Result<SignalSend<'_>> {
        Ok(self.on(at)?.signal(at.id, name, payload).on_shard(at.shard))
    }

    /// Waits for instance `at`; [`Error::InvalidInput`] if its shard is not one of this
    /// client's.
    pub fn wait_id(&self, at: ShardedId) -> Result<Wait<'_>> {
        Ok(self.on(at)?.wait(at.id).on_shard(at.shard))
    }

    /// Cancels instance `at` and its live children ([`Client::cancel`] on its shard).
    pub async fn cancel(&self, at: ShardedId) -> Result<Cancelled> {
        let cancelled = self.on(at)?.cancel(at.id).await;
        cancelled.map_err(|e| e.on_shard(Some(at.shard)))
    }

    /// Makes the failed instance `at` runnable again ([`Client::retry`] on its shard).
    pub async fn retry(&self, at: ShardedId) -> Result<()> {
        let retried = self.on(at)?.retry(at.id).await;
        retried.map_err(|e| e.on_shard(Some(at.shard)))
    }

    /// Waits for every shard's client's background work ([`Client::flush`]).
    pub async fn flush(&self) {
        for client in &self.shards {
            client.flush().await;
        }
    }

    /// The client of `at`'s shard.
    fn on(&self, at: ShardedId) -> Result<&Client> {
        self.shards
            .get(at.shard)
            .ok_or_else(|| Error::InvalidInput {
                what: "shard",
                reason: format!(
                    "{at} names shard {}, but this client has {} (0 to {})",
                    at.shard,
                    self.shards.len(),
                    self.shards.len() - 1
                ),
            })
    }
}

/// A pending insert on the shard of its key; see [`ShardedClient::insert`]. It has every
/// option of [`Client::insert`]; its correlation key is its routing key, so setting
/// another one (`correlation_key`, `unique_key` or `options`) is [`Error::InvalidInput`].
#[must_use = "an insert does nothing until awaited or executed"]
pub struct ShardedInsert<'c, F: Fsm> {
    client: &'c Client,
    shard: usize,
    key: String,
    state: F::State,
    opts: InsertOptions,
    _fsm: PhantomData<F>,
}

impl<F: Fsm> fmt::Debug for ShardedInsert<'_, F> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ShardedInsert")
            .field("fsm", &F::NAME)
            .field("shard", &self.shard)
            .field("key", &self.key)
            .field("opts", &self.opts)
            .finish_non_exhaustive()
    }
}

impl<'c, F: Fsm> ShardedInsert<'c, F> {
    crate::insert_option_setters!(opts);

    /// The shard this insert goes to.
    pub fn shard(&self) -> usize {
        self.shard
    }

    /// Runs the insert on `db`, which must be a connection of this shard's database
    /// (`gd.client(key).pool()`, or a transaction begun on it): a transaction on another
    /// shard would store the instance where no routed call finds it.
    pub async fn execute<'e>(self, db: impl PgExecutor<'e>) -> Result<ShardedId> {
        let shard = self.shard;
        let id = self.routed()?.execute(db).await;
        let id = id.map_err(|e| e.on_shard(Some(shard)))?;
        Ok(ShardedId { shard, id })
    }

    /// The routed client's insert, with the routing key as the correlation key.
    fn routed(self) -> Result<crate::client::Insert<'c, F>> {
        if let Some(other) = self.opts.unique_key.as_deref() {
            if other != self.key {
                return Err(Error::InvalidInput {
                    what: "correlation_key",
                    reason: format!(
                        "a sharded insert holds its routing key {:?} as its correlation key, \
                         so it cannot hold {other:?}",
                        self.key
                    ),
                });
            }
        }
        Ok(self
            .client
            .insert::<F>(self.state)
            .options(self.opts)
            .correlation_key(self.key))
    }
}

/// `.await` inserts on the shard's pool (alone: a keyed insert is never grouped).
impl<'c, F: Fsm> IntoFuture for ShardedInsert<'c, F> {
    type Output = Result<ShardedId>;
    type IntoFuture = Pin<Box<dyn Future<Output = Result<ShardedId>> + Send + 'c>>;
    fn into_future(self) -> Self::IntoFuture {
        let shard = self.shard;
        Box::pin(async move {
            let id = self.routed()?.await.map_err(|e| e.on_shard(Some(shard)))?;
            Ok(ShardedId { shard, id })
        })
    }
}

/// FNV-1a, 64 bits, over `bytes`: the first half of the routing hash. Fixed forever.
fn fnv1a_64(bytes: &[u8]) -> u64 {
    const OFFSET_BASIS: u64 = 0xcbf2_9ce4_8422_2325;
    const PRIME: u64 = 0x0000_0100_0000_01b3;
    bytes.iter().fold(OFFSET_BASIS, |hash, &b| {
        (hash ^ u64::from(b)).wrapping_mul(PRIME)
    })
}

/// Jump consistent hash of `key` into `buckets` (≥ 1) buckets, as the paper's reference
/// code: the second half of the routing hash. Fixed forever.
fn jump_hash(mut key: u64, buckets: i32) -> i32 {
    let buckets = i64::from(buckets);
    let (mut b, mut j) = (-1_i64, 0_i64);
    while j < buckets {
        b = j;
        key = key.wrapping_mul(2_862_933_555_777_941_757).wrapping_add(1);
        // (b + 1) ≤ 2^31 and the quotient ≤ 2^31: the product fits in an i64.
        j = ((b + 1) as f64 * ((1_u64 << 31) as f64 / ((key >> 33) + 1) as f64)) as i64;
    }
    b as i32
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The reference vectors of FNV-1a 64 (draft-eastlake-fnv, and the FNV authors' test
    /// suite).
    #[test]
    fn fnv1a_64_matches_the_reference_vectors() {
        assert_eq!(fnv1a_64(b""), 0xcbf2_9ce4_8422_2325);
        assert_eq!(fnv1a_64(b"a"), 0xaf63_dc4c_8601_ec8c);
        assert_eq!(fnv1a_64(b"foobar"), 0x8594_4171_f739_67e8);
    }

    /// The answers of another implementation of the paper's code: ClickHouse's
    /// `jumpConsistentHash` (its test `00580_consistent_hashing_functions`).
    #[test]
    fn jump_hash_matches_an_independent_implementation() {
        assert_eq!(jump_hash(1, 1), 0);
        assert_eq!(jump_hash(42, 57), 43);
        assert_eq!(jump_hash(256, 1024), 520);
        assert_eq!(jump_hash(3_735_883_980, 1), 0);
        assert_eq!(jump_hash(3_735_883_980, 666), 361);
        assert_eq!(jump_hash(16_045_690_984_833_335_023, 255), 237);
    }

    #[test]
    fn one_bucket_takes_every_key_and_every_bucket_is_reached() {
        for key in 0..1_000_u64 {
            assert_eq!(jump_hash(key, 1), 0);
        }
        let mut seen = [0_u32; 7];
        for i in 0..7_000 {
            seen[jump_hash(fnv1a_64(format!("order:{i}").as_bytes()), 7) as usize] += 1;
        }
        // 1,000 expected per bucket; a fair hash stays well within ±15%.
        assert!(seen.iter().all(|&n| (850..1_150).contains(&n)), "{seen:?}");
    }

    /// Growing from n to n + 1 buckets moves keys only to the new bucket, about
    /// 1/(n + 1) of them: the property a migration to one more shard relies on.
    #[test]
    fn one_more_bucket_moves_keys_only_to_it() {
        for n in 1..12_i32 {
            let mut moved = 0;
            for i in 0..5_000 {
                let h = fnv1a_64(format!("key-{i}").as_bytes());
                let (before, after) = (jump_hash(h, n), jump_hash(h, n + 1));
                if before != after {
                    assert_eq!(after, n, "a key moved between two old buckets");
                    moved += 1;
                }
            }
            let expected = 5_000 / (n + 1);
            assert!(
                moved > expected * 8 / 10 && moved < expected * 12 / 10,
                "{n} → {}: {moved} moved, ~{expected} expected",
                n + 1
            );
        }
    }
}
