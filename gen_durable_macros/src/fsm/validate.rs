//! Checking a parsed `#[durable_fsm]` and resolving its defaults.

use proc_macro2::Span;
use syn::{Fields, Ident, Meta, Type};

use super::parse::FsmInput;
use crate::common::{
    bool_value, for_each_arg, parse_args, positive_int, snake_case, string_value, ArgValue, Errors,
};

/// What the expansion needs. Invalid parts fall back to defaults (and leave an error),
/// so the impl is still generated and the rest of the crate type-checks.
pub(super) struct FsmModel {
    /// `None` if `state` is missing: the impl uses `()` and the error says what to add.
    pub(super) state: Option<Type>,
    pub(super) name: String,
    pub(super) version: i32,
    pub(super) queue: String,
    pub(super) max_reaps: Option<i32>,
    pub(super) run_ahead: bool,
    /// `history = "full" | "steps" | "off"`: the variant of `HistoryLevel`, if declared.
    pub(super) history: Option<Ident>,
    pub(super) steps: Vec<StepModel>,
    pub(super) initial: usize,
}

pub(super) struct StepModel {
    pub(super) variant: Ident,
    pub(super) stored: String,
    /// The handler method: the variant's name in snake_case.
    pub(super) handler: Ident,
}

const KEYS: &[(&str, &str)] = &[
    ("state", "state = CheckoutState"),
    ("name", "name = \"Checkout\""),
    ("version", "version = 2"),
    ("queue", "queue = \"checkout\""),
    ("max_reaps", "max_reaps = 10"),
    ("run_ahead", "run_ahead = true"),
    ("history", "history = \"full\""),
];

/// The values `history` takes, with the `HistoryLevel` variant each names.
const HISTORY_LEVELS: [(&str, &str); 3] = [("full", "Full"), ("steps", "Steps"), ("off", "Off")];

