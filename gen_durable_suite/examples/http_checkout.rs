//! A checkout behind HTTP: an axum handler inserts the workflow under the order's
//! correlation key and answers when it has settled — `200` with the result, or `202` with
//! `Retry-After` while it still works — and the payment webhook signals the order by its
//! key, never by an internal id.
//!
//! ```sh
//! cargo run --example http_checkout            # serves 5 scripted orders, then exits
//! cargo run --example http_checkout -- 20      # 20 orders
//! cargo run --example http_checkout -- serve   # keeps serving on 127.0.0.1:3000
//! ```
//!
//! | request | answer |
//! |---|---|
//! | `POST /orders/{n}` | inserts order n (key `order:{n}`); `202` once it awaits payment, `409` if it exists |
//! | `POST /orders/{n}/pay` | signals `paid` to the key; `200` with the result once shipped, `202` while working, `404` for no such order |
//! | `GET /orders/{n}` | where the order stands: `200` done, `202` working or waiting, `410` failed, `404` unknown |
//!
//! Uses `DATABASE_URL`'s server (default: the local one) and its own database there,
//! `gen_durable_examples`, which it creates and migrates.

use std::time::Duration;

mod common;

use axum::extract::{Path, State};
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use axum::{Json, Router};
use gen_durable::prelude::*;
use gen_durable::{Error, Settled};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

#[derive(DurableState, Serialize, Deserialize, Default, Debug, Clone)]
pub struct Order {
    pub order: u64,
    #[durable(default)]
    pub paid: Option<u64>,
}

#[durable_fsm(state = Order, queue = "web", version = 1)]
pub enum WebCheckout {
    #[initial]
    Reserve,
    Ship,
}

#[durable_steps]
impl WebCheckout {
    async fn reserve(_ctx: &mut Ctx<Self>) -> StepResult<Self> {
        Ok(Step::await_signal(["paid"], WebCheckout::Ship).timeout(Duration::from_secs(600)))
    }

    async fn ship(ctx: &mut Ctx<Self>) -> StepResult<Self> {
        let Some(amount) = ctx
            .awaited()
            .first()
            .and_then(|s| s.payload()["amount"].as_u64())
        else {
            return Ok(Step::stop("no payment in time"));
        };
        ctx.state.paid = Some(amount);
        Ok(Step::done(
            json!({ "order": ctx.state.order, "shipped": true, "paid": amount }),
        ))
    }
}

/// How long a request waits for the workflow before answering `202`.
const PATIENCE: Duration = Duration::from_secs(2);

fn key(n: u64) -> Key<String> {
    Key(format!("order:{n}"))
}

/// The HTTP answer for where an order stands.
fn answer(settled: Settled) -> Response {
    let working = |body: serde_json::Value| {
        (
            StatusCode::ACCEPTED,
            [(header::RETRY_AFTER, "1")],
            Json(body),
        )
            .into_response()
    };
    match settled {
        Settled::Done(result) => (StatusCode::OK, Json(result)).into_response(),
        Settled::Parked { step, .. } => working(json!({ "waiting": "payment", "step": step })),
        Settled::Busy { status, step, .. } => {
            working(json!({ "working": status.as_str(), "step": step }))
        }
        Settled::Failed(error) => {
            (StatusCode::GONE, Json(json!({ "failed": error }))).into_response()
        }
        Settled::Gone => StatusCode::NOT_FOUND.into_response(),
    }
}

fn error(e: Error) -> Response {
    let status = match e {
        Error::KeyNotFound { .. } | Error::NotFound { .. } => StatusCode::NOT_FOUND,
        Error::Duplicate { .. } | Error::Finished { .. } => StatusCode::CONFLICT,
        Error::InvalidInput { .. } | Error::InvalidSignalName { .. } => StatusCode::BAD_REQUEST,
        _ => StatusCode::INTERNAL_SERVER_ERROR,
    };
    (status, Json(json!({ "error": e.to_string() }))).into_response()
}

