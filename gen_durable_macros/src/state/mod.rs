//! `#[derive(DurableState)]`: casting JSON into a state, with field-path errors.

mod expand;
mod parse;
mod validate;

use proc_macro2::TokenStream;

use crate::common::Errors;

pub(crate) fn expand(item: TokenStream) -> TokenStream {
    let mut errors = Errors::default();
    let input = match syn::parse2(item) {
        Ok(input) => input,
        Err(err) => return err.to_compile_error(),
    };
    let parsed = parse::parse(input, &mut errors);
    let model = validate::validate(parsed, &mut errors);
    let errs = errors.to_compile_errors();
    let out = expand::expand(&model);
    quote::quote!(#errs #out)
}
