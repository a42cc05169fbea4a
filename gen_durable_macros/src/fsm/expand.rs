//! Writing the `Fsm` impl, the derives and the registration of a `#[durable_fsm]` enum.

use proc_macro2::TokenStream;
use quote::{quote, quote_spanned};
use syn::ItemEnum;

use super::parse::FsmInput;
use super::validate::FsmModel;
use crate::common::Errors;

/// The traits every FSM enum derives (the `Fsm` bound needs `Copy + Debug`; equality
/// and hashing make steps easy to compare in tests and to key maps).
const DERIVES: &[(&str, &str)] = &[
    ("Clone", "::core::clone::Clone"),
    ("Copy", "::core::marker::Copy"),
    ("Debug", "::core::fmt::Debug"),
    ("PartialEq", "::core::cmp::PartialEq"),
    ("Eq", "::core::cmp::Eq"),
    ("Hash", "::core::hash::Hash"),
];

pub(super) fn expand(input: &FsmInput, model: Option<&FsmModel>, errors: &Errors) -> TokenStream {
    let errs = errors.to_compile_errors();
    let mut item = input.item.clone();
    let Some(model) = model else {
        return quote!(#errs #item);
    };
    // A variant with fields is an error (reported); drop the fields so the impl can
    // still be generated and the rest of the crate type-checks.
    for variant in &mut item.variants {
        variant.fields = syn::Fields::Unit;
    }
    add_derives(&mut item);
    let ident = &item.ident;
    let state = match &model.state {
        Some(ty) => quote!(#ty),
        None => quote!(()),
    };
    let (name, version, queue) = (&model.name, model.version, &model.queue);
    let max_reaps = model.max_reaps.map(|n| quote!(const MAX_REAPS: i32 = #n;));
    let run_ahead = model.run_ahead.then(|| {
        quote!(
            const RUN_AHEAD: bool = true;
        )
    });
    let history = model.history.as_ref().map(|level| {
        quote!(
            const HISTORY: ::gen_durable::HistoryLevel = ::gen_durable::HistoryLevel::#level;
        )
    });
    let stored: Vec<&String> = model.steps.iter().map(|s| &s.stored).collect();
    let variants: Vec<_> = model.steps.iter().map(|s| &s.variant).collect();
    let initial = &model.steps[model.initial].variant;
    // Each call is spanned on its variant, so a missing or misspelt handler is reported
    // there, by `missing_handlers`.
    let dispatch = model.steps.iter().map(|s| {
        let (variant, handler) = (&s.variant, &s.handler);
        quote_spanned!(variant.span()=> Self::#variant => Self::#handler(ctx),)
    });
    let missing = missing_handlers(ident, model);
    // The limit each step's handler declares (`#[step(rate_limit = …)]`), by its name.
    let handler_names: Vec<String> = model.steps.iter().map(|s| s.handler.to_string()).collect();
    // Spanned on the enum's name: without a `#[durable_steps]` block the error is there.
    let steps = quote_spanned!(ident.span()=> <Self as ::gen_durable::__private::DurableSteps>);
    let handle = quote!(#steps::handle_failure(err, ctx));

    quote! {
        #errs
        #item

        #[automatically_derived]
        impl ::gen_durable::__private::Fsm for #ident {
            type State = #state;
            const NAME: &'static str = #name;
            const VERSION: i32 = #version;
            const QUEUE: &'static str = #queue;
            #max_reaps
            #run_ahead
            #history
            const STEPS: &'static [&'static str] = &[#(#stored),*];

            fn initial() -> Self {
                Self::#initial
            }

            fn step_name(self) -> &'static str {
                match self {
                    #(Self::#variants => #stored,)*
                }
            }

            #[allow(unreachable_patterns)]
            fn from_step_name(name: &str) -> ::core::option::Option<Self> {
                match name {
                    #(#stored => ::core::option::Option::Some(Self::#variants),)*
                    _ => ::core::option::Option::None,
                }
            }

            fn run_step<'a>(
                self,
                ctx: &'a mut ::gen_durable::__private::Ctx<Self>,
            ) -> ::gen_durable::__private::StepFuture<'a, Self> {
                #missing
                match self {
                    #(#dispatch)*
                }
            }

            fn step_rate_limit(
                self,
                state: &Self::State,
            ) -> ::core::option::Option<::gen_durable::__private::StepRate> {
                match self {
                    #(Self::#variants => #steps::handler_rate_limit(#handler_names, state),)*
                }
            }

            fn rate_limited(self) -> bool {
                match self {
                    #(Self::#variants => #steps::handler_rate_limited(#handler_names),)*
                }
            }

            fn handle<'a>(
                err: ::gen_durable::__private::StepError,
                ctx: &'a mut ::gen_durable::__private::Ctx<Self>,
            ) -> ::gen_durable::__private::StepFuture<'a, Self> {
                #handle
            }
        }

        ::gen_durable::__private::inventory::submit! {
            ::gen_durable::__private::FsmEntry::of::<#ident>()
        }
    }
}

