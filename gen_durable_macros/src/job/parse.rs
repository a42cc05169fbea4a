//! Parsing `#[durable_job(...)] async fn …`.

use proc_macro2::{Span, TokenStream};
use syn::ItemFn;

use crate::common::{parse_args, Arg, Errors};

pub(super) struct JobInput {
    pub(super) args: Vec<Arg>,
    pub(super) item: ItemFn,
}

/// `None` when the item is not a function (the error is in `errors`).
pub(super) fn parse(attr: TokenStream, item: TokenStream, errors: &mut Errors) -> Option<JobInput> {
    let item: ItemFn = match syn::parse2(item) {
        Ok(item) => item,
        Err(_) => {
            errors.at(
                Span::call_site(),
                "`#[durable_job]` goes on a free async fn: `async fn send_welcome(args: WelcomeArgs, ctx: &mut JobCtx) -> JobResult`",
            );
            return None;
        }
    };
    let args = match parse_args(attr) {
        Ok(args) => args,
        Err(err) => {
            errors.push(err);
            Vec::new()
        }
    };
    Some(JobInput { args, item })
}
