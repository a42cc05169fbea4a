//! `#[durable_fsm]`: an enum whose variants are the steps of a durable FSM.

mod expand;
mod parse;
mod validate;

use proc_macro2::TokenStream;

use crate::common::Errors;

/// Parses, validates and expands; on errors emits the enum (helper attributes
/// stripped), as much of the impl as can still be generated, and the errors.
pub(crate) fn expand(attr: TokenStream, item: TokenStream) -> TokenStream {
    let mut errors = Errors::default();
    let input = match parse::parse(attr, item.clone(), &mut errors) {
        Some(input) => input,
        None => {
            let errs = errors.to_compile_errors();
            return quote::quote!(#errs #item);
        }
    };
    let model = validate::validate(&input, &mut errors);
    expand::expand(&input, model.as_ref(), &errors)
}