async fn create(State(gd): State<Client>, Path(n): Path<u64>) -> Response {
    let inserted = gd
        .insert::<WebCheckout>(Order {
            order: n,
            paid: None,
        })
        .correlation_key(key(n).0)
        .await;
    match inserted {
        Ok(id) => match gd.wait(id).timeout(PATIENCE).await {
            Ok(settled) => answer(settled),
            Err(e) => error(e),
        },
        Err(e) => error(e),
    }
}

async fn pay(State(gd): State<Client>, Path(n): Path<u64>) -> Response {
    let paid = gd
        .signal(key(n), "paid", json!({ "amount": 100 + n }))
        .dedup_key(format!("payment-{n}"))
        .await;
    match paid {
        Ok(_) => match gd.wait(key(n)).until_terminal().timeout(PATIENCE).await {
            Ok(settled) => answer(settled),
            Err(e) => error(e),
        },
        Err(e) => error(e),
    }
}

async fn show(State(gd): State<Client>, Path(n): Path<u64>) -> Response {
    match gd.wait(key(n)).timeout(Duration::ZERO).await {
        Ok(settled) => answer(settled),
        Err(e) => error(e),
    }
}

fn router(gd: Client) -> Router {
    Router::new()
        .route("/orders/{n}", post(create).get(show))
        .route("/orders/{n}/pay", post(pay))
        .with_state(gd)
}

/// One request over a fresh connection: the status code and the body.
async fn request(
    addr: std::net::SocketAddr,
    method: &str,
    path: &str,
) -> std::io::Result<(u16, String, String)> {
    let mut stream = TcpStream::connect(addr).await?;
    let head = format!(
        "{method} {path} HTTP/1.1\r\nhost: {addr}\r\ncontent-length: 0\r\nconnection: close\r\n\r\n"
    );
    stream.write_all(head.as_bytes()).await?;
    let mut raw = String::new();
    stream.read_to_string(&mut raw).await?;
    let code = raw
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    let (head, body) = raw.split_once("\r\n\r\n").unwrap_or((&raw, ""));
    Ok((code, head.to_ascii_lowercase(), body.to_string()))
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let serve = std::env::args().nth(1).as_deref() == Some("serve");
    let orders = if serve { 0 } else { common::size_arg(5) };
    let pool = common::connect().await?;
    // Earlier runs left their orders holding their keys: start from a clean slate.
    sqlx::query("DELETE FROM gd_instances WHERE fsm = 'WebCheckout'")
        .execute(&pool)
        .await?;

    let engine = Engine::builder(pool.clone())
        .queue("web", 10)
        .start()
        .await?;
    let gd = Client::new(pool.clone());
    let listener = TcpListener::bind(if serve {
        "127.0.0.1:3000"
    } else {
        "127.0.0.1:0"
    })
    .await?;
    let addr = listener.local_addr()?;
    let server = tokio::spawn(async move { axum::serve(listener, router(gd)).await });
    println!("serving on http://{addr}");

    if serve {
        tokio::signal::ctrl_c().await?;
    } else {
        for n in 1..=orders {
            let (code, head, body) = request(addr, "POST", &format!("/orders/{n}")).await?;
            println!("POST /orders/{n}      -> {code} {body}");
            assert_eq!(code, 202, "a new order waits for its payment");
            assert!(
                head.contains("\r\nretry-after: 1"),
                "a 202 says when to ask again"
            );
            let (code, _, _) = request(addr, "POST", &format!("/orders/{n}")).await?;
            assert_eq!(code, 409, "the key is held while the order lives");
            let (code, _, body) = request(addr, "POST", &format!("/orders/{n}/pay")).await?;
            println!("POST /orders/{n}/pay  -> {code} {body}");
            assert_eq!(code, 200, "paid: the handler answers with the result");
        }
        // A finished order is still found by its key (the newest row that had it).
        let (code, _, body) = request(addr, "GET", "/orders/1").await?;
        println!("GET  /orders/1      -> {code} {body}");
        assert_eq!(code, 200);
        let unknown = orders + 1;
        let (code, _, _) = request(addr, "POST", &format!("/orders/{unknown}/pay")).await?;
        println!("POST /orders/{unknown}/pay  -> {code} (no such order)");
        assert_eq!(code, 404);
    }
    server.abort();
    engine.shutdown(Duration::from_secs(10)).await;
    Ok(())
}
