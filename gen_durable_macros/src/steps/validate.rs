//! Finding and checking the handlers of a `#[durable_steps]` block.
//!
//! Every `async fn` without a `self` receiver is a handler: `handle` takes
//! `(err: StepError, ctx: &mut Ctx<Self>)`, any other takes `(ctx: &mut Ctx<Self>)`;
//! all return `StepResult<Self>`. The argument and return *types* are checked by
//! the compiler through the generated wrapper (spanned on the user's tokens); here
//! we check the shape: async, arity, no generics, a return type.

use syn::{FnArg, ImplItem, ReturnType, Signature, Type};

use super::parse::StepsInput;
use crate::common::Errors;

/// A handler found in the block, by its index among the impl items.
pub(super) struct Handler {
    pub(super) index: usize,
    pub(super) is_handle: bool,
    /// False if its shape is wrong: its wrapper is then a stub, so the only error
    /// the user sees is the one on the handler.
    pub(super) valid: bool,
}

pub(super) fn validate(input: &StepsInput, errors: &mut Errors) -> Vec<Handler> {
    let item = &input.item;
    if !item.generics.params.is_empty() {
        errors.spanned(
            &item.generics,
            "`#[durable_steps]` cannot be generic: a durable FSM is one concrete enum",
        );
    }
    let mut handlers = Vec::new();
    for (index, impl_item) in item.items.iter().enumerate() {
        let ImplItem::Fn(f) = impl_item else { continue };
        let sig = &f.sig;
        if sig.receiver().is_some() {
            continue;
        }
        let name = sig.ident.to_string();
        let is_handle = name == "handle";
        if sig.asyncness.is_none() {
            if takes_ctx(sig) {
                errors.spanned(
                    sig.fn_token,
                    format!("step handlers are `async fn`: write `async fn {name}(…)`"),
                );
                handlers.push(Handler {
                    index,
                    is_handle,
                    valid: false,
                });
            }
            continue;
        }
        let valid = check(sig, is_handle, errors);
        handlers.push(Handler {
            index,
            is_handle,
            valid,
        });
    }
    handlers
}

fn usage(name: &str, is_handle: bool) -> String {
    if is_handle {
        "`async fn handle(err: StepError, ctx: &mut Ctx<Self>) -> StepResult<Self>`".to_string()
    } else {
        format!("`async fn {name}(ctx: &mut Ctx<Self>) -> StepResult<Self>` (async helpers go in another `impl` block)")
    }
}

/// True if the handler has the right shape; otherwise the errors are pushed.
fn check(sig: &Signature, is_handle: bool, errors: &mut Errors) -> bool {
    let name = sig.ident.to_string();
    let mut ok = true;
    let mut fail = |errors: &mut Errors, tokens: &dyn quote::ToTokens, what: &str| {
        errors.spanned(
            tokens.to_token_stream(),
            format!("{what}; a step handler is {}", usage(&name, is_handle)),
        );
        ok = false;
    };
    if !sig.generics.params.is_empty() || sig.generics.where_clause.is_some() {
        fail(
            errors,
            &sig.generics,
            "a step handler takes no generic parameters",
        );
    }
    if let Some(v) = &sig.variadic {
        fail(errors, v, "a step handler is not variadic");
    }
    if let Some(abi) = &sig.abi {
        fail(errors, abi, "a step handler has no `extern` ABI");
    }
    if let Some(u) = &sig.unsafety {
        fail(errors, u, "a step handler is not `unsafe`");
    }
    let want = if is_handle { 2 } else { 1 };
    if sig.inputs.len() != want {
        let what = if is_handle {
            format!(
                "`handle` takes 2 arguments, the error and the step context, not {}",
                sig.inputs.len()
            )
        } else {
            format!(
                "a step handler takes 1 argument, the step context, not {}",
                sig.inputs.len()
            )
        };
        if sig.inputs.is_empty() {
            fail(errors, &sig.ident, &what);
        } else {
            fail(errors, &sig.inputs, &what);
        }
    }
    if let ReturnType::Default = sig.output {
        fail(
            errors,
            &sig.ident,
            "a step handler returns `StepResult<Self>`",
        );
    }
    ok
}

/// Whether the first argument looks like `&mut Ctx<…>`: a sync fn like that was
/// meant to be a handler.
fn takes_ctx(sig: &Signature) -> bool {
    let Some(FnArg::Typed(arg)) = sig.inputs.first() else {
        return false;
    };
    let Type::Reference(r) = &*arg.ty else {
        return false;
    };
    let Type::Path(p) = &*r.elem else {
        return false;
    };
    p.path.segments.last().is_some_and(|s| s.ident == "Ctx")
}
