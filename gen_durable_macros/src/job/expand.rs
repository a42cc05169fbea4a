//! Writing the unit type, its `Fsm` impl and its registration for a `#[durable_job]`.

use proc_macro2::TokenStream;
use quote::{quote, quote_spanned};
use syn::spanned::Spanned;

use super::parse::JobInput;
use super::validate::JobModel;
use crate::common::Errors;

/// The one step of every job.
const STEP: &str = "run";

pub(super) fn expand(input: &JobInput, model: Option<&JobModel>, errors: &Errors) -> TokenStream {
    let errs = errors.to_compile_errors();
    let item = &input.item;
    let Some(model) = model else {
        return quote!(#errs #item);
    };
    let vis = &item.vis;
    let func = &item.sig.ident;
    let ty = &model.type_ident;
    let state = match &model.state {
        Some(t) => quote!(#t),
        None => quote!(()),
    };
    let (name, version, queue) = (&model.name, model.version, &model.queue);
    let max_reaps = model.max_reaps.map(|n| quote!(const MAX_REAPS: i32 = #n;));
    let (max_attempts, max_backoff) = (model.max_attempts, model.max_backoff_secs);
    let backoff = match &model.backoff {
        Some(f) => quote!(::core::option::Option::Some(#f as fn(i32) -> ::core::time::Duration)),
        None => quote!(::core::option::Option::None),
    };
    let doc = format!(
        "The durable job of [`{func}`]: a one-step FSM (step `\"{STEP}\"`) named `\"{name}\"`, \
         retried with capped exponential backoff up to {max_attempts} runs."
    );

    let run = if model.callable {
        // The clone is spanned on the state type ("`WelcomeArgs: Clone` is not
        // satisfied" points there); the call and the boxing on the function's name,
        // so a non-`Send` future or a wrong return type is reported on it.
        let state_span = model.state.as_ref().map_or(func.span(), |t| t.span());
        let clone =
            quote_spanned!(state_span=> <#state as ::core::clone::Clone>::clone(&ctx.state));
        let call = quote_spanned!(func.span()=>
            ::std::boxed::Box::pin(async move {
                let result: ::gen_durable::__private::JobResult = #func(args, job_ctx).await;
                ::core::result::Result::Ok(Self::RETRY_POLICY.outcome::<Self>(attempt, result))
            })
        );
        quote! {
            let attempt = ctx.attempt();
            let args = #clone;
            let (_, job_ctx) = ctx.split();
            #call
        }
    } else {
        quote! {
            let _ = ctx;
            ::core::unreachable!("this job function has a compile error")
        }
    };

    quote! {
        #errs
        #item

        #[doc = #doc]
        #[derive(
            ::core::clone::Clone,
            ::core::marker::Copy,
            ::core::fmt::Debug,
            ::core::default::Default,
            ::core::cmp::PartialEq,
            ::core::cmp::Eq,
            ::core::hash::Hash
        )]
        #vis struct #ty;

        impl #ty {
            /// How this job is retried: runs allowed, the backoff and its cap.
            #vis const RETRY_POLICY: ::gen_durable::__private::RetryPolicy =
                ::gen_durable::__private::RetryPolicy {
                    max_attempts: #max_attempts,
                    max_backoff: ::core::time::Duration::from_secs(#max_backoff),
                    backoff: #backoff,
                };
        }

        #[automatically_derived]
        impl ::gen_durable::__private::Fsm for #ty {
            type State = #state;
            const NAME: &'static str = #name;
            const VERSION: i32 = #version;
            const QUEUE: &'static str = #queue;
            #max_reaps
            const STEPS: &'static [&'static str] = &[#STEP];

            fn initial() -> Self {
                #ty
            }

            fn step_name(self) -> &'static str {
                #STEP
            }

            fn from_step_name(name: &str) -> ::core::option::Option<Self> {
                if name == #STEP {
                    ::core::option::Option::Some(#ty)
                } else {
                    ::core::option::Option::None
                }
            }

            fn run_step<'a>(
                self,
                ctx: &'a mut ::gen_durable::__private::Ctx<Self>,
            ) -> ::gen_durable::__private::StepFuture<'a, Self> {
                #run
            }

            /// A panic (or an uncastable state) is retried like `JobError::Retry`.
            fn handle<'a>(
                err: ::gen_durable::__private::StepError,
                ctx: &'a mut ::gen_durable::__private::Ctx<Self>,
            ) -> ::gen_durable::__private::StepFuture<'a, Self> {
                let attempt = ctx.attempt();
                ::std::boxed::Box::pin(async move {
                    ::core::result::Result::Ok(Self::RETRY_POLICY.on_error::<Self>(attempt, &err))
                })
            }
        }

        ::gen_durable::__private::inventory::submit! {
            ::gen_durable::__private::FsmEntry::of::<#ty>()
        }
    }
}
