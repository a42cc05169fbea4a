//! `#[step(rate_limit = "stripe", key = tenant, weight = 2)]` on a handler of a
//! `#[durable_steps]` block: the rate limit its step pays each time it runs.
//!
//! `key` names a field of the FSM's state (a path of fields: `key = order.tenant`), turned
//! into the key with `ToString`; without it the step takes tokens from the limit's one
//! global key. `weight` is a positive number literal (default 1). The attribute is removed
//! from the handler; the block's `DurableSteps` impl answers for it by handler name.

use proc_macro2::TokenStream;
use quote::{quote, quote_spanned};
use syn::spanned::Spanned;
use syn::{Expr, ExprLit, ImplItemFn, Lit, LitStr};

use crate::common::{for_each_arg, parse_args, string_value, ArgValue, Errors};

const KNOWN: &[(&str, &str)] = &[
    ("rate_limit", "rate_limit = \"stripe\""),
    ("key", "key = tenant"),
    ("weight", "weight = 2"),
];

/// One handler's declared limit.
pub(super) struct StepRate {
    handler: String,
    limit: LitStr,
    key: Option<Expr>,
    weight: Option<TokenStream>,
}

/// Takes the `#[step(…)]` attributes off `f` and returns the limit it declares.
pub(super) fn take(f: &mut ImplItemFn, errors: &mut Errors) -> Option<StepRate> {
    let (ours, rest): (Vec<_>, Vec<_>) = f.attrs.drain(..).partition(|a| a.path().is_ident("step"));
    f.attrs = rest;
    let mut found = None;
    for attr in ours {
        if found.is_some() {
            errors.spanned(&attr, "one `#[step(…)]` per handler");
            continue;
        }
        let args = match attr
            .meta
            .require_list()
            .and_then(|l| parse_args(l.tokens.clone()))
        {
            Ok(args) => args,
            Err(e) => {
                errors.push(e);
                continue;
            }
        };
        let (mut limit, mut key, mut weight) = (None, None, None);
        for_each_arg("step", args, KNOWN, errors, |name, arg, errors| {
            let value = arg
                .value
                .expect("for_each_arg passes only keys with a value");
            match name {
                "rate_limit" => match string_value(name, &value, KNOWN[0].1) {
                    Ok(s) => limit = Some(s),
                    Err(e) => errors.push(e),
                },
                "key" => match field_path(&value) {
                    Some(e) => key = Some(e),
                    None => errors.spanned(
                        value.tokens(),
                        "`key` names a field of the state, e.g. `key = tenant` or `key = order.tenant`",
                    ),
                },
                _ => match number(&value) {
                    Some(w) => weight = Some(w),
                    None => errors.spanned(
                        value.tokens(),
                        "`weight` must be a positive number literal, e.g. `weight = 2` or `weight = 0.5`",
                    ),
                },
            }
        });
        match limit {
            Some(limit) => {
                found = Some(StepRate {
                    handler: f.sig.ident.to_string(),
                    limit,
                    key,
                    weight,
                })
            }
            None => errors.spanned(
                &attr,
                "`#[step(…)]` needs `rate_limit`, e.g. `#[step(rate_limit = \"stripe\")]`",
            ),
        }
    }
    found
}

/// A field of the state, or a path of fields: `tenant`, `order.tenant`.
fn field_path(value: &ArgValue) -> Option<Expr> {
    let ArgValue::Expr(e) = value else {
        return None;
    };
    let mut at = e;
    loop {
        match at {
            Expr::Path(p) if p.qself.is_none() && p.path.get_ident().is_some() => {
                return Some(e.clone())
            }
            Expr::Field(f) => at = &f.base,
            _ => return None,
        }
    }
}

/// A positive integer or float literal, as an `f64` expression.
fn number(value: &ArgValue) -> Option<TokenStream> {
    let ArgValue::Expr(Expr::Lit(ExprLit { lit, .. })) = value else {
        return None;
    };
    let w = match lit {
        Lit::Int(i) => i.base10_parse::<f64>().ok()?,
        Lit::Float(f) => f.base10_parse::<f64>().ok()?,
        _ => return None,
    };
    (w.is_finite() && w > 0.0).then(|| quote!(#w))
}

/// The `DurableSteps` methods that answer for the declared limits (none: the defaults).
pub(super) fn methods(rates: &[StepRate]) -> TokenStream {
    if rates.is_empty() {
        return TokenStream::new();
    }
    let names: Vec<&String> = rates.iter().map(|r| &r.handler).collect();
    let arms = rates.iter().map(|r| {
        let (handler, limit) = (&r.handler, &r.limit);
        let weight = r.weight.clone().unwrap_or_else(|| quote!(1.0));
        let key = match &r.key {
            // Spanned on the user's field: a missing field or a key without `ToString`
            // is reported there.
            Some(field) => quote_spanned!(field.span()=>
                ::gen_durable::__private::LimitKey::new(#limit, ::std::string::ToString::to_string(&__gd_state.#field))),
            None => quote!(::gen_durable::__private::LimitKey::global(#limit)),
        };
        quote! {
            #handler => ::core::option::Option::Some(
                ::gen_durable::__private::StepRate { key: #key, weight: #weight }),
        }
    });
    quote! {
        fn handler_rate_limit(
            handler: &str,
            __gd_state: &<Self as ::gen_durable::__private::Fsm>::State,
        ) -> ::core::option::Option<::gen_durable::__private::StepRate> {
            let _ = __gd_state;
            match handler {
                #(#arms)*
                _ => ::core::option::Option::None,
            }
        }

        fn handler_rate_limited(handler: &str) -> bool {
            matches!(handler, #(#names)|*)
        }
    }
}