/// `None` when no impl can be generated at all (generics, a variant with fields, no
/// variants); the reasons are in `errors`.
pub(super) fn validate(input: &FsmInput, errors: &mut Errors) -> Option<FsmModel> {
    let item = &input.item;
    let mut model = FsmModel {
        state: None,
        name: item.ident.to_string(),
        version: 1,
        queue: "default".to_string(),
        max_reaps: None,
        run_ahead: false,
        history: None,
        steps: Vec::new(),
        initial: 0,
    };

    for_each_arg(
        "durable_fsm",
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
            match key {
                "state" => {
                    if let ArgValue::Type(ty) = value {
                        model.state = Some(ty.clone());
                    }
                }
                "name" => match string_value(key, value, example) {
                    Ok(s) => model.name = s.value(),
                    Err(e) => errors.push(e),
                },
                "queue" => match string_value(key, value, example) {
                    Ok(s) => model.queue = s.value(),
                    Err(e) => errors.push(e),
                },
                "version" => match positive_int(key, value, example) {
                    Ok(n) => model.version = n,
                    Err(e) => errors.push(e),
                },
                "max_reaps" => match positive_int(key, value, example) {
                    Ok(n) => model.max_reaps = Some(n),
                    Err(e) => errors.push(e),
                },
                "run_ahead" => match bool_value(key, value, example) {
                    Ok(b) => model.run_ahead = b,
                    Err(e) => errors.push(e),
                },
                "history" => match string_value(key, value, example) {
                    Ok(s) => match HISTORY_LEVELS.iter().find(|(v, _)| *v == s.value()) {
                        Some((_, variant)) => model.history = Some(Ident::new(variant, s.span())),
                        None => errors.spanned(
                            &s,
                            format!(
                                "`history` is \"full\" (every step with its state), \"steps\" (every step, no state) or \"off\", not {:?}",
                                s.value()
                            ),
                        ),
                    },
                    Err(e) => errors.push(e),
                },
                _ => unreachable!("for_each_arg only passes known keys"),
            }
        },
    );
    if model.state.is_none() && input.args_ok && !input.args.iter().any(|a| a.key == "state") {
        errors.at(
            Span::call_site(),
            format!(
                "missing `state`: name the FSM's state type, e.g. `#[durable_fsm(state = {}State)]`",
                item.ident
            ),
        );
    }

    let mut expandable = true;
    if !item.generics.params.is_empty() || item.generics.where_clause.is_some() {
        errors.spanned(
            &item.generics,
            "a durable FSM cannot be generic: the engine resolves it by name and version; declare one enum per FSM",
        );
        expandable = false;
    }
    if input.variants.is_empty() {
        errors.spanned(
            &item.ident,
            format!(
                "`{}` has no steps: add one variant per step, e.g. `enum {} {{ #[initial] Start, Finish }}`",
                item.ident, item.ident
            ),
        );
        expandable = false;
    }

    let mut initial: Option<(usize, &Ident)> = None;
    for (i, variant) in input.variants.iter().enumerate() {
        if !matches!(variant.fields, Fields::Unit) {
            errors.spanned(
                &variant.fields,
                format!(
                    "step variants carry no data: remove the fields and keep the data in the state type (`ctx.state`), e.g. `{},`",
                    variant.ident
                ),
            );
        }
        for attr in &variant.initial {
            if !matches!(attr.meta, Meta::Path(_)) {
                errors.spanned(attr, "`#[initial]` takes no arguments: write `#[initial]`");
            }
            match initial {
                None => initial = Some((i, &variant.ident)),
                Some((_, first)) => errors.spanned(
                    attr,
                    format!(
                        "only one step can be `#[initial]`, and `{first}` already is; remove `#[initial]` from `{}` or from `{first}`",
                        variant.ident
                    ),
                ),
            }
        }
        let mut stored = snake_case(&variant.ident);
        let mut at = variant.ident.span();
        for attr in &variant.step {
            if let Some(name) = step_name(attr, errors) {
                stored = name.value();
                at = name.span();
            }
        }
        if let Some(prev) = model.steps.iter().find(|s| s.stored == stored) {
            errors.at(
                at,
                format!(
                    "step name \"{stored}\" is already used by `{}`; stored step names must be unique: give one of them `#[step(name = \"…\")]`",
                    prev.variant
                ),
            );
        }
        let handler = Ident::new(&snake_case(&variant.ident), variant.ident.span());
        model.steps.push(StepModel {
            variant: variant.ident.clone(),
            stored,
            handler,
        });
    }
    match initial {
        Some((i, _)) => model.initial = i,
        None if !input.variants.is_empty() => {
            let first = &input.variants[0].ident;
            errors.spanned(
                &item.ident,
                format!(
                    "no initial step: mark the step a new instance starts at with `#[initial]`, e.g. `#[initial] {first},`"
                ),
            );
        }
        None => {}
    }
    expandable.then_some(model)
}

/// The `name` of a `#[step(name = "…")]`.
fn step_name(attr: &syn::Attribute, errors: &mut Errors) -> Option<syn::LitStr> {
    const STEP_KEYS: &[(&str, &str)] = &[("name", "#[step(name = \"reserve_stock\")]")];
    let tokens = match &attr.meta {
        Meta::List(list) => list.tokens.clone(),
        _ => {
            errors.spanned(
                attr,
                "`#[step]` needs a name: `#[step(name = \"reserve_stock\")]`",
            );
            return None;
        }
    };
    let args = match parse_args(tokens) {
        Ok(args) => args,
        Err(e) => {
            errors.push(e);
            return None;
        }
    };
    let mut name = None;
    for_each_arg("step", args, STEP_KEYS, errors, |_, arg, errors| {
        let value = arg.value.as_ref().expect("checked by for_each_arg");
        match string_value("name", value, "name = \"reserve_stock\"") {
            Ok(s) => name = Some(s),
            Err(e) => errors.push(e),
        }
    });
    name
}
