//! Procedural macros for gen_durable. See the `gen_durable` crate for documentation.
use proc_macro::TokenStream;

/// Declares a durable FSM on an enum. Placeholder until the DSL lands.
#[proc_macro_attribute]
pub fn durable_fsm(_attr: TokenStream, item: TokenStream) -> TokenStream {
    item
}
