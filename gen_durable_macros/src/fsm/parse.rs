//! Parsing `#[durable_fsm(...)] enum …` into its arguments and variants.

use proc_macro2::TokenStream;
use syn::{Attribute, Fields, Ident, ItemEnum};

use crate::common::{parse_args, Arg, Errors};

/// The attribute's arguments and the enum, with `#[initial]` / `#[step]` taken off
/// the variants (they are ours, not attributes the compiler knows).
pub(super) struct FsmInput {
    pub(super) args: Vec<Arg>,
    /// False if the arguments did not parse: then "missing `state`" would be noise.
    pub(super) args_ok: bool,
    pub(super) item: ItemEnum,
    pub(super) variants: Vec<VariantInput>,
}

pub(super) struct VariantInput {
    pub(super) ident: Ident,
    pub(super) fields: Fields,
    pub(super) initial: Vec<Attribute>,
    pub(super) step: Vec<Attribute>,
}

/// `None` when the item is not an enum (the error is in `errors`).
pub(super) fn parse(attr: TokenStream, item: TokenStream, errors: &mut Errors) -> Option<FsmInput> {
    let mut item: ItemEnum = match syn::parse2(item) {
        Ok(item) => item,
        Err(_) => {
            errors.at(
                proc_macro2::Span::call_site(),
                "`#[durable_fsm]` goes on an enum whose variants are the steps, e.g. `enum Checkout { #[initial] Reserve, Ship }`",
            );
            return None;
        }
    };
    let (args, args_ok) = match parse_args(attr) {
        Ok(args) => (args, true),
        Err(err) => {
            errors.push(err);
            (Vec::new(), false)
        }
    };
    let mut variants = Vec::new();
    for variant in &mut item.variants {
        let (mut initial, mut step, mut rest) = (Vec::new(), Vec::new(), Vec::new());
        for attr in variant.attrs.drain(..) {
            if attr.path().is_ident("initial") {
                initial.push(attr);
            } else if attr.path().is_ident("step") {
                step.push(attr);
            } else {
                rest.push(attr);
            }
        }
        variant.attrs = rest;
        variants.push(VariantInput {
            ident: variant.ident.clone(),
            fields: variant.fields.clone(),
            initial,
            step,
        });
    }
    Some(FsmInput {
        args,
        args_ok,
        item,
        variants,
    })
}
