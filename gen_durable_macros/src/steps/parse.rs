//! Parsing `#[durable_steps] impl Fsm { … }`.

use proc_macro2::{Span, TokenStream};
use syn::ItemImpl;

use crate::common::Errors;

pub(super) struct StepsInput {
    pub(super) item: ItemImpl,
}

/// `None` when the item is not an inherent impl block (the error is in `errors`).
pub(super) fn parse(
    attr: TokenStream,
    item: TokenStream,
    errors: &mut Errors,
) -> Option<StepsInput> {
    if !attr.is_empty() {
        errors.spanned(
            &attr,
            "`#[durable_steps]` takes no arguments: write `#[durable_steps]`",
        );
    }
    let item: ItemImpl = match syn::parse2(item) {
        Ok(item) => item,
        Err(_) => {
            errors.at(
                Span::call_site(),
                "`#[durable_steps]` goes on the FSM's impl block: `#[durable_steps] impl Checkout { async fn reserve(ctx: &mut Ctx<Self>) -> StepResult<Self> { … } }`",
            );
            return None;
        }
    };
    if let Some((_, path, _)) = &item.trait_ {
        errors.spanned(
            path,
            "`#[durable_steps]` goes on an inherent impl block (`impl Checkout { … }`), not a trait impl",
        );
        return None;
    }
    Some(StepsInput { item })
}
