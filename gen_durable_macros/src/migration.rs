//! `#[durable_migration]`: keeps an `impl Migration for NewVersion` as written and
//! registers it, so that every node and the CLI built into the user's binary know it.
//! The checks that matter are the compiler's: the step map's `match` must be exhaustive,
//! and `MigrationEntry::of` refuses (at compile time) a migration between two FSM names
//! or to a version not above its source.

use proc_macro2::TokenStream;
use quote::quote;
use syn::spanned::Spanned;
use syn::ItemImpl;

pub(crate) fn expand(attr: TokenStream, item: TokenStream) -> TokenStream {
    if !attr.is_empty() {
        return syn::Error::new(attr.span(), "#[durable_migration] takes no arguments")
            .to_compile_error();
    }
    let item: ItemImpl = match syn::parse2(item) {
        Ok(item) => item,
        Err(e) => {
            return syn::Error::new(
                e.span(),
                "#[durable_migration] goes on an `impl Migration for NewVersion { … }` block",
            )
            .to_compile_error()
        }
    };
    let is_migration = item
        .trait_
        .as_ref()
        .and_then(|(_, path, _)| path.segments.last())
        .is_some_and(|seg| seg.ident == "Migration");
    if !is_migration {
        return syn::Error::new(
            item.self_ty.span(),
            "#[durable_migration] goes on an `impl Migration for NewVersion { … }` block",
        )
        .to_compile_error();
    }
    if !item.generics.params.is_empty() {
        return syn::Error::new(
            item.generics.span(),
            "a migration is between two concrete FSM versions: no generics",
        )
        .to_compile_error();
    }
    let ty = &item.self_ty;
    quote! {
        #item

        ::gen_durable::__private::inventory::submit! {
            ::gen_durable::__private::MigrationEntry::of::<#ty>()
        }
    }
}
