//! The claim's statements, each a call of a function of `gen_durable/sql/claim.sql`, and
//! the statement inside each function as PostgreSQL prepares it ([`body`]).

/// The claim functions' definitions as they are now.
const FUNCTIONS: &str = include_str!("../../../../sql/claim.sql");

/// A `FROM` item that sets `synchronous_commit` off until the end of the statement's
/// transaction: a call in the statement itself, since the `SET` clauses of the claim
/// functions would undo a `SET LOCAL` made inside them when they return, before the commit.
macro_rules! without_flush {
    () => {
        "set_config('synchronous_commit', 'off', true) AS without_flush"
    };
}

/// Claims up to `$4` runnable rows of queue `$1` in one statement, and returns each with
/// its inbox and children, so a pick is one round trip whatever its size: the function
/// `gd_claim`, while a gate or a rate limit is declared.
///
/// The statement is the body of the function (in `gen_durable/sql/claim.sql`, whose
/// comments explain each of its CTEs; [`body`] returns it), so that PostgreSQL plans it
/// once per connection and not on every call: sent as a prepared statement it was planned
/// anew each time, 2.4–2.7 ms of a claim. The function's settings keep that plan on the
/// indexes whatever the table held when it was made, and out of JIT.
///
/// What it does, in short: it locks at most the batch (`FOR NO KEY UPDATE SKIP LOCKED`,
/// through the pick index, in `(priority, eligible_at, id)` order) of the rows this node can
/// run, skipping a paused queue, keys that already run (K = 1) and full gate keys; claims
/// the first row per K = 1 key and up to its room per gate key, each into a free slot;
/// debits the rate limits' buckets, deferring the rows whose tokens are not there yet
/// (they reserve them); bumps `lease_epoch`, which fences every later write of this
/// worker; and returns the rows handed back (`contended`), the rate limits' tally
/// (`throttled`), when the next deferred row is due, and whether any gate or rate limit is
/// declared (`flow`). While no gate is declared it hands the claim to `gd_claim_rated`,
/// the same statement without the gates' CTEs.
///
/// The claim commits without waiting for its WAL flush: `synchronous_commit` is off for its
/// transaction (`without_flush!`). A claim is the one write of the engine that a server
/// crash may forget without harm: the row is back as it was, runnable, and the worker that
/// claimed it cannot commit its outcome (the fence; an epoch is never given twice, even by
/// a forgotten claim: `gd_lease_epoch`), so its step runs again, as after a worker's crash.
/// Every later commit of the row's outcome waits for its flush, which carries the claim's
/// WAL with it (docs/design/reliability.md, "What a server crash may forget").
pub(crate) const CLAIM: &str = concat!(
    "/* gd:claim */ SELECT c.* FROM ",
    without_flush!(),
    ", gd_claim($1, $2, $3, $4, $5, $6, $7) c"
);

/// [`CLAIM`] without gates and rate limits, for as long as none is declared: the function
/// `gd_claim_plain`, which skips their CTEs (planned, they made a claim 5× as long to plan,
/// 2.4–2.7 ms against 0.4–0.5 ms, before the claim's plan was reused; run, they still
/// cost each claim their probes and sorts).
///
/// With no gate declared no row can name one (the reference triggers), and likewise for
/// rate limits; the filter on both is belt and braces. Each variant says in `flow` whether
/// any gate or rate limit is declared now (two probes of tiny tables), and returns its
/// summary row when the engine should switch (this one when one is, `CLAIM` when none
/// is), so a gate declared by another process is used from the next pick on.
pub(crate) const CLAIM_PLAIN: &str = concat!(
    "/* gd:claim */ SELECT c.* FROM ",
    without_flush!(),
    ", gd_claim_plain($1, $2, $3, $4, $5, $6, $7) c"
);

/// The statement inside claim function `function` (`gd_claim`, `gd_claim_rated` or
/// `gd_claim_plain`) as `gen_durable/sql/claim.sql` defines it and PostgreSQL prepares it,
/// with its marker: for the plan tests and the SQL audit's probes. (`gd_claim`'s first
/// `RETURN QUERY`, the call of `gd_claim_rated`, is on one line and not taken.)
pub(crate) fn body(function: &str) -> String {
    let head = format!("CREATE OR REPLACE FUNCTION {function}(");
    let at = FUNCTIONS
        .find(&head)
        .unwrap_or_else(|| panic!("no function {function} in sql/claim.sql"));
    let text = &FUNCTIONS[at..];
    let start = text.find("RETURN QUERY\n").expect("its RETURN QUERY") + "RETURN QUERY\n".len();
    let end = start + text[start..].find(";\nEND").expect("its END");
    format!("/* gd:claim */\n{}", &text[start..end])
}
