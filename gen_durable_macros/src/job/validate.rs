//! Checking a `#[durable_job]` function and its arguments.

use syn::{FnArg, Ident, ReturnType, Type};

use super::parse::JobInput;
use crate::common::{for_each_arg, positive_int, string_value, upper_camel, ArgValue, Errors};

pub(super) struct JobModel {
    /// The generated unit type, `SendWelcome` for `send_welcome`.
    pub(super) type_ident: Ident,
    /// The state: the first argument's type.
    pub(super) state: Option<Type>,
    pub(super) name: String,
    pub(super) version: i32,
    pub(super) queue: String,
    pub(super) max_reaps: Option<i32>,
    pub(super) max_attempts: i32,
    pub(super) max_backoff_secs: u64,
    /// A custom backoff function, `fn(i32) -> Duration`.
    pub(super) backoff: Option<syn::Expr>,
    /// False if the signature is wrong: `run_step` is then a stub.
    pub(super) callable: bool,
}

const KEYS: &[(&str, &str)] = &[
    ("queue", "queue = \"mail\""),
    ("max_attempts", "max_attempts = 20"),
    ("max_backoff_secs", "max_backoff_secs = 300"),
    ("backoff", "backoff = my_backoff"),
    ("name", "name = \"SendWelcome\""),
    ("version", "version = 2"),
    ("max_reaps", "max_reaps = 10"),
];

const USAGE: &str = "`async fn send_welcome(args: WelcomeArgs, ctx: &mut JobCtx) -> JobResult`";

pub(super) fn validate(input: &JobInput, errors: &mut Errors) -> Option<JobModel> {
    let sig = &input.item.sig;
    let type_ident = Ident::new(&upper_camel(&sig.ident.to_string()), sig.ident.span());
    let mut model = JobModel {
        name: type_ident.to_string(),
        type_ident,
        state: None,
        version: 1,
        queue: "default".to_string(),
        max_reaps: None,
        max_attempts: 20,
        max_backoff_secs: 300,
        backoff: None,
        callable: true,
    };
    for_each_arg(
        "durable_job",
        input.args.clone(),
        KEYS,
        errors,
        |key, arg, errors| {
            let value = arg.value.as_ref().expect("checked by for_each_arg");
            let example = KEYS
                .iter()
                .find(|(k, _)| *k == key)
                .map(|(_, e)| *e)
                .unwrap_or_default();
            let int = |errors: &mut Errors| match positive_int(key, value, example) {
                Ok(n) => Some(n),
                Err(e) => {
                    errors.push(e);
                    None
                }
            };
            match key {
                "queue" | "name" => match string_value(key, value, example) {
                    Ok(s) if key == "queue" => model.queue = s.value(),
                    Ok(s) => model.name = s.value(),
                    Err(e) => errors.push(e),
                },
                "version" => model.version = int(errors).unwrap_or(model.version),
                "max_reaps" => model.max_reaps = int(errors).or(model.max_reaps),
                "max_attempts" => model.max_attempts = int(errors).unwrap_or(model.max_attempts),
                "max_backoff_secs" => {
                    model.max_backoff_secs =
                        int(errors).map_or(model.max_backoff_secs, |n| n as u64)
                }
                "backoff" => match value {
                    ArgValue::Expr(e @ syn::Expr::Path(_)) => model.backoff = Some(e.clone()),
                    other => errors.push(syn::Error::new_spanned(
                        other.tokens(),
                        format!(
                            "`backoff` must name a function `fn(attempt: i32) -> Duration`, e.g. `{example}`"
                        ),
                    )),
                },
                _ => unreachable!("for_each_arg only passes known keys"),
            }
        },
    );

    if sig.asyncness.is_none() {
        errors.spanned(
            sig.fn_token,
            format!(
                "`#[durable_job]` needs an `async fn`: write `async fn {}(…)`",
                sig.ident
            ),
        );
        model.callable = false;
    }
    if !sig.generics.params.is_empty() || sig.generics.where_clause.is_some() {
        errors.spanned(
            &sig.generics,
            format!("a job function takes no generic parameters; a job is {USAGE}"),
        );
        model.callable = false;
    }
    match sig.inputs.iter().collect::<Vec<_>>().as_slice() {
        [FnArg::Typed(args), FnArg::Typed(_)] => model.state = Some((*args.ty).clone()),
        [FnArg::Receiver(r), ..] | [_, FnArg::Receiver(r)] => {
            errors.spanned(
                r,
                format!("a job is a free function, not a method; a job is {USAGE}"),
            );
            model.callable = false;
        }
        _ => {
            let at = if sig.inputs.is_empty() {
                quote::ToTokens::to_token_stream(&sig.ident)
            } else {
                quote::ToTokens::to_token_stream(&sig.inputs)
            };
            errors.spanned(
                at,
                format!(
                    "a job function takes 2 arguments, its arguments (the state) and the job context, not {}; a job is {USAGE}",
                    sig.inputs.len()
                ),
            );
            model.callable = false;
        }
    }
    if let ReturnType::Default = sig.output {
        errors.spanned(
            &sig.ident,
            format!("a job function returns `JobResult`; a job is {USAGE}"),
        );
        model.callable = false;
    }
    Some(model)
}
