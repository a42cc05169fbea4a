//! `#[durable_steps]`: the impl block holding an FSM's step handlers.

mod expand;
mod parse;
mod rate;
mod validate;

use proc_macro2::TokenStream;

use crate::common::Errors;

pub(crate) fn expand(attr: TokenStream, item: TokenStream) -> TokenStream {
    let mut errors = Errors::default();
    let Some(input) = parse::parse(attr, item.clone(), &mut errors) else {
        let errs = errors.to_compile_errors();
        return quote::quote!(#errs #item);
    };
    let handlers = validate::validate(&input, &mut errors);
    expand::expand(input, &handlers, errors)
}