/// What a step whose handler is missing resolves to: a trait's function of the handler's
/// name, which an inherent handler of the `#[durable_steps]` block shadows. It can only be
/// called where the FSM implements the step's `no handler` trait, which nothing does, so
/// calling it is an error whose message names the step, the handler and its signature,
/// spanned on the variant (rather than rustc's "no variant or associated item named `ship`"
/// pointing at a variant that exists, or its suggestion to rename the variant).
fn missing_handlers(ident: &syn::Ident, model: &FsmModel) -> TokenStream {
    let ctx = quote!(::gen_durable::__private::Ctx<#ident>);
    let future = quote!(::gen_durable::__private::StepFuture<'a, #ident>);
    let (checks, fallbacks): (Vec<_>, Vec<_>) = model
        .steps
        .iter()
        .map(|s| {
            let (variant, handler) = (&s.variant, &s.handler);
            let check = quote::format_ident!("__GdNoHandler{}", variant);
            let message = format!("step `{ident}::{variant}` has no handler `{handler}`");
            let label = format!("no `fn {handler}` in the `#[durable_steps] impl {ident}` block");
            let note = format!(
                "a step's handler is named after its variant in snake_case; write it in the \
                 `#[durable_steps] impl {ident}` block:\n    \
                 async fn {handler}(ctx: &mut Ctx<Self>) -> StepResult<Self> {{ … }}"
            );
            let check_trait = quote_spanned! {variant.span()=>
                #[diagnostic::on_unimplemented(message = #message, label = #label, note = #note)]
                trait #check {}
            };
            let fallback = quote! {
                fn #handler<'a>(_: &'a mut #ctx) -> #future
                where
                    Self: #check,
                {
                    ::core::unreachable!()
                }
            };
            (check_trait, fallback)
        })
        .unzip();
    quote! {
        #(#[allow(non_camel_case_types)] #checks)*
        #[allow(dead_code)]
        trait __GdHandlerFallback {
            #(#fallbacks)*
        }
        impl __GdHandlerFallback for #ident {}
    }
}

/// Adds `#[derive(…)]` for the traits in [`DERIVES`] the enum does not derive yet.
fn add_derives(item: &mut ItemEnum) {
    let mut present: Vec<String> = Vec::new();
    for attr in &item.attrs {
        if !attr.path().is_ident("derive") {
            continue;
        }
        let _ = attr.parse_nested_meta(|meta| {
            if let Some(last) = meta.path.segments.last() {
                present.push(last.ident.to_string());
            }
            Ok(())
        });
    }
    let missing: Vec<TokenStream> = DERIVES
        .iter()
        .filter(|(short, _)| !present.iter().any(|p| p == short))
        .map(|(_, path)| path.parse().expect("a valid path"))
        .collect();
    if !missing.is_empty() {
        item.attrs.push(syn::parse_quote!(#[derive(#(#missing),*)]));
    }
}
