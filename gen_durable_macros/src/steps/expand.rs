//! Wrapping each handler of a `#[durable_steps]` block in a boxed, `Send`-checked
//! step function, and implementing the hidden `DurableSteps` for the FSM.
//!
//! `async fn reserve(ctx: &mut Ctx<Self>) -> StepResult<Self> { … }` becomes
//!
//! ```text
//! #[doc(hidden)] async fn __step_reserve(ctx: &mut Ctx<Self>) -> StepResult<Self> { … }
//! fn reserve<'a>(ctx: &'a mut Ctx<Self>) -> StepFuture<'a, Self> { Box::pin(Self::__step_reserve(ctx)) }
//! ```
//!
//! so the FSM's `run_step` calls `Self::reserve(ctx)` by the name the user wrote, and
//! every type error of the handler (argument, return type, a future that is not
//! `Send`) is reported in the wrapper, spanned on the handler's own tokens.

use proc_macro2::TokenStream;
use quote::{format_ident, quote, quote_spanned};
use syn::spanned::Spanned;
use syn::{FnArg, ImplItem, ImplItemFn};

use super::parse::StepsInput;
use super::rate;
use super::validate::Handler;
use crate::common::Errors;

pub(super) fn expand(input: StepsInput, handlers: &[Handler], mut errors: Errors) -> TokenStream {
    let mut item = input.item;
    let mut rates = Vec::new();
    let self_ty = item.self_ty.clone();
    let mut has_handle = false;
    let mut new_items: Vec<ImplItem> = Vec::new();
    for (index, impl_item) in item.items.drain(..).enumerate() {
        let ImplItem::Fn(mut f) = impl_item else {
            new_items.push(impl_item);
            continue;
        };
        match handlers.iter().find(|h| h.index == index) {
            Some(handler) => {
                if let Some(r) = rate::take(&mut f, &mut errors) {
                    if handler.is_handle {
                        errors.spanned(&f.sig.ident, "`handle` runs no step of its own: put `#[step(rate_limit = …)]` on a step handler");
                    } else {
                        rates.push(r);
                    }
                }
                has_handle |= handler.is_handle && handler.valid;
                let (inner, wrapper) = wrap(f, handler.is_handle, handler.valid);
                new_items.push(ImplItem::Fn(inner));
                new_items.push(ImplItem::Fn(wrapper));
            }
            None => new_items.push(ImplItem::Fn(f)),
        }
    }
    item.items = new_items;
    let rate_methods = rate::methods(&rates);
    let errs = errors.to_compile_errors();

    let handle = has_handle.then(|| {
        quote! {
            fn handle_failure<'a>(
                err: ::gen_durable::__private::StepError,
                ctx: &'a mut ::gen_durable::__private::Ctx<Self>,
            ) -> ::gen_durable::__private::StepFuture<'a, Self> {
                Self::handle(err, ctx)
            }
        }
    });
    quote! {
        #errs
        #item

        #[automatically_derived]
        impl ::gen_durable::__private::DurableSteps for #self_ty {
            #handle
            #rate_methods
        }
    }
}

/// The user's handler under a hidden name, and the same-named boxing wrapper.
fn wrap(mut inner: ImplItemFn, is_handle: bool, valid: bool) -> (ImplItemFn, ImplItemFn) {
    let name = inner.sig.ident.clone();
    let inner_name = format_ident!("__step_{}", name, span = name.span());
    let (docs, rest): (Vec<_>, Vec<_>) = inner
        .attrs
        .drain(..)
        .partition(|a| a.path().is_ident("doc"));
    inner.attrs = rest;
    inner.attrs.push(syn::parse_quote!(#[doc(hidden)]));
    inner
        .attrs
        .push(syn::parse_quote!(#[allow(dead_code, non_snake_case)]));
    let vis = std::mem::replace(&mut inner.vis, syn::Visibility::Inherited);
    inner.sig.ident = inner_name.clone();

    // Each argument is passed with the span of the user's declared type, so a wrong
    // type is reported on that type; the boxing is spanned on the handler's name, so
    // a future that is not `Send` (or a wrong output type) is reported there.
    let arg_span = |i: usize| match inner.sig.inputs.iter().nth(i) {
        Some(FnArg::Typed(t)) => t.ty.span(),
        Some(other) => other.span(),
        None => name.span(),
    };
    let ctx_arg = quote_spanned!(arg_span(if is_handle { 1 } else { 0 })=> __gd_ctx);
    let err_param = is_handle.then(|| quote!(__gd_err: ::gen_durable::__private::StepError,));
    let err_arg = is_handle.then(|| {
        let err = quote_spanned!(arg_span(0)=> __gd_err);
        quote!(#err,)
    });
    let boxed = quote_spanned!(name.span()=> ::std::boxed::Box::pin(__gd_future));
    let body = if valid {
        quote! {
            let __gd_future = Self::#inner_name(#err_arg #ctx_arg);
            #boxed
        }
    } else {
        quote! {
            let _ = (#err_arg __gd_ctx);
            ::core::unreachable!("this handler has a compile error")
        }
    };
    let wrapper: ImplItemFn = syn::parse_quote! {
        #(#docs)*
        #vis fn #name<'__gd>(
            #err_param
            __gd_ctx: &'__gd mut ::gen_durable::__private::Ctx<Self>,
        ) -> ::gen_durable::__private::StepFuture<'__gd, Self> {
            #body
        }
    };
    (inner, wrapper)
}
